#!/usr/bin/env bash
# A system library that attention2d._core links (Open MPI's libmpi, libgloo, OpenMP's libgomp)
# missing where the package runs: `import attention2d` raises an ImportError in words naming the
# library, the Debian package that provides it (dpkg's answer on this machine) and what to do
# (install it, or build without that part: A2D_WITH_MPI=OFF, A2D_WITH_GLOO=OFF), not the loader's
# bare "cannot open shared object file". Each library is hidden in a private mount namespace
# (unshare: as root, or in a user namespace of one's own) by binding /dev/null over it, so the
# loader finds an empty file ("file too short"); the loader's words for a file that is not there
# at all are checked through attention2d._loading itself. Exits 77 (skipped) where no mount
# namespace can be made (a container without the privilege) or the build has no compiled module.
#   missing_library.sh PYTHON        (PYTHONPATH: the package, e.g. build/python)
set -uo pipefail
python=$1
fail() { echo "missing_library.sh: $*" >&2; exit 1; }
module=$("$python" -c 'import attention2d._core as m; print(m.__file__)') ||
  { echo "missing_library.sh: attention2d._core does not import here; skipped"; exit 77; }
if [ "$(id -u)" = 0 ]; then ns=(unshare -m); else ns=(unshare -r -m); fi
if ! "${ns[@]}" sh -c 'mount --bind /dev/null /dev/null' 2>/dev/null; then
  echo "missing_library.sh: no private mount namespace here (${ns[*]}); skipped"
  exit 77
fi

# hidden LIBRARY WORDS...: with LIBRARY (a soname the module loads) hidden, the import fails with
# one ImportError naming it and its package, and containing each of WORDS.
hidden() {
  local library=$1 path package output
  shift
  path=$(ldd "$module" | awk -v lib="$library" '$1 == lib { print $3 }')
  if [ -z "$path" ]; then
    echo "missing_library.sh: $library: not loaded by this build; skipped"
    return
  fi
  package=$(dpkg-query -S "$(readlink -f "$path")" 2>/dev/null | head -1 | cut -d: -f1)
  output=$("${ns[@]}" sh -c 'mount --bind /dev/null "$1" && exec "$2" -c "import attention2d"' \
    _ "$(readlink -f "$path")" "$python" 2>&1)
  local code=$?
  echo "$output" | tail -1
  [ "$code" -ne 0 ] || fail "$library hidden: the import succeeded"
  echo "$output" | grep -q "^ImportError: attention2d's compiled module (attention2d._core) did not load: it needs the shared library $library, " ||
    fail "$library hidden: no ImportError naming it"
  [ "$(echo "$output" | grep -c "Error")" -eq 1 ] || fail "$library hidden: more than one error"
  if [ -n "$package" ]; then
    echo "$output" | grep -qF "from the Debian package $package " ||
      fail "$library hidden: the package $package not named"
    echo "$output" | grep -qF "apt-get install $package)" || fail "$library hidden: no apt-get"
  fi
  local word
  for word in "$@"; do
    echo "$output" | grep -qF -- "$word" || fail "$library hidden: no '$word'"
  done
  echo "missing_library.sh: $library hidden: named, with ${package:-no package}"
}
hidden libmpi.so.40 "built with Open MPI" "--config-settings=cmake.define.A2D_WITH_MPI=OFF ."
hidden libgloo.so.0 "built with Gloo" "--config-settings=cmake.define.A2D_WITH_GLOO=OFF ."
hidden libgomp.so.1 "Every build of attention2d needs it"

# The loader's words for a library not there at all, and an error of another kind left alone.
"$python" - <<'PY' || fail "attention2d._loading"
from attention2d import _loading
error = _loading.explain(ImportError(
    "libgloo.so.0: cannot open shared object file: No such file or directory"))
assert error.library == "libgloo.so.0", error
assert str(error).startswith("attention2d's compiled module (attention2d._core) did not load: "
                             "it needs the shared library libgloo.so.0, which does not load here "
                             "(libgloo.so.0: cannot open shared object file"), error
assert "A2D_WITH_GLOO=OFF" in str(error), error
unknown = _loading.explain(ImportError("libfoo.so.3: cannot open shared object file"))
assert "apt-file search libfoo.so.3" in str(unknown) and "on this machine" in str(unknown), unknown
assert _loading.explain(ImportError("/x/_core.so: undefined symbol: MPI_Init")) is None
print("missing_library.sh: the loader's words for an absent file, and another error left alone")
PY
echo "missing_library.sh: passed"
