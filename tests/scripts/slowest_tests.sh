#!/usr/bin/env bash
# scripts/dev/slowest_tests.sh, the end of scripts/test.sh: on a log far larger than a pipe's
# buffer it lists the slowest tests and exits 0 (a `sort | head` there once ended a green suite
# with exit 141), on a short log it lists what there is, and it refuses bad arguments.
set -euo pipefail
tool="$(cd "$(dirname "$0")/../.." && pwd)/scripts/dev/slowest_tests.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "slowest_tests: FAIL: $*" >&2; exit 1; }

# 3000 passed tests (the slowest, 996.99 s, prints as 997.0), plus lines that must be ignored.
python3 - "$work/big.log" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write("Test project /somewhere\n")
    for i in range(3000):
        t = i % 997 + (i % 100) / 100
        f.write(f"{i + 1:4d}/3000 Test  #{i + 1}: [sanitizers] mpi.a_long_name_{i} ....   Passed  {t:7.2f} sec\n")
    f.write("  12/3000 Test  #12: mpi.failed_one ....***Failed  5000.00 sec\n")
PY
size=$(stat -c %s "$work/big.log")
((size > 2 * 65536)) || fail "the log ($size bytes) should be well over a pipe's 64 KiB"

out=$(set -o pipefail; "$tool" "$work/big.log" 10) || fail "exit $? on a ${size}-byte log"
[ "$(wc -l <<<"$out")" -eq 10 ] || fail "expected 10 lines, got: $out"
head -1 <<<"$out" | grep -Eq '^ +997\.0 s  \[sanitizers\] mpi\.a_long_name_996$' || fail "slowest first: $out"
grep -q failed_one <<<"$out" && fail "a failed test is listed: $out"
sort -s -k1,1 -rn -c <<<"$out" || fail "not slowest first: $out"

printf '%s\n' "1/2 Test #1: unit.a ....   Passed    1.50 sec" "2/2 Test #2: unit.b ....   Passed    2.50 sec" >"$work/small.log"
out=$("$tool" "$work/small.log")
[ "$out" = "$(printf '       2.5 s  unit.b\n       1.5 s  unit.a')" ] || fail "short log: '$out'"

"$tool" "$work/small.log" ten 2>/dev/null && fail "a count that is not a number was accepted"
"$tool" "$work/missing.log" 2>/dev/null && fail "a missing log was accepted"
echo "slowest_tests: passed (${size}-byte log)"
