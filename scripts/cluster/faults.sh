#!/usr/bin/env bash
# Faults across an emulated cluster (scripts/cluster/cluster.sh): during a long `a2d run` (forward and
# backward, --check, --out over the outputs of a clean run, --force), at a moment drawn from a
# fixed seed, one fault; then the checks of docs/reliability.md ("Faults across hosts"):
#
#   link_flap   a host's link down (ip link set down, both ends) for --flap seconds, then up:
#               the job finishes and --check passes
#   link_down   a host's link down for --timeout + 15 s, then up: the job is aborted
#   slow        a host's link rate cut to 1/100 for --slow seconds: it finishes (and passes) or
#               is aborted by the watchdog, never hangs
#   stop_ranks  the ranks of one host stopped (SIGSTOP), resumed --timeout + 5 s later: aborted
#   kill_rank   one rank killed (SIGKILL): the job ends
#   disk_full   the output folder is a small tmpfs, filled up: the write fails, cleanly
#   freeze_host every process of one host stopped, its Open MPI daemon too: aborted (by the
#               watchdog, then cluster.sh run's exit grace: mpirun itself would wait forever)
#
# For every run: an aborted job ends within --timeout + --margin seconds of the fault, exit code
# non-zero, with a message naming the phase and the ranks or host behind; every output file is
# either the earlier one, untouched, or a complete new one equal to it (no temporaries, nothing
# partial); nothing is left running in any namespace of the cluster. One table row per run
# (fault, algorithm, time to exit, exit code, message, files left) on stdout and in --table.
#
#   scripts/cluster/faults.sh [--a2d build/a2d] [--hosts 3] [--slots 2] [--rate 200mbit] [--seq 768]
#                     [--heads 6] [--head-dim 32] [--timeout 20] [--margin 20] [--seconds 25]
#                     [--flap 4] [--slow 10] [--seed 1] [--faults "link_flap ... freeze_host"]
#                     [--algos "attention2d ... ulysses"] [--all-pairs] [--repeat K]
#                     [--rto-max-ms MS] [--at SECONDS] [--table FILE]
#
# For a link taken down, "stall" is the time from the link going down until the host's traffic
# is back (its eth0 counters grow by 64 kB after the link is up again, polled every 0.1 s): TCP's
# retransmission backoff makes it longer than the outage.
# --rto-max-ms MS: sets net.ipv4.tcp_rto_max_ms (Linux 6.15 and later; 120000 by default) in the
# cluster's namespaces, to measure what capping the backoff buys. Off by default: the emulated
# hosts keep the kernel's defaults, as real ones have them.
# --at SECONDS: every fault at that moment after the launch instead of one drawn from the seed
# (0.2 to 1.5 s strike while the job starts: inside mpirun's launch, MPI_Init or the first
# collectives, before the watchdog runs; docs/reliability.md, "The start of a job").
# Faults cycle through the algorithms (fault i with algorithm i mod A); --all-pairs runs every
# fault with every algorithm; --repeat K runs the whole list K times (each run its own moment
# and host from the seed). Exits 0 when every row passed, 1 otherwise, 77 where namespaces
# cannot be made. Needs root (network namespaces); leaves nothing behind (a trap tears down).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cluster="$repo/scripts/cluster/cluster.sh"
a2d="$repo/build/a2d"
hosts=3 slots=2 rate=200mbit seq=768 heads=6 head_dim=32 timeout=20 margin=20 seconds=25
flap=4 slow=10 seed=1 all_pairs=0 repeat=1 table="" rto_max_ms="" fixed_at=""
faults="link_flap link_down slow stop_ranks kill_rank disk_full freeze_host"
algos="attention2d attention2d-overlap ring allgather-kv ulysses"
while [ $# -gt 0 ]; do
  case "$1" in
    --a2d) a2d=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --heads) heads=$2; shift 2 ;;
    --head-dim) head_dim=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --margin) margin=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --flap) flap=$2; shift 2 ;;
    --slow) slow=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --faults) faults=$2; shift 2 ;;
    --algos) algos=$2; shift 2 ;;
    --all-pairs) all_pairs=1; shift ;;
    --repeat) repeat=$2; shift 2 ;;
    --rto-max-ms) rto_max_ms=$2; shift 2 ;;
    --at) fixed_at=$2; shift 2 ;;
    --table) table=$2; shift 2 ;;
    -h | --help) sed -n '2,41p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "faults: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ "$hosts" -ge 2 ] || { echo "faults: --hosts 2 or more (host 0 runs mpirun)" >&2; exit 2; }
if ! why=$("$cluster" check); then
  echo "SKIP: cannot emulate a cluster here: ${why#cluster: }"
  exit 77
fi
[ -x "$a2d" ] || { echo "faults: no $a2d (build first, or --a2d PATH)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
RANDOM=$seed

name="flt$$"
name=${name:0:10}
work=$(mktemp -d /tmp/a2d-faults.XXXXXX)
mounts=()
cleanup() {
  local m
  for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || true; done
  "$cluster" down --name "$name" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$cluster" up --name "$name" --hosts "$hosts" --slots "$slots" --rate "$rate" --no-calibrate \
  --owner $$ >/dev/null
ranks=$((hosts * slots))
if [ -n "$rto_max_ms" ]; then
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$name-"); do
    ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_rto_max_ms="$rto_max_ms"
  done
fi
problem=(--seq "$seq" --heads "$heads" --kv-heads "$heads" --head-dim "$head_dim" --causal
  --backward --warmup 0)

# The reference outputs and the time of one iteration, from a clean run.
"$cluster" run --name "$name" "$a2d" run "${problem[@]}" --iters 3 --check --out "$work/reference" \
  >"$work/reference.log" 2>&1 || { cat "$work/reference.log"; echo "faults: the clean run failed"; exit 1; }
iteration_ms=$(awk '/^forward|^backward/{sum += $2} END{printf "%.0f", sum}' "$work/reference.log")
iters=$(( seconds * 1000 / (iteration_ms > 0 ? iteration_ms : 1) ))
[ "$iters" -ge 5 ] || iters=5
echo "faults: $hosts hosts x $slots ranks, $rate; N = $seq; one iteration ${iteration_ms} ms clean," \
  "--iters $iters (about $seconds s); watchdog --timeout $timeout, margin $margin s, seed $seed" \
  "${rto_max_ms:+, tcp_rto_max_ms $rto_max_ms}" >&2

ns_pids() {  # every process in the cluster's namespaces
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$name-"); do ip netns pids "$ns"; done
}
rank_pids_of_host() {  # the a2d processes in host h's namespace
  local pid
  for pid in $(ip netns pids "$name-h$1"); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = a2d ] && echo "$pid"
  done
  return 0
}
link() {  # link up|down HOST: both ends of the host's veth
  ip -n "$name-h$2" link set eth0 "$1"
  ip -n "$name-br" link set "p$2" "$1"
}
set_rate() {  # set_rate HOST RATE: both ends
  tc -n "$name-h$1" qdisc change dev eth0 root tbf rate "$2" burst 256kb latency 20ms
  tc -n "$name-br" qdisc change dev "p$1" root tbf rate "$2" burst 256kb latency 20ms
}
rate_divided() {  # 200mbit / 100 -> 2000kbit
  local r=${rate,,} bits
  case "$r" in
    *gbit) bits=$(( ${r%gbit} * 1000000000 )) ;;
    *mbit) bits=$(( ${r%mbit} * 1000000 )) ;;
    *kbit) bits=$(( ${r%kbit} * 1000 )) ;;
  esac
  echo "$(( bits / 100 / 1000 ))kbit"
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", b - a}'; }
host_namespaces() { ip netns list | awk '{print $1}' | grep -E "^$name-h[0-9]+$" || true; }
# TCP state of every connection between the cluster's hosts (`ss -tinm` in each host's namespace),
# sampled every 0.5 s from the fault on into FILE: for a failed row, the connections that still
# had data in flight at the last samples (unacknowledged segments, backoff, a closed window), the
# receiving end of each (its queue, window and socket memory, `skmem` with its drops `d`), and
# any connection with unread data or dropped segments.
sample_tcp() {
  local file=$1 start=$2 ns
  while :; do
    echo "@ $(elapsed "$start" "$(now)") s" >>"$file"
    for ns in $(host_namespaces); do
      ip netns exec "$ns" ss -tinmoH state established 2>/dev/null | paste - - |
        grep -v "127.0.0.1" | sed "s/^/$ns /" >>"$file" || true
    done
    sleep 0.5
  done
}
tcp_in_flight() {
  # The last 4 samples' connections with something in flight, unread data or drops, and the other
  # end of each ("NS RECV-Q SEND-Q LOCAL PEER ...").
  awk '/^@ /{n++} {line[NR]=$0; at[NR]=n}
    END {
      for (i = 1; i <= NR; i++)
        if (at[i] > n - 4 && line[i] !~ /^@ / && (line[i] ~ /unacked|backoff|persist|lost:|,d[1-9]/ || line[i] ~ /^[^ ]+ [1-9]/)) {
          split(line[i], f, " "); wanted[f[4] " " f[5]] = 1; wanted[f[5] " " f[4]] = 1
        }
      for (i = 1; i <= NR; i++) {
        if (at[i] <= n - 4) continue
        split(line[i], f, " ")
        if (line[i] ~ /^@ / || (f[4] " " f[5]) in wanted) print line[i]
      }
    }' "$1"
}
# Each host's counters of segments its TCP dropped or pruned on receipt (nonzero ones): a full
# receive buffer drops data that then has to be sent again.
tcp_drop_counters() {
  local ns
  for ns in $(host_namespaces); do
    echo "$ns: $(ip netns exec "$ns" nstat -asz 2>/dev/null |
      awk '$1 ~ /Prune|RcvQDrop|OFODrop|ZeroWindow|Backlog|TCPTimeouts|LostRetransmit|SpuriousRTOs/ && $2 > 0 {printf "%s %s  ", $1, $2}')"
  done
}

# Checks the output folder against the reference: prints "untouched N, new N" or fails.
check_files() {
  python3 - "$1" "$work/reference" "$work/before" <<'PY'
import os, struct, sys
out, ref, before = sys.argv[1:4]
names = sorted(os.listdir(ref))
def load(path):
    data = open(path, "rb").read()
    assert data[:6] == b"\x93NUMPY", f"{path}: not an .npy file"
    length = struct.unpack("<H", data[8:10])[0]
    header = eval(data[10:10 + length].decode())
    count = 1
    for n in header["shape"]:
        count *= n
    body = data[10 + length:]
    assert len(body) == 4 * count, f"{path}: {len(body)} bytes of data, {4 * count} expected (partial)"
    return header["shape"], struct.unpack(f"<{count}f", body)
extra = sorted(set(os.listdir(out)) - set(names) - {"filler"})
assert not extra, f"files that should not be there: {extra}"
untouched = new = 0
for name in names:
    path = os.path.join(out, name)
    assert os.path.exists(path), f"{name} is gone"
    if open(path, "rb").read() == open(os.path.join(before, name), "rb").read() and \
       os.stat(path).st_ino == int(open(os.path.join(before, name + ".inode")).read()):
        untouched += 1
        continue
    shape, values = load(path)
    ref_shape, ref_values = load(os.path.join(ref, name))
    assert shape == ref_shape, f"{name}: shape {shape}, not {ref_shape}"
    scale = max(1e-30, max(abs(v) for v in ref_values))
    worst = max(abs(a - b) for a, b in zip(values, ref_values)) / scale
    assert worst <= 1e-4, f"{name}: differs from the clean run by {worst:.2e} (relative to its max)"
    new += 1
print(f"untouched {untouched}, new {new}")
PY
}

traffic_bytes() {  # bytes through host h's eth0, both directions
  ip netns exec "$name-h$1" cat /sys/class/net/eth0/statistics/rx_bytes \
    /sys/class/net/eth0/statistics/tx_bytes 2>/dev/null | awk '{sum += $1} END{printf "%.0f\n", sum}'
}

rows=()
failures=0
header="| fault | algorithm | where | fault at (s) | time to exit (s) | stall (s) | exit code | message | files left | verdict |"
run_one() {
  local fault=$1 algo=$2
  local host=$(( 1 + RANDOM % (hosts - 1) )) rank=$(( RANDOM % ranks ))
  local at
  at=$(awk -v r=$RANDOM -v s="$seconds" 'BEGIN{printf "%.1f", 2 + (s / 2 - 2) * r / 32767}')
  [ -z "$fixed_at" ] || at=$fixed_at
  local out="$work/out" log="$work/$fault.$algo.log" where="host h$host"
  rm -rf "$out" "$work/before"
  mkdir -p "$out" "$work/before"
  if [ "$fault" = disk_full ]; then
    local size
    size=$(du -sk "$work/reference" | awk '{print $1 * 2 + 64}')
    mount -t tmpfs -o size="${size}k" a2dfaults "$out"
    mounts+=("$out")
  fi
  cp "$work/reference"/* "$out/"
  cp "$work/reference"/* "$work/before/"
  local f
  for f in "$out"/*; do stat -c %i "$f" >"$work/before/$(basename "$f").inode"; done
  local algo_args=(--algo "$algo") stall="-"
  # The job, bounded from outside too (a hang beyond this is a failed row, not a stuck script).
  local start
  start=$(now)
  # The launcher's own bound on starting every rank (a host frozen before any rank of the job
  # exists leaves no rank to report it: cluster.sh run names the ranks that did not start) is
  # the watchdog's, plus the margin's half.
  timeout -s KILL $((timeout * 3 + 90)) "$cluster" run --name "$name" \
    --start-timeout $((timeout + margin / 2)) "$a2d" run "${problem[@]}" \
    "${algo_args[@]}" --iters "$iters" --timeout "$timeout" --check --out "$out" --force \
    >"$log" 2>&1 &
  local job=$!
  sleep "$at"
  local fault_time
  fault_time=$(now)
  local restore_at="" undo="" sampler=""
  if [[ "$fault" == link_* ]]; then
    : >"$work/tcp.log"
    sample_tcp "$work/tcp.log" "$fault_time" &
    sampler=$!
  fi
  case "$fault" in
    link_flap) link down "$host"; restore_at=$flap; undo="link up $host" ;;
    link_down) link down "$host"; restore_at=$((timeout + 15)); undo="link up $host" ;;
    slow) set_rate "$host" "$(rate_divided)"; restore_at=$slow; undo="set_rate $host $rate" ;;
    stop_ranks)
      # The host's ranks, once the launch has started them (on a loaded machine later than the
      # fault's moment; up to 60 s, as for kill_rank): a SIGSTOP to none would be no fault.
      local stopped="" tries
      for tries in $(seq 600); do
        stopped=$(rank_pids_of_host "$host" | tr '\n' ' ')
        [ "$(wc -w <<<"$stopped")" -lt "$slots" ] || break
        kill -0 "$job" 2>/dev/null || break
        sleep 0.1
      done
      # shellcheck disable=SC2086
      [ -z "$stopped" ] || kill -STOP $stopped 2>/dev/null || true
      restore_at=$((timeout + 5))
      undo="kill -CONT $stopped"
      ;;
    kill_rank)
      where="rank $rank"
      # The rank's PID file appears once the launch has started it: on a loaded machine that
      # can be later than the fault's moment, so wait for it (up to 60 s, the launch's bound).
      local file pid="" tries
      for tries in $(seq 600); do
        for file in /run/a2d-cluster/"$name"/job.*/"$rank"; do [ -e "$file" ] && pid=$(cat "$file"); done
        [ -z "$pid" ] || break
        kill -0 "$job" 2>/dev/null || break
        sleep 0.1
      done
      [ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true
      ;;
    disk_full) where="rank 0's disk"; dd if=/dev/zero of="$out/filler" bs=64k 2>/dev/null || true ;;
    freeze_host)
      # Resumed only after the job has ended (by then cluster.sh run has killed them). Struck
      # once the launch has put a process on the host (its daemon, or the launcher's agent that
      # starts it: stopped, it never does), as stop_ranks waits for the ranks.
      local frozen="" tries
      for tries in $(seq 600); do
        frozen=$(ip netns pids "$name-h$host" | tr '\n' ' ')
        [ -z "$frozen" ] || break
        kill -0 "$job" 2>/dev/null || break
        sleep 0.1
      done
      # Early in the launch the host's processes come and go (the agent's shell, `hostname`,
      # then the daemon it execs): stopped until a pass finds every one of them stopped.
      local pid all_stopped
      for tries in $(seq 50); do
        all_stopped=1
        for pid in $(ip netns pids "$name-h$host"); do
          [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" = T ] && continue
          kill -STOP "$pid" 2>/dev/null && all_stopped=0
          [[ " $frozen " == *" $pid "* ]] || frozen+=" $pid"
        done
        [ "$all_stopped" = 0 ] || break
        sleep 0.05
      done
      undo="kill -CONT $frozen"
      ;;
  esac
  # Wait for the job; undo the fault at its time (or when the job has ended, whichever is first).
  local bytes_at_up="" t
  while kill -0 "$job" 2>/dev/null; do
    t=$(elapsed "$fault_time" "$(now)")
    if [ -n "$restore_at" ] && [ -n "$undo" ] && awk -v t="$t" -v r="$restore_at" 'BEGIN{exit !(t >= r)}'; then
      $undo 2>/dev/null || true
      undo=""
      [[ "$fault" != link_* ]] || bytes_at_up=$(traffic_bytes "$host")
    elif [ -n "$bytes_at_up" ] && [ "$(traffic_bytes "$host")" -gt $((bytes_at_up + 65536)) ]; then
      stall=$t
      bytes_at_up=""
    fi
    sleep 0.1
  done
  local code=0
  wait "$job" || code=$?
  [ -z "$sampler" ] || { kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true; }
  local end
  end=$(now)
  [ -z "$undo" ] || $undo 2>/dev/null || true
  local took verdict="pass" why="" message files
  took=$(elapsed "$fault_time" "$end")
  # Daemons exiting after mpirun may take a moment: anything still there 3 s later is left behind.
  local left tries
  for tries in $(seq 30); do
    left=$(ns_pids | tr '\n' ' ')
    [ -n "$left" ] || break
    sleep 0.1
  done
  case "$fault" in
    link_flap | slow)
      message=$(grep -m1 -E "^check: |a2d watchdog: rank" "$log" | sed -E 's/^(check:).* (PASS|FAIL).*/\1 \2/' || true)
      ;;
    kill_rank) message=$(grep -m1 -E "exited on signal" "$log" || true) ;;
    disk_full) message=$(grep -m1 -E "No space left|cannot write" "$log" || true) ;;
    *) message=$(grep -m1 -E "not answering.*on host|cluster: not started" "$log" || true) ;;
  esac
  message=$(echo "$message" | sed 's/^ *//; s/|/\//g' | cut -c1-110)
  files=$(check_files "$out" 2>&1) || { verdict=fail; why+=" files: $(echo "$files" | tail -1)"; files="BAD"; }
  if [ "${#mounts[@]}" -gt 0 ]; then umount "$out" 2>/dev/null || true; mounts=(); fi
  [ -z "$left" ] || { verdict=fail; why+=" left running: $left"; kill -KILL $left 2>/dev/null || true; }
  local bound=$((timeout + margin))
  case "$fault" in
    link_flap)
      [ "$code" -eq 0 ] || { verdict=fail; why+=" exit $code (a flap of ${flap} s should be survived)"; }
      grep -q "check: .*PASS" "$log" || { verdict=fail; why+=" no passing check"; }
      ;;
    slow)
      if [ "$code" -eq 0 ]; then
        grep -q "check: .*PASS" "$log" || { verdict=fail; why+=" no passing check"; }
      else
        grep -q "a2d watchdog: rank .* in phase" "$log" || { verdict=fail; why+=" exit $code without the watchdog's report"; }
      fi
      ;;
    disk_full)
      # It strikes at the write, after the run: no bound from the moment the disk filled.
      [ "$code" -ne 0 ] || { verdict=fail; why+=" exit 0 with a full disk"; }
      ;;
    *)
      [ "$code" -ne 0 ] || { verdict=fail; why+=" exit 0 after a fatal fault"; }
      awk -v t="$took" -v b="$bound" 'BEGIN{exit !(t <= b)}' ||
        { verdict=fail; why+=" took ${took} s, over ${bound} s"; }
      ;;
  esac
  case "$fault" in
    link_down | stop_ranks | freeze_host)
      # The watchdog's report (from the job's start on: startup_guard.hpp), or, where the fault
      # struck while mpirun was starting its daemons, the launcher's line naming the ranks that
      # did not start and their hosts: Open MPI starts no rank until every daemon has called
      # back, so then no rank exists to tell the frozen host from the others, and the line names
      # every host whose ranks did not start, that one among them.
      # While mpirun's launch is unfinished (a daemon frozen before it called back), the PMIx
      # servers of live hosts may not answer each other either: a report from the start
      # (phase start.*) names the frozen host among those that did not answer.
      if grep -Eq "^cluster: not started: ranks? [0-9, ]* on hosts? (.*, )?$name-h$host(, .*)?\$" "$log"; then
        :
      elif grep -q "a2d watchdog: rank [0-9]* made no progress .* in phase start\." "$log"; then
        grep -Eq "not answering \(dead or stuck\): ranks? [0-9, ]* on hosts? (.*, )?$name-h$host(, .*)?\$" "$log" ||
          { verdict=fail; why+=" the report from the start does not name host h$host"; }
      else
        grep -q "a2d watchdog: rank [0-9]* made no progress .* in phase" "$log" ||
          { verdict=fail; why+=" no watchdog report naming the phase"; }
        grep -q "not answering (dead or stuck): ranks\? [0-9, ]* on host $name-h$host\$" "$log" ||
          { verdict=fail; why+=" the report does not name host h$host's ranks"; }
      fi
      ;;
    kill_rank)
      grep -q "rank $rank with PID .* on node $name-h[0-9]* exited on signal 9" "$log" ||
        { verdict=fail; why+=" mpirun does not name rank $rank"; }
      ;;
    disk_full)
      grep -q "No space left on device" "$log" || { verdict=fail; why+=" no 'No space left on device'"; }
      ;;
  esac
  message=${message//$name-/}
  rows+=("| $fault | $algo | $where | $at | $took | $stall | $code | \`$message\` | $files | $verdict |")
  echo "${rows[-1]}"
  if [ "$verdict" != pass ]; then
    failures=$((failures + 1))
    echo "faults: $fault/$algo failed:$why; its log:" >&2
    sed "s/^/    /" "$log" >&2
    if [ -n "$sampler" ]; then
      echo "faults: connections with data in flight, unread or dropped at the last samples, and their other ends (ss -tinm, seconds after the fault):" >&2
      tcp_in_flight "$work/tcp.log" | sed "s/^/    /" >&2
      echo "faults: TCP drops and timeouts counted in each host since it was made (nstat):" >&2
      tcp_drop_counters | sed "s/^/    /" >&2
    fi
  fi
}

echo "$header"
echo "|---|---|---|---|---|---|---|---|---|---|"
read -r -a algo_list <<<"$algos"
index=0
for ((pass = 0; pass < repeat; pass++)); do
  for fault in $faults; do
    if [ "$all_pairs" = 1 ]; then
      for algo in "${algo_list[@]}"; do run_one "$fault" "$algo"; done
    else
      run_one "$fault" "${algo_list[$((index % ${#algo_list[@]}))]}"
    fi
    index=$((index + 1))
  done
done
if [ -n "$table" ]; then
  {
    echo "$header"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
  } >"$table.tmp.$$"
  mv "$table.tmp.$$" "$table"
fi
[ "$failures" -eq 0 ] || { echo "faults: $failures of ${#rows[@]} runs failed" >&2; exit 1; }
echo "faults: all ${#rows[@]} runs passed" >&2
