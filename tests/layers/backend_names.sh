#!/usr/bin/env bash
# layers.backend_names: outside src/backends/, code chooses by a backend's capabilities
# (Backend::capabilities(), the registry's entries: include/attention2d/backend.hpp), never by its
# name. Fails, listing the lines, on a C++ test of a backend's name in src/, apps/, bench/ or
# python/: name() compared (==, !=, find, rfind, compare, starts_with), or a string compared with
# a backend's name ("cuda", "cuda:N", "fenced", "fenced-cuda", "sim"). "cpu" is left out: machine
# files' `device = cpu` (the cost model) is a kind of machine, not a backend. Messages and
# reports may print names.
#   tests/layers/backend_names.sh [ROOT]   ROOT: the checkout (default: this script's)
#   tests/layers/backend_names.sh --self-test   shows that a planted name test fails
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

scan() {  # scan ROOT: prints the offending lines, exit 1 if any
  local root=$1 hits
  hits=$(cd "$root" && grep -rnE --include='*.cpp' --include='*.hpp' --include='*.cu' \
    --include='*.cuh' --include='*.h' \
    -e 'name\(\) *(==|!=)' -e '(==|!=) *[A-Za-z_.>()-]*name\(\)' \
    -e 'name\(\)\.(find|rfind|compare|starts_with)' \
    -e '(==|!=) *"(cuda|fenced|fenced-cuda|sim)("|:)' \
    -e '"(cuda|fenced|fenced-cuda|sim)" *(==|!=)' \
    src apps bench python 2>/dev/null | grep -v '^src/backends/' || true)
  if [[ -n $hits ]]; then
    echo "backend names tested outside src/backends/ (ask Backend::capabilities() instead):"
    echo "$hits"
    return 1
  fi
}

if [[ ${1:-} == --self-test ]]; then
  tree=$(mktemp -d)
  trap 'rm -rf "$tree"' EXIT
  mkdir -p "$tree/src/comm" "$tree/src/backends" "$tree/apps"
  echo 'bool ok(const Backend& b) { return b.name() == "fenced"; }' > "$tree/src/backends/x.cpp"
  echo 'int f() { return 0; }' > "$tree/apps/clean.cpp"
  scan "$tree" > /dev/null || { echo "self-test: a clean tree failed"; exit 1; }
  echo 'bool nccl(const Backend& b) { return b.name() == "cuda"; }' > "$tree/src/comm/planted.cpp"
  if scan "$tree" > /dev/null; then echo "self-test: a planted name() == passed"; exit 1; fi
  rm "$tree/src/comm/planted.cpp"
  echo 'bool gpu(const std::string& device) { return device != "cuda"; }' > "$tree/apps/p.cpp"
  if scan "$tree" > /dev/null; then echo "self-test: a planted != \"cuda\" passed"; exit 1; fi
  echo "backend_names.sh self-test: passed"
  exit 0
fi

root=${1:-$here/../..}
scan "$root"
echo "backend_names.sh: no backend chosen by name outside src/backends/"
