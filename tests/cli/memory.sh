#!/usr/bin/env bash
# Too big for memory (docs/reliability.md, "Too big for memory"): a run its hosts cannot hold is
# refused fast, on every rank before any data moves, with one message (exit 2) saying what it
# needs and of what, what the host has and what would fit; the ranks of one host share its memory;
# rank 0's --check arrays count; --no-memory-check and A2D_NO_MEMORY_CHECK=1 run it anyway; every
# subcommand checks (run, kernel, bench, decode); and a std::bad_alloc that happens all the same
# ends the job with one line naming the rank and the phase.
# A2D_FAULT_MEMORY_AVAILABLE (test-only) stands for what the host has.
#   memory.sh A2D_BINARY MPIEXEC
set -uo pipefail
a2d=$1
export MPIEXEC=$2
wrapper="$(cd "$(dirname "$0")/../.." && pwd)/scripts/launch/mpirun.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
mpi=("$wrapper" -np 2 --oversubscribe)

# run NAME command...: output in NAME.log, exit code in $code, milliseconds in $ms.
run() {
  local name=$1 begin
  shift
  begin=$(date +%s%N)
  "$@" >"$name.log" 2>&1
  code=$?
  ms=$((($(date +%s%N) - begin) / 1000000))
  echo "$name: exit $code in $ms ms"
}
has() { grep -qF -- "$2" "$1.log" || { fail "$1: no '$2' in:"; sed 's/^/    /' "$1.log"; }; }
count() { grep -cF -- "$2" "$1.log"; }

# 1. The issue's example: refused in seconds on every rank, one message, exit 2.
run issue "${mpi[@]}" "$a2d" run --seq 100000000 --heads 64 --head-dim 256
[ "$code" -eq 2 ] || fail "issue: exit $code, not 2"
[ "$ms" -le 20000 ] || fail "issue: took $ms ms"
[ "$(count issue "needs more memory than host")" -eq 1 ] || fail "issue: not one message"
has issue "a2d: this run needs more memory than host"
has issue "each rank: shards and the algorithm's buffers (the plan needing the least memory)"
has issue "what would fit (by the same estimate, on hosts like this one):"
has issue "more ranks on more hosts:"
has issue "a shorter sequence: --seq"
has issue "(--no-memory-check or A2D_NO_MEMORY_CHECK=1 runs it anyway)"

# bytes X: the bytes of a size a message prints ("36.1 MiB").
bytes() {
  awk -v n="$1" -v u="$2" 'BEGIN{m["B"]=1;m["KiB"]=2^10;m["MiB"]=2^20;m["GiB"]=2^30;m["TiB"]=2^40;
    printf "%.0f", n * m[u]}'
}
# 2. The ranks of one host share it: what 2 ranks need together, from a refusal with 1 byte.
# (a window of 16 keys: the memory of N = 16384, little computing)
small=(run --algo ring --seq 16384 --heads 4 --head-dim 64 --window 16 --iters 1 --warmup 0
  --timeout 60)
run total env A2D_FAULT_MEMORY_AVAILABLE=1 "${mpi[@]}" "$a2d" "${small[@]}"
[ "$code" -eq 2 ] || fail "total: exit $code"
read -r n u < <(sed -n 's/.*its 2 ranks (0, 1) need \([0-9.]*\) \([A-Za-z]*\),.*/\1 \2/p' total.log)
need=$(bytes "${n:-0}" "${u:-B}")
[ "$need" -gt 0 ] || { fail "total: no need of 2 ranks in:"; cat total.log; }
# Each rank alone fits in 3/4 of their sum; together they do not.
run shared env A2D_FAULT_MEMORY_AVAILABLE=$((need * 3 / 4)) "${mpi[@]}" "$a2d" "${small[@]}"
[ "$code" -eq 2 ] || fail "shared: exit $code, not 2 (3/4 of what 2 ranks need)"
has shared "its 2 ranks (0, 1) need"
run fits env A2D_FAULT_MEMORY_AVAILABLE=$((need * 5 / 4)) "${mpi[@]}" "$a2d" "${small[@]}"
[ "$code" -eq 0 ] || { fail "fits: exit $code (5/4 of what 2 ranks need)"; cat fits.log; }

# 3. Rank 0's --check arrays and the fp64 reference count, on rank 0's host.
run check env A2D_FAULT_MEMORY_AVAILABLE=$((need * 5 / 4)) "${mpi[@]}" "$a2d" "${small[@]}" --check
[ "$code" -eq 2 ] || fail "check: exit $code, not 2"
has check "rank 0 also: the inputs, generated (--check)"
has check "the fp64 reference (--check)"
has check "more ranks: none fit while rank 0 holds"

# 4. The overrides: the option, the variable, and the variable on one rank only (no rank waits).
run option env A2D_FAULT_MEMORY_AVAILABLE=1 "${mpi[@]}" "$a2d" "${small[@]}" --no-memory-check
[ "$code" -eq 0 ] || { fail "--no-memory-check: exit $code"; cat option.log; }
run variable env A2D_FAULT_MEMORY_AVAILABLE=1 A2D_NO_MEMORY_CHECK=1 "${mpi[@]}" "$a2d" "${small[@]}"
[ "$code" -eq 0 ] || { fail "A2D_NO_MEMORY_CHECK=1: exit $code"; cat variable.log; }
run one_rank env A2D_FAULT_MEMORY_AVAILABLE=1 "$MPIEXEC" --oversubscribe -np 1 \
  -x A2D_NO_MEMORY_CHECK=1 "$a2d" "${small[@]}" : -np 1 "$a2d" "${small[@]}"
[ "$code" -eq 0 ] || { fail "A2D_NO_MEMORY_CHECK=1 on rank 0 only: exit $code"; cat one_rank.log; }

# 5. Every subcommand: the kernel's example of issue 45 (57 GiB, on a host of 16 GiB: a host
# with more would otherwise run its two days), bench and decode.
run kernel env A2D_FAULT_MEMORY_AVAILABLE=$((16 << 30)) "$a2d" kernel --seq 3000000 --heads 8 \
  --head-dim 128
[ "$code" -eq 2 ] || fail "kernel: exit $code, not 2"
[ "$ms" -le 10000 ] || fail "kernel: took $ms ms"
has kernel "a2d kernel: this run needs more memory than host"
has kernel "made of: inputs and outputs"
has kernel "a shorter sequence: --seq"
run bench env A2D_FAULT_MEMORY_AVAILABLE=1 "${mpi[@]}" "$a2d" bench --seq 1024 --heads 2
[ "$code" -eq 2 ] || fail "bench: exit $code, not 2"
has bench "each rank: shards of"
has bench "--sequential (one row at a time): does not fit either"
run decode env A2D_FAULT_MEMORY_AVAILABLE=1 "${mpi[@]}" "$a2d" decode --prompt 1024 --heads 2 \
  --check
[ "$code" -eq 2 ] || fail "decode: exit $code, not 2"
has decode "the KV cache at its largest"
has decode "a shorter sequence: none fits"

# 6. A std::bad_alloc all the same (rank 0 limited to 700 MB of address space, the check
# overridden): one line naming the rank and the phase, the job ended, no raw exception.
# (Q, K, V, O of 512 MiB each on each rank: the second shard fails.)
big=(run --algo ring --seq 262144 --heads 8 --head-dim 128 --no-memory-check --timeout 60)
run bad_alloc "$MPIEXEC" --oversubscribe -np 1 bash -c 'ulimit -v 700000; exec "$@"' bash \
  "$a2d" "${big[@]}" : -np 1 "$a2d" "${big[@]}"
[ "$code" -ne 0 ] || fail "bad_alloc: exit 0"
[ "$(count bad_alloc "ran out of memory")" -eq 1 ] || { fail "bad_alloc: not one line"; cat bad_alloc.log; }
has bad_alloc "a2d: rank 0 of 2 ran out of memory (std::bad_alloc) in phase setup; aborting the job"
grep -q "terminate called\|what():" bad_alloc.log && fail "bad_alloc: a raw exception"
run kernel_bad_alloc bash -c 'ulimit -v 700000; exec "$@"' bash "$a2d" kernel --seq 262144 \
  --heads 8 --head-dim 128 --no-memory-check
[ "$code" -eq 3 ] || fail "kernel bad_alloc: exit $code, not 3"
has kernel_bad_alloc "a2d kernel: out of memory (std::bad_alloc) in phase generating the inputs"

[ "$failures" -eq 0 ] || { echo "memory.sh: $failures failures"; exit 1; }
echo "memory.sh: passed"
