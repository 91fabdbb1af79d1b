#!/usr/bin/env bash
# Tests scripts/gpu/gpu_mpi.sh HERE, as the GPU machine will see it: in a private mount namespace
# (unshare -rm) the system's Open MPI, PMIx and ssh are hidden (/dev/null or an empty folder
# bind-mounted over them, so anything that still reaches them fails loudly), a scratch copy of
# .gpu-deps/debs is unpacked by scripts/gpu/gpu_mpi.sh, and mpirun --version, ompi_info and a 2-rank
# hello built with the unpacked mpicxx must work, and attention2d's CMake must find that MPI.
# Needs scripts/gpu_fetch_mpi.sh first.
#   scripts/gpu/gpu_mpi_selftest.sh [SCRATCH_DIR]   (default: a new mktemp -d)
#   A2D_SELFTEST_NO_DPKG=1 scripts/gpu/gpu_mpi_selftest.sh   the same without dpkg-deb on the PATH
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
compgen -G ".gpu-deps/debs/libopenmpi3_*.deb" >/dev/null ||
  { echo "gpu_mpi_selftest: run scripts/gpu_fetch_mpi.sh first" >&2; exit 1; }
scratch=${1:-$(mktemp -d)}
mkdir -p "$scratch/gpu-deps" "$scratch/empty" "$scratch/bin"
cp -r .gpu-deps/debs "$scratch/gpu-deps/"
# A PATH without MPI or ssh: every tool of /usr/bin and /bin but those.
for tool in /usr/bin/* /bin/*; do
  name=${tool##*/}
  case $name in mpi* | orte* | ompi* | opal* | osh* | shmem* | ssh* | rsh) continue ;; esac
  # A2D_SELFTEST_NO_DPKG=1: no dpkg-deb either (gpu_mpi.sh then unpacks with Python).
  [[ ${A2D_SELFTEST_NO_DPKG:-0} == 1 && $name == dpkg-deb ]] && continue
  [[ -e $scratch/bin/$name ]] || ln -s "$tool" "$scratch/bin/$name"
done
unshare -rm bash -s "$repo" "$scratch" <<'INNER'
set -euo pipefail
repo=$1 scratch=$2
lib=/usr/lib/x86_64-linux-gnu
for dir in $lib/openmpi $lib/pmix2 /usr/share/openmpi /etc/openmpi; do
  [[ -d $dir ]] && mount --bind "$scratch/empty" "$dir"
done
for file in $lib/libmpi* $lib/libopen-pal* $lib/libopen-rte* $lib/libpmix* /usr/bin/orterun \
            /usr/bin/opal_wrapper /usr/bin/orted /usr/bin/ssh; do
  [[ -f $file && ! -L $file ]] && mount --bind /dev/null "$file"
done
export PATH=$scratch/bin
unset LD_LIBRARY_PATH OPAL_PREFIX
cd "$scratch"
if command -v mpirun || command -v mpicxx; then echo "an MPI is still visible" >&2; exit 1; fi
export A2D_GPU_DEPS=$scratch/gpu-deps
# shellcheck source=scripts/gpu/gpu_mpi.sh
source "$repo/scripts/gpu/gpu_mpi.sh"
[[ $gpu_mpi_source == carried* ]] || { echo "gpu_mpi.sh found no MPI" >&2; exit 1; }
ompi_info --path prefix
ompi_info --path libdir
cat >hello.cpp <<'CPP'
#include <mpi.h>
#include <cstdio>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  std::printf("hello from rank %d of %d (sum of ranks %d)\n", rank, size, sum);
  MPI_Finalize();
  return sum == size * (size - 1) / 2 ? 0 : 1;
}
CPP
mpicxx --showme
mpicxx -O1 hello.cpp -o hello
ldd ./hello | grep -E 'mpi|pmix|open-'
timeout 60 mpirun -np 2 --oversubscribe ./hello </dev/null  # (stdin: this script)
# attention2d's CMake finds the carried MPI as gpu_common.sh's build will (configure only).
cmake -S "$repo" -B "$scratch/build" -DA2D_WITH_MPI=ON -DA2D_BUILD_TESTS=OFF \
  -DA2D_BUILD_BENCH=OFF -DA2D_WITH_PYTHON=OFF >"$scratch/configure.log" 2>&1 ||
  { tail -20 "$scratch/configure.log"; exit 1; }
grep -E "Found MPI_CXX|MPI=" "$scratch/configure.log"
grep -q "Found MPI_CXX: $scratch/gpu-deps/root" "$scratch/configure.log" ||
  { echo "CMake did not find the carried MPI" >&2; exit 1; }
echo "gpu_mpi_selftest: PASS"
INNER
