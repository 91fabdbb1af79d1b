#!/usr/bin/env bash
# The watchdog counts bytes between the job's hosts as progress (docs/reliability.md, "No hangs"):
# on 2 emulated hosts x 1 rank whose link crawls, one all-gather of K/V takes several times the
# watchdog's --timeout with no phase or tile to mark it:
#   moving: the job finishes, --check passing (before, the watchdog aborted it);
#   silent: the same job with the link taken down during that all-gather is still aborted by the
#           watchdog (exit 124, its report, with the line of the connection that holds data in
#           flight) within the timeout plus a margin.
#   slow_link.sh A2D_BINARY
# Exits 77 where namespaces cannot be made.
set -uo pipefail
a2d=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
cluster="$repo/scripts/cluster/cluster.sh"
fail() { echo "slow_link.sh: $*" >&2; exit 1; }
if ! why=$("$cluster" check); then
  echo "SKIP: cannot emulate a cluster here: ${why#cluster: }"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
name="slw$$"
name=${name:0:10}
trap '"$cluster" down --name "$name" 2>/dev/null' EXIT
trap 'exit 130' INT TERM
# 1 Mbit/s: the all-gather of K and V (2 x 512 tokens x 4 heads x 64 x 4 bytes = 1 MiB into each
# rank) takes about 8 s, against a --timeout of 3 s.
"$cluster" up --name "$name" --hosts 2 --slots 1 --rate 1mbit --no-calibrate --owner $$ >/dev/null ||
  fail "cannot bring up the cluster"
job=(--algo allgather-kv --seq 1024 --heads 4 --kv-heads 4 --head-dim 64 --warmup 0 --iters 1
  --timeout 3)

start=$(date +%s)
out=$(timeout 120 "$cluster" run --name "$name" "$a2d" run "${job[@]}" --check 2>&1)
code=$?
took=$(($(date +%s) - start))
echo "$out"
echo "slow_link.sh: moving: exit $code after ${took} s"
[ "$code" -eq 0 ] || fail "a job whose link crawls but moves was ended (exit $code)"
grep -q "^check: .*PASS" <<<"$out" || fail "no passing check"
[ "$took" -ge 6 ] || fail "the job took ${took} s: the link did not hold it past the timeout, no test"

# The same job, its link down once the all-gather is under way (256 KiB through host 1's link;
# a link down while mpirun starts the job is another matter: docs/reliability.md) for good.
rx() { ip netns exec "$name-h1" cat /sys/class/net/eth0/statistics/rx_bytes; }
before=$(rx)
start=$(date +%s)
timeout 120 "$cluster" run --name "$name" "$a2d" run "${job[@]}" >"/tmp/$name.log" 2>&1 &
runner=$!
while [ $(($(rx) - before)) -lt 262144 ] && kill -0 "$runner" 2>/dev/null; do sleep 0.1; done
down=$(date +%s)
ip -n "$name-h1" link set eth0 down
ip -n "$name-br" link set p1 down
wait "$runner"
code=$?
took=$(($(date +%s) - down))
ip -n "$name-h1" link set eth0 up 2>/dev/null
ip -n "$name-br" link set p1 up 2>/dev/null
out=$(cat "/tmp/$name.log")
rm -f "/tmp/$name.log"
echo "$out"
echo "slow_link.sh: silent: exit $code ${took} s after the link went down"
[ "$code" -ne 0 ] || fail "a job whose link is down finished"
grep -q "a2d watchdog: rank [0-9]* made no progress" <<<"$out" || fail "no watchdog report"
# The report names the connection to the other host that holds data in flight (tcp_stall_lines).
grep -qE "^  TCP to [0-9.]+ \(host $name-h[01]\): [0-9]+ segments? unacknowledged, (retransmission backoff|[0-9]+ zero-window)" <<<"$out" ||
  fail "the report names no connection with data in flight"
# The timeout (3 s) after the link went down, 2 s for answers, the launcher's exit grace (10 s).
[ "$took" -le 35 ] || fail "the silent job ended ${took} s after its link went down"
echo "slow_link.sh: all checks passed"
