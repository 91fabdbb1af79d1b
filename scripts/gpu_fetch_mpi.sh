#!/usr/bin/env bash
# Run HERE (a Debian 12 development machine with apt), not on the GPU machine: downloads Debian's
# Open MPI (openmpi-bin, libopenmpi-dev, libopenmpi3, openmpi-common) and the runtime libraries
# they need into .gpu-deps/debs/ (git-ignored), to be carried to the GPU machine, whose image has
# no Open MPI (docs/gpu.md, "How the H200 run goes"; scripts/gpu/gpu_mpi.sh unpacks them there).
#
# Which packages: the Depends of openmpi-bin and libopenmpi3, recursively, minus what any
# Ubuntu/Debian image has (glibc, libgcc, libstdc++, zlib, udev, uuid: `base` below). Left out on
# purpose: libhwloc-plugins (optional plugins, pulls in X11 and libxml2), the -dev packages that
# libopenmpi-dev depends on (mpicxx needs only mpi.h and libmpi.so to build a2d), ssh (mpirun on
# one machine starts its ranks itself; scripts/gpu/gpu_mpi.sh points the rsh agent at `false`).
# The script checks that every Depends of every package it downloads is either downloaded or in
# `base`, and stops otherwise. About 7 MB.
#   scripts/gpu_fetch_mpi.sh           downloads what is missing from .gpu-deps/debs
#   scripts/gpu_fetch_mpi.sh --list    prints the package list and exits
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  openmpi-bin libopenmpi-dev libopenmpi3 openmpi-common
  libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
  libucx0 libfabric1 libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200
  libpsm2-2 libpsm-infinipath1 libnuma1 libmunge2 libatomic1
)
# Present on any Debian or Ubuntu base image (the GPU image is Ubuntu-based with glibc >= 2.36).
base=(libc6 libgcc-s1 libstdc++6 zlib1g libudev1 libuuid1 adduser debconf gcc-12-base)
# Depends of libopenmpi-dev that a2d's build does not need (headers of the other libraries,
# JavaScript for Open MPI's HTML pages, Fortran modules), and optional hwloc plugins.
skipped=(libibverbs-dev libhwloc-dev libevent-dev libpmix-dev libjs-jquery libjs-jquery-ui
         zlib1g-dev gfortran-mod-15 libhwloc-plugins ssh-client)
if [[ ${1:-} == --list ]]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

# Every Depends / PreDepends (the first alternative of each) must be downloaded, base or skipped.
known=" ${packages[*]} ${base[*]} ${skipped[*]} "
missing=()
for package in "${packages[@]}"; do
  while read -r dependency; do
    [[ $known == *" $dependency "* ]] || missing+=("$package -> $dependency")
  done < <(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
             --no-replaces --no-enhances "$package" |
           awk '/^ *(Pre)?Depends:/ {gsub(/[<>]/, "", $2); print $2}')
done
if ((${#missing[@]})); then
  echo "gpu_fetch_mpi: dependencies neither fetched nor assumed present:" >&2
  printf '  %s\n' "${missing[@]}" >&2
  exit 1
fi

mkdir -p .gpu-deps/debs
cd .gpu-deps/debs
wanted=()
for package in "${packages[@]}"; do
  compgen -G "${package}_*.deb" >/dev/null || wanted+=("$package")
done
if ((${#wanted[@]})); then
  apt-get download "${wanted[@]}"
fi
debs=(./*.deb)
echo "gpu_fetch_mpi: ${#debs[@]} packages, $(du -sh . | cut -f1) in .gpu-deps/debs"
