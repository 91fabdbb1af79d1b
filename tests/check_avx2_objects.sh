#!/usr/bin/env bash
# The AVX2 and AVX-512 object files must define no weak (inline, shared) function: the linker
# keeps one copy of each inline function for the whole program, and a copy compiled with -mavx2
# or -mavx512f would crash the other paths on a CPU without them (see
# src/backends/cpu/kernels/avx2/simd.hpp).
#   check_avx2_objects.sh OBJECT...   (an argument may also be a ;-separated list, as CMake passes)
set -euo pipefail
IFS=';' read -ra objects <<<"$*"
status=0
for object in "${objects[@]}"; do
  weak=$(nm --defined-only -C "$object" | awk '$2 == "W" || $2 == "w" { $1 = ""; print }')
  if [ -n "$weak" ]; then
    echo "$object defines weak functions compiled with AVX2 or AVX-512:" >&2
    echo "$weak" >&2
    status=1
  fi
done
[ "$status" -eq 0 ] && echo "check_avx2_objects: ${#objects[@]} objects, no weak functions"
exit "$status"
