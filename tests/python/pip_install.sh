#!/usr/bin/env bash
# pip installs the package from the repository, offline and without build isolation (Debian's
# setuptools, pybind11 and mpi4py), into a fresh directory, reusing the configured build tree;
# the installed copy (not the build tree's) then runs a distributed forward under mpiexec.
#   pip_install.sh SOURCE_DIR BUILD_DIR PYTHON MPIEXEC
set -euo pipefail
source_dir=$1
build=$2
python=$3
mpiexec=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$source_dir" && A2D_BUILD_DIR=$build "$python" -m pip install --no-build-isolation \
   --no-index --no-deps --quiet --target "$work/site" . 2>&1 | grep -v "Running pip as the 'root'" || true)
[ -f "$work/site/attention2d/_api.py" ] || { echo "pip_install.sh: the package was not installed"; exit 1; }
cat >"$work/check.py" <<'PY'
import sys, torch, attention2d
assert attention2d.__file__.startswith(sys.argv[1]), attention2d.__file__
lay = attention2d.layout(seq=10, heads=2, head_dim=8, causal=True)
x = torch.ones(1, len(lay.tokens()), 2, 8)
out = attention2d.attention(x, x, x, causal=True, layout=lay)
assert torch.allclose(out, torch.ones_like(out)), out
print("installed attention2d %s from %s works" % (attention2d.__version__, attention2d.__file__))
PY
PYTHONPATH="$work/site" "$mpiexec" --oversubscribe -np 2 "$python" "$work/check.py" "$work/site"
echo "pip_install.sh: passed"
