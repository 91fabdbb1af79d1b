#!/usr/bin/env bash
# CTest `cluster.bench_check_4x2`: brings up 4 emulated hosts x 2 ranks (scripts/cluster/cluster.sh,
# network namespaces joined by 200 Mbit/s links), runs every algorithm and every grid of 8 ranks
# with --check (forward and backward against the fp64 reference) across them, tears the cluster
# down, and checks that nothing of it is left. Exits 77 (CTest's skip code) with the reason where
# namespaces cannot be made (not root, no iproute2, no unshare).
#   tests/cluster/bench_check.sh A2D_BINARY
set -euo pipefail
a2d=$1
here=$(cd "$(dirname "$0")" && pwd)
cluster="$here/../../scripts/cluster/cluster.sh"
if ! why=$("$cluster" check); then
  echo "SKIP: cannot emulate a cluster here: ${why#cluster: }"
  exit 77
fi
name="ctest$$"
name=${name:0:10}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
"$cluster" with --name "$name" --hosts 4 --slots 2 --rate 200mbit --no-calibrate -- \
  "$cluster" run --name "$name" "$a2d" bench --seq 203 --heads 8 --kv-heads 8 --head-dim 16 \
  --causal --backward --check --warmup 0 --iters 1 --json --timeout 90 >"$log" 2>&1 || status=$?
cat "$log"
fail() { echo "FAIL: $*"; exit 1; }
[ "$status" -eq 0 ] || fail "the bench across the cluster exited with $status"
# Every algorithm ran and passed: ATTENTION2D and -O on each of the 4 grids of 8, and the three
# baselines.
python3 - "$log" <<'PY' || exit 1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ran = [r for r in rows if "skipped" not in r]
want = {("attention2d", g) for g in ("1x8", "2x4", "4x2", "8x1")} | \
       {("attention2d-overlap", g) for g in ("1x8", "2x4", "4x2", "8x1")}
got = {(r["algo"], r["grid"]) for r in ran if r["algo"].startswith("attention2d")}
assert want <= got, f"missing ATTENTION2D rows: {sorted(want - got)}"
for algo in ("ring", "allgather-kv", "ulysses"):
    assert any(r["algo"] == algo for r in ran), f"no {algo} row ran"
bad = [(r["algo"], r["grid"]) for r in ran if r.get("pass") is not True]
assert not bad, f"rows failing the check: {bad}"
assert any(r.get("bytes_sent_fwd", 0) > 0 for r in ran), "nothing was sent"
print(f"PASS: {len(ran)} rows checked across 4 hosts x 2 ranks")
PY
# Torn down: none of its namespaces, state or Open MPI files remain.
[ -z "$(ip netns list | awk '{print $1}' | grep -E "^$name-" || true)" ] || fail "namespaces of $name remain"
[ ! -e "/run/a2d-cluster/$name" ] || fail "state of $name remains"
! ls /dev/shm/vader_segment."$name"-* /tmp/ompi."$name"-* >/dev/null 2>&1 || fail "Open MPI files of $name remain"
echo "PASS: $name torn down"
