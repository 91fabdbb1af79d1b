#!/usr/bin/env bash
# `cmake --install` of a build tree into a fresh prefix, then a project outside the repository
# that finds it with find_package(attention2d) and links attention2d::attention2d: configured,
# built (with every installed header compiled alone) and run under mpiexec; and the installed a2d
# program runs.
#   install.sh BUILD_DIR MPIEXEC
set -euo pipefail
build=$1
mpiexec=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
[ -f "$work/prefix/include/attention2d/attention.hpp" ] || { echo "headers not installed"; exit 1; }
[ -f "$work/prefix/include/attention2d/version.hpp" ] || { echo "version.hpp not installed"; exit 1; }
[ -f "$work/prefix/include/attention2d/attention2d.hpp" ] || { echo "the umbrella header is not installed"; exit 1; }
[ -f "$work/prefix/include/attention2d/group_ops.h" ] || { echo "group_ops.h (group_comm.hpp's C table) is not installed"; exit 1; }
[ ! -e "$work/prefix/include/attention2d/tools" ] || { echo "the tools' headers were installed"; exit 1; }
grep -q "attention2d" <<<"$("$work/prefix/bin/a2d" --version)" || { echo "installed a2d does not run"; exit 1; }
cmake -S "$here/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$mpiexec" --oversubscribe -np 3 "$work/consumer/consumer"
"$mpiexec" --oversubscribe -np 3 "$work/consumer/door"
# docs/usage.md's C++ door example is door.cpp's marked lines, as they are.
docs=$(cd "$here/../.." && pwd)/docs/usage.md
marked() { awk '/usage.md begin/{on=1; next} /usage.md end/{on=0} on' "$1"; }
example() { awk '/^```cpp door/{on=1; next} on && /^```/{on=0} on' "$1"; }
diff <(marked "$here/consumer/door.cpp") <(example "$docs") >"$work/example.diff" ||
  { echo "docs/usage.md's C++ door example differs from tests/package/consumer/door.cpp:"; cat "$work/example.diff"; exit 1; }
echo "install.sh: passed"
