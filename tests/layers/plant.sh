#!/bin/sh
# CTest layers.plant: check_layers.py fails on climbing includes, naming each file, line and the two
# layers. Three planted includes climb (a ground-floor source to the communicator interface, a
# ground-floor header to the backend, a layout source to the table by its src/ path); an include
# that goes down (a backend to the problem) is planted too and must not be reported.
cd "$(dirname "$0")/../.." || exit 1
out=$(python3 tests/layers/check_layers.py \
  --plant src/core/dtype.cpp:attention2d/comm.hpp \
  --plant include/attention2d/problem.hpp:attention2d/backend.hpp \
  --plant src/layout/layout.cpp:table/table.hpp \
  --plant src/backends/host/host_backend.cpp:attention2d/problem.hpp 2>&1)
status=$?
printf '%s\n' "$out"
fail() { echo "layers.plant FAILED: $*"; exit 1; }
[ "$status" -eq 1 ] || fail "exit status $status, want 1"
line() { echo $(($(wc -l < "$1") + 1)); }
for want in \
  "src/core/dtype.cpp:$(line src/core/dtype.cpp): includes attention2d/comm.hpp (layer comm) from layer values" \
  "include/attention2d/problem.hpp:$(line include/attention2d/problem.hpp): includes attention2d/backend.hpp (layer backend) from layer values" \
  "src/layout/layout.cpp:$(line src/layout/layout.cpp): includes table/table.hpp (layer model) from layer values"; do
  printf '%s\n' "$out" | grep -qxF "$want" || fail "no line: $want"
done
count=$(printf '%s\n' "$out" | grep -c ': includes ')
[ "$count" -eq 3 ] || fail "$count climbing includes reported, want the 3 planted"
echo "layers.plant: the 3 planted climbing includes fail the check, the planted downward one does not"
