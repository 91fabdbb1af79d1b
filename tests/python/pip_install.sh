#!/usr/bin/env bash
# Installs as a torch user does, where nothing but torch is installed: a fresh virtual environment
# with only torch (the version of the project's venv, from PyPI), then `python -m pip install .`
# with build isolation (scikit-build-core, pybind11 from PyPI) and the build told to use no MPI
# and no Gloo (as on a machine without Open MPI or libgloo-dev); then `pip wheel .` and that wheel
# installed into a second fresh venv with only torch. Each installed copy (not the build tree's)
# runs a distributed forward and backward on 2 ranks of a torch gloo group (scripts/launch/launch.py),
# over the group transport; its modules must not link MPI or Gloo (nor list them among the system
# libraries they load), and the metadata must offer the [mpi] extra. The first install runs as at
# a user's terminal (script(1) gives it one, where util-linux's script is installed) and without
# -q: the build backend (python/build_backend/a2d_build_backend.py) must say there what it
# compiles and for about how long, follow the build's steps and say when it is built.
#   pip_install.sh SOURCE_DIR WORK_DIR [TORCH_SPEC]
set -euo pipefail
source_dir=$(cd "$1" && pwd)
work=$2
torch_spec=${3:-$(grep -E '^torch==' "$source_dir/python/requirements-dev.txt")}
base=${A2D_BASE_PYTHON:-/usr/bin/python3}
start=$(date +%s)
stamp() { echo "pip_install.sh: $1 at $(( $(date +%s) - start )) s"; }
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH
quiet=(--disable-pip-version-check --progress-bar off -q)
# The packages come from the project's wheelhouse (scripts/venv.sh fills it from PyPI), as from a
# local mirror: the same wheels, without downloading 3 GB per venv (PIP_* reach the isolated
# build's own pip too).
export PIP_NO_INDEX=1 PIP_FIND_LINKS=${A2D_PYTHON_CACHE:-$HOME/.cache/attention2d}/wheels
fresh_venv() {  # a venv with only torch, pip-installed once per machine and linked (venv.sh)
  A2D_BASE_PYTHON=$base "$source_dir/scripts/venv.sh" "$1" "$torch_spec" > /dev/null
}
check() {  # the installed copy runs on 2 ranks, without MPI or Gloo in its modules
  local python=$1 site
  site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
  for module in "$site"/attention2d/_core*.so "$site"/attention2d/_c10d*.so; do
    [ -f "$module" ] || { echo "pip_install.sh: $module missing"; exit 1; }
    if ldd "$module" | grep -Eq 'libmpi|libgloo'; then
      ldd "$module"; echo "pip_install.sh: $module links MPI or Gloo"; exit 1
    fi
  done
  grep -q "Provides-Extra: mpi" "$site"/attention2d-*.dist-info/METADATA ||
    { echo "pip_install.sh: no [mpi] extra in the metadata"; exit 1; }
  (cd "$work" && "$python" -c 'from attention2d import _system_libraries as s
assert "libgomp.so.1" in s.LIBRARIES and not any(part for part, _ in s.LIBRARIES.values()), s.LIBRARIES') ||
    { echo "pip_install.sh: _system_libraries.py missing or naming MPI or Gloo"; exit 1; }
  cat > "$work/check.py" <<'PY'
import sys, torch, torch.distributed as dist, attention2d
dist.init_process_group("gloo")
assert attention2d.__file__.startswith(sys.argv[1]), attention2d.__file__
assert not attention2d._core.mpi_built() and not attention2d._core.gloo_built()
torch.manual_seed(0)
q, k, v = (torch.randn(1, 9, 2, 8, dtype=torch.float64) for _ in range(3))
shards = [attention2d.shard(x.float(), "zigzag").requires_grad_() for x in (q, k, v)]
out = attention2d.attention(*shards, causal=True, layout="zigzag")
out.sum().backward()
full = attention2d.unshard(out, "zigzag").double()
ref = torch.nn.functional.scaled_dot_product_attention(
    *(x.transpose(1, 2) for x in (q, k, v)), is_causal=True).transpose(1, 2)
error = float((full - ref).norm() / ref.norm())
assert error < 1e-5, error
print("rank %d: installed attention2d %s (torch %s) from %s: error %.2g"
      % (dist.get_rank(), attention2d.__version__, torch.__version__, attention2d.__file__, error))
dist.destroy_process_group()
PY
  "$python" "$source_dir/scripts/launch/launch.py" --nproc 2 --timeout 120 -- \
    "$python" "$work/check.py" "$site"
}
# (--config-settings: the venv's pip is Debian's 23.0, which has no -C yet.)
no_mpi_no_gloo=(--config-settings=cmake.define.A2D_WITH_MPI=OFF
                --config-settings=cmake.define.A2D_WITH_GLOO=OFF
                --config-settings=build-dir="$work/build")
# The two builds (install, wheel) compile the same sources with the same flags: through ccache
# (scripts/setup.sh installs it; its cache on this machine, paths relative to the source) the
# second, and later runs of this test, reuse the objects. Each isolated build configures afresh
# and its ninja rebuilds every object (measured: 67 of 70 steps again), ccache or not.
if command -v ccache > /dev/null; then
  export CCACHE_DIR=${A2D_PYTHON_CACHE:-$HOME/.cache/attention2d}/ccache CCACHE_BASEDIR=$source_dir
  export CCACHE_NOHASHDIR=1
  no_mpi_no_gloo+=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
fresh_venv "$work/a"
stamp "venv a (torch only)"
if command -v script > /dev/null; then
  install=$(printf '%q ' "$work/a/bin/python" -m pip install --disable-pip-version-check \
    --progress-bar off "${no_mpi_no_gloo[@]}" .)
  (cd "$source_dir" && script -qec "$install" "$work/terminal.log" > /dev/null) ||
    { cat "$work/terminal.log"; exit 1; }
  # What the terminal showed, its rewritten line's states one per line.
  tr '\r' '\n' < "$work/terminal.log" | sed 's/\x1b\[[0-9;?]*[a-zA-Z]//g' > "$work/terminal.txt"
  for expected in "attention2d: compiling the C++ engine (attention2d._core" "CPU-minutes, so about" \
                  "] src/core/mask.cpp (" "] src/module.cpp (" "attention2d: built in"; do
    grep -qF "$expected" "$work/terminal.txt" ||
      { cat "$work/terminal.txt"; echo "pip_install.sh: the terminal did not show '$expected'"; exit 1; }
  done
  # The terminal's lines but the build's steps (one in ten of those), for the log.
  sed -n '/Building wheel for attention2d/,/attention2d: built in/p' "$work/terminal.txt" |
    awk '!/^ *\[[0-9]+\/[0-9]+\]/ || ++steps % 10 == 0' | grep -v '^ *$' | tr -d '\b'
else
  (cd "$source_dir" && "$work/a/bin/python" -m pip install "${quiet[@]}" "${no_mpi_no_gloo[@]}" .)
fi
stamp "pip install . (isolated build)"
check "$work/a/bin/python"
(cd "$source_dir" && "$work/a/bin/python" -m pip wheel "${quiet[@]}" "${no_mpi_no_gloo[@]}" \
   --no-deps -w "$work/dist" .)
stamp "pip wheel ."
fresh_venv "$work/b"
"$work/b/bin/python" -m pip install "${quiet[@]}" "$work"/dist/attention2d-*.whl
stamp "venv b (torch only) and the wheel"
check "$work/b/bin/python"
stamp "passed"
