#!/usr/bin/env bash
# Reads the output of a CUDA build compiled with -Xptxas -v (A2D_CUDA_PTXAS_VERBOSE=ON) and prints,
# for every attention kernel (forward_kernel, backward_kernel) and architecture, its registers and
# spill bytes; exits 1 if any of them spills (spill stores or loads above 0 bytes).
#   scripts/gpu/check_cuda_spills.sh BUILD_LOG
set -euo pipefail
log=${1:?usage: check_cuda_spills.sh BUILD_LOG}
awk '
  /Compiling entry function/ {
    name = $0; sub(/.*function .?/, "", name); sub(/. for .*/, "", name)
    arch = $0; sub(/.* for .?/, "", arch); sub(/.?$/, "", arch)
    kernel = (name ~ /forward_kernel|backward_kernel/) ? 1 : 0
    next
  }
  kernel && /spill stores/ {
    stores = $0; sub(/.*frame, /, "", stores); sub(/ bytes spill stores.*/, "", stores)
    loads = $0; sub(/.*stores, /, "", loads); sub(/ bytes spill loads.*/, "", loads)
    spill[name " " arch] = stores + loads
    next
  }
  kernel && /Used [0-9]+ registers/ {
    regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
    registers[name " " arch] = regs
    kernel = 0
  }
  END {
    bad = 0; count = 0
    for (k in spill) {
      count++
      printf "%-90s registers %3s spill %s bytes\n", k, registers[k], spill[k]
      if (spill[k] > 0) bad++
    }
    if (count == 0) { print "check_cuda_spills: no attention kernels in the log (built with -Xptxas -v?)"; exit 1 }
    if (bad > 0) { printf "check_cuda_spills: %d attention kernels spill registers\n", bad; exit 1 }
    printf "check_cuda_spills: %d attention kernels, none spills\n", count
  }' "$log"
