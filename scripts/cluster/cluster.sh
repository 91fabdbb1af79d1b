#!/usr/bin/env bash
# A cluster on one machine: H hosts, each a Linux network namespace with its own hostname, joined
# by shaped veth links to a bridge that lives in a namespace of its own, and one Open MPI job
# across them over TCP (no ssh: Open MPI's rsh launcher runs `ip netns exec HOST`).
#
#   scripts/cluster/cluster.sh up   --hosts H [--slots S] [--rate 100mbit] [--delay 1ms] [--link host|rank]
#                           [--name NAME] [--owner PID] [--a2d build/a2d] [--no-calibrate]
#   scripts/cluster/cluster.sh run  --name NAME [--cyclic] [--exit-grace SECONDS] [--start-timeout SECONDS]
#                           [--] PROGRAM ARGS...
#                           (mpirun -np H*S across the hosts; world rank q on host q / S, or with
#                           --cyclic on host q mod H: mpirun --map-by node)
#   scripts/cluster/cluster.sh down --name NAME
#   scripts/cluster/cluster.sh with [up options] -- PROGRAM ARGS...    (up, run, down, also on failure)
#   scripts/cluster/cluster.sh gc                                      (tear down clusters whose owner died)
#   scripts/cluster/cluster.sh list
#   scripts/cluster/cluster.sh check                                   (exit 0 if namespaces can be made)
#
# --link host: the S ranks of a host share its one link (traffic between them goes over shared
# memory, unshaped). --link rank: every rank has a link of its own: it runs in a namespace of its
# own (the host's namespace keeps the Open MPI daemon), still on the host's hostname, so ranks of
# a host still talk over shared memory, as GPUs of a node over NVLink with one NIC each.
# --rate shapes both directions of every link (tbf, burst 256kb, on the host's end and on the
# bridge's end). --delay needs the kernel's netem qdisc; where it is missing `up` fails saying so.
# Every endpoint knows every other's MAC address from the start (permanent neighbour entries, no
# ARP: the kernel's one neighbour table for all namespaces overflows at 36 hosts otherwise). The
# ranks of a job wait for MPI by sleeping (A2D_MPI_WAIT=sleep, unless the caller set it): every
# host's ranks share this machine's cores.
#
# Everything a cluster makes is named after it (namespaces NAME-h0 ..., NAME-br; hostnames
# NAME-hN; the state directory /run/a2d-cluster/NAME), its addresses lie in a /24 of 10.77.0.0/16
# that no other live cluster of this machine uses, and only inside its own namespaces. `down` ends
# the processes inside its own namespaces (and only those), deletes the namespaces and the shared
# memory and session files Open MPI leaves behind for its hostnames. `up` records the owner (the
# caller's pid, or --owner); `gc`, which `up` runs first, tears down the clusters whose owner is
# gone, so a crashed job leaves nothing behind for long.
#
# `run` bounds a job whose launcher hangs: once a rank has exited, mpirun has --exit-grace seconds
# (default 10) to end the job; if it has not (it waits on a host whose processes, its Open MPI
# daemon too, are all stopped: docs/reliability.md, "Faults across hosts"), `run` names the ranks
# still there, kills mpirun and what is left in the cluster's namespaces and exits 124, as
# srun --wait does on a Slurm cluster. A link fault while mpirun starts the job: the Open MPI
# daemons retry their connection to mpirun every second for a minute (oob_tcp_retry_delay 1,
# oob_tcp_max_recon_attempts 60; Open MPI's default is 10 tries at once, after which mpirun
# waited forever); if not every rank has started --start-timeout seconds (default 90) after
# mpirun did, `run` names how many had, ends it and exits 124.
#
# `up` also writes NAME's machine file (state directory, machine.txt; `--machine-file` of a2d
# model, plan, bench and run): the links as shaped, the ranks per node and whether they share the
# link, and the kernel rates from `a2d calibrate` run across the cluster (--no-calibrate: from
# the calibration file at that rank count if there is one, else the file has no kernel rates).
set -euo pipefail

state_root=/run/a2d-cluster
repo=$(cd "$(dirname "$0")/../.." && pwd)

die() {
  echo "cluster: $*" >&2
  exit 1
}

usage() {
  sed -n '2,50p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

can_make_namespaces() {
  [ "$(id -u)" -eq 0 ] || { echo "not root (network namespaces need CAP_SYS_ADMIN)"; return 1; }
  command -v ip >/dev/null || { echo "no ip (iproute2)"; return 1; }
  command -v tc >/dev/null || { echo "no tc (iproute2)"; return 1; }
  command -v unshare >/dev/null || { echo "no unshare (util-linux)"; return 1; }
  command -v mpirun >/dev/null || { echo "no mpirun (openmpi-bin)"; return 1; }
  local probe="a2dprobe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "cannot create a network namespace (ip netns add failed)"
    return 1
  fi
  ip netns del "$probe"
  return 0
}

# ---- state -----------------------------------------------------------------------------------

load_state() {
  local name=$1
  [ -f "$state_root/$name/config" ] || die "no cluster named '$name' (scripts/cluster/cluster.sh list)"
  # shellcheck disable=SC1090
  . "$state_root/$name/config"
}

namespaces_of() {  # every namespace this cluster made (by its prefix)
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-(h[0-9]+(r[0-9]+)?|br)$" || true
}

teardown() {
  local name=$1 ns pid
  # End the processes inside this cluster's namespaces, and only those.
  for ns in $(namespaces_of "$name"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      kill -TERM "$pid" 2>/dev/null || true
    done
  done
  sleep 0.2
  for ns in $(namespaces_of "$name"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      kill -KILL "$pid" 2>/dev/null || true
    done
  done
  for ns in $(namespaces_of "$name"); do
    ip netns del "$ns" 2>/dev/null || true
  done
  # What Open MPI leaves behind after a killed job, named by this cluster's hostnames.
  rm -rf /dev/shm/vader_segment."$name"-h* /tmp/ompi."$name"-h* 2>/dev/null || true
  rm -rf "${state_root:?}/$name"
}

gc() {
  local dir name owner
  [ -d "$state_root" ] || return 0
  for dir in "$state_root"/*/; do
    [ -f "$dir/config" ] || continue
    name=$(basename "$dir")
    owner=$(sed -n 's/^owner=//p' "$dir/config")
    if [ -n "$owner" ] && ! kill -0 "$owner" 2>/dev/null; then
      echo "cluster: tearing down '$name' (its owner $owner is gone)" >&2
      teardown "$name"
    fi
  done
}

free_subnet() {  # the first 10.77.K.0/24 no live cluster of this machine uses
  local k used
  used=$(cat "$state_root"/*/config 2>/dev/null | sed -n 's/^subnet_index=//p' || true)
  for k in $(seq 1 250); do
    grep -qx "$k" <<<"$used" || { echo "$k"; return; }
  done
  die "no free subnet: 250 clusters are up (scripts/cluster/cluster.sh list)"
}

# ---- up --------------------------------------------------------------------------------------

rate_bits() {  # 100mbit -> 100000000
  local r=${1,,}
  case "$r" in
    *gbit) echo $(( ${r%gbit} * 1000000000 )) ;;
    *mbit) echo $(( ${r%mbit} * 1000000 )) ;;
    *kbit) echo $(( ${r%kbit} * 1000 )) ;;
    *) die "--rate like 100mbit, 1gbit or 500kbit, got '$1'" ;;
  esac
}

has_netem() {
  local probe="a2dnetem$$" ok=1
  ip netns add "$probe"
  ip -n "$probe" link set lo up
  tc -n "$probe" qdisc add dev lo root netem delay 1ms 2>/dev/null && ok=0
  ip netns del "$probe"
  return $ok
}

shape() {  # shape NS DEV: both directions are shaped by shaping each end's egress
  local ns=$1 dev=$2
  if [ -n "$delay" ]; then
    tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "$delay"
    tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$rate" burst 256kb latency 20ms
  else
    tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency 20ms
  fi
}

# One endpoint: namespace NS gets eth0 with address ADDR, linked to port PORT of the bridge.
add_endpoint() {
  local ns=$1 port=$2 addr=$3
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$bridge_ns" link add "$port" type veth peer name eth0 netns "$ns"
  ip -n "$bridge_ns" link set "$port" master br0 up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  shape "$ns" eth0
  shape "$bridge_ns" "$port"
}

# Every endpoint learns every other's MAC address as a permanent neighbour entry: no ARP. The
# kernel keeps one neighbour table for all namespaces, and above net.ipv4.neigh.default.gc_thresh3
# entries (1024 by default) it refuses new ones ("neighbor table overflow" in dmesg): 36 hosts
# make 1260, 64 make 4032, and connections between hosts then fail (Open MPI: "connect() ...
# failed: Operation now in progress (115)", its stale errno) or stall. Permanent entries are
# exempt from that limit and from its garbage collection.
static_neighbours() {
  local name=$1 ns addr mac batch
  local -a spaces=() addrs=() macs=()
  for ns in $(namespaces_of "$name"); do
    [ "$ns" != "$name-br" ] || continue
    addr=$(ip -n "$ns" -4 -o addr show dev eth0 | awk '{split($4, a, "/"); print a[1]}')
    mac=$(ip -n "$ns" -o link show dev eth0 | sed -n 's/.*link\/ether \([0-9a-f:]*\).*/\1/p')
    spaces+=("$ns") addrs+=("$addr") macs+=("$mac")
  done
  batch=$(mktemp)
  local i j
  for ((i = 0; i < ${#spaces[@]}; i++)); do
    : >"$batch"
    for ((j = 0; j < ${#spaces[@]}; j++)); do
      [ "$i" -eq "$j" ] || echo "neigh replace ${addrs[j]} lladdr ${macs[j]} dev eth0 nud permanent" >>"$batch"
    done
    ip -n "${spaces[i]}" -batch "$batch"
  done
  rm -f "$batch"
}

write_launcher_files() {
  local dir=$1 h
  : >"$dir/hostfile"
  for ((h = 0; h < hosts; h++)); do
    echo "$name-h$h slots=$slots" >>"$dir/hostfile"
  done
  # Open MPI's rsh launcher calls this as `AGENT HOST orted ARGS...` (ARGS: one shell string).
  cat >"$dir/agent" <<EOF
#!/bin/sh
host=\$1
shift
exec ip netns exec "\$host" unshare --uts -- sh -c "hostname \$host && exec \$*"
EOF
  # Each rank, started by its host's daemon: with one link per rank, into its own namespace.
  # It records its pid (exec keeps it) for `run`'s watch over the job.
  cat >"$dir/rank" <<EOF
#!/bin/sh
if [ -n "\${A2D_CLUSTER_PIDS:-}" ]; then
  echo \$\$ >"\$A2D_CLUSTER_PIDS/\${OMPI_COMM_WORLD_RANK:?}"
fi
if [ "$link" = rank ]; then
  exec ip netns exec "\$(hostname)r\${OMPI_COMM_WORLD_LOCAL_RANK:?}" "\$@"
fi
exec "\$@"
EOF
  chmod +x "$dir/agent" "$dir/rank"
}

up() {
  local hosts=0 slots=1 rate=100mbit delay="" link=host name="" owner=$PPID a2d="$repo/build/a2d"
  local calibrate=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --hosts) hosts=$2; shift 2 ;;
      --slots) slots=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --delay) delay=$2; shift 2 ;;
      --link) link=$2; shift 2 ;;
      --name) name=$2; shift 2 ;;
      --owner) owner=$2; shift 2 ;;
      --a2d) a2d=$2; shift 2 ;;
      --no-calibrate) calibrate=0; shift ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  [[ "$hosts" =~ ^[0-9]+$ && "$hosts" -ge 1 && "$hosts" -le 200 ]] || die "--hosts 1..200"
  [[ "$slots" =~ ^[0-9]+$ && "$slots" -ge 1 && "$slots" -le 64 ]] || die "--slots 1..64"
  [ "$link" = host ] || [ "$link" = rank ] || die "--link host or rank, got '$link'"
  rate_bits "$rate" >/dev/null
  local why
  why=$(can_make_namespaces) || die "cannot build a cluster here: $why"
  [ -z "$delay" ] || has_netem ||
    die "--delay needs the netem qdisc, which this kernel ($(uname -r)) does not have"
  [ -n "$name" ] || name="a2dc$$"
  [[ "$name" =~ ^[a-z][a-z0-9]{0,9}$ ]] || die "--name: a lowercase letter, then up to 9 letters/digits"
  mkdir -p "$state_root"
  gc
  [ ! -e "$state_root/$name" ] || die "a cluster named '$name' is up (scripts/cluster/cluster.sh down --name $name)"
  [ -z "$(namespaces_of "$name")" ] || die "namespaces of '$name' exist without its state; remove them or choose another --name"
  local dir="$state_root/$name" index
  mkdir -p "$dir"
  index=$(free_subnet)
  local subnet="10.77.$index"
  cat >"$dir/config" <<EOF
name=$name
owner=$owner
hosts=$hosts
slots=$slots
rate=$rate
delay=$delay
link=$link
subnet_index=$index
subnet=$subnet.0/24
EOF
  local bridge_ns="$name-br" h r address=1
  trap 'teardown "$name"; exit 1' ERR INT TERM
  ip netns add "$bridge_ns"
  ip -n "$bridge_ns" link set lo up
  ip -n "$bridge_ns" link add br0 type bridge
  ip -n "$bridge_ns" link set br0 up
  for ((h = 0; h < hosts; h++)); do
    add_endpoint "$name-h$h" "p$h" "$subnet.$address"
    address=$((address + 1))
    if [ "$link" = rank ]; then
      for ((r = 0; r < slots; r++)); do
        add_endpoint "$name-h${h}r$r" "p${h}r$r" "$subnet.$address"
        address=$((address + 1))
      done
    fi
  done
  [ "$address" -le 255 ] || die "too many endpoints for one /24 ($((address - 1)))"
  static_neighbours "$name"
  write_launcher_files "$dir"
  trap - ERR INT TERM
  echo "cluster: '$name' up: $hosts hosts x $slots ranks, $rate${delay:+, delay $delay}, one link per $link, $subnet.0/24" >&2
  write_machine_file "$name" "$a2d" "$calibrate"
  echo "$name"
}

# ---- run -------------------------------------------------------------------------------------

mpirun_args() {  # the mpirun options of a cluster (after load_state)
  local dir="$state_root/$name"
  printf '%s\n' -np "$((hosts * slots))" --hostfile "$dir/hostfile" \
    --mca plm_rsh_agent "$dir/agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl self,vader,tcp --mca oob_tcp_if_include "$subnet" --mca btl_tcp_if_include "$subnet" \
    --mca oob_tcp_retry_delay 1 --mca oob_tcp_max_recon_attempts 60 \
    --mca mpi_yield_when_idle 1 --mca coll_tuned_use_dynamic_rules 1 \
    --mca coll_tuned_allgather_algorithm 4 --mca coll_tuned_allgatherv_algorithm 3 \
    --bind-to none --oversubscribe --allow-run-as-root -x A2D_MPI_WAIT
}

alive() {  # a process that exists and is not a zombie (a stopped one is alive)
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

kill_namespaces() {  # SIGKILL every process inside this cluster's namespaces (ours only)
  local ns pid
  for ns in $(namespaces_of "$1"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  done
}

# "rank 3", "ranks 1, 2": a word and its list.
plural() {
  local word=$1
  shift
  local list
  list=$(printf ', %s' "$@")
  echo "$word$([ $# -gt 1 ] && echo s) ${list#, }"
}

# The host a rank of a job runs on: mpirun fills each host's slots in turn, or (--cyclic, map-by
# node) deals ranks to the hosts in turn.
host_of_rank() {
  if [ "$cyclic" = 1 ]; then echo "$name-h$(($1 % hosts))"; else echo "$name-h$(($1 / slots))"; fi
}

# Waits for mpirun (pid $1); the ranks' pids are files named by rank in $2. Returns mpirun's
# exit status, or 124 when it was still running $3 seconds after a rank had exited, or when
# fewer than $5 ranks had started $4 seconds after it did (naming the ranks that had not and
# their hosts: a host frozen or unreachable while mpirun started the job leaves every rank
# waiting for it before any of them can tell).
watch_job() {
  local launcher=$1 pids=$2 grace=$3 start_timeout=$4 ranks=$5 first_exit="" file rank pid gone
  local alive_ranks started=$SECONDS missing missing_hosts host
  while alive "$launcher"; do
    if [ -n "$started" ] && [ "$(find "$pids" -type f | wc -l)" -ge "$ranks" ]; then
      started=""
    elif [ -n "$started" ] && [ $((SECONDS - started)) -ge "$start_timeout" ]; then
      missing=() missing_hosts=()
      for ((rank = 0; rank < ranks; rank++)); do
        [ -e "$pids/$rank" ] && continue
        missing+=("$rank")
        host=$(host_of_rank "$rank")
        [[ " ${missing_hosts[*]} " == *" $host "* ]] || missing_hosts+=("$host")
      done
      echo "cluster: only $(find "$pids" -type f | wc -l) of $ranks ranks started within" \
        "$start_timeout s (a host unreachable or frozen while mpirun started the job?): ending it" >&2
      echo "cluster: not started: $(plural rank "${missing[@]}") on $(plural host "${missing_hosts[@]}")" >&2
      kill -KILL "$launcher" 2>/dev/null || true
      kill_namespaces "$name"
      wait "$launcher" 2>/dev/null || true
      return 124
    fi
    if [ -z "$first_exit" ]; then
      for file in "$pids"/*; do
        [ -f "$file" ] || continue
        pid=$(cat "$file")
        if [ -n "$pid" ] && ! alive "$pid"; then
          first_exit=$SECONDS
          gone=$(basename "$file")
          break
        fi
      done
    elif [ $((SECONDS - first_exit)) -ge "$grace" ]; then
      alive_ranks=""
      for file in "$pids"/*; do
        rank=$(basename "$file")
        pid=$(cat "$file")
        if alive "$pid"; then
          alive_ranks+=" $rank"
          [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" != T ] || alive_ranks+="(stopped)"
        fi
      done
      echo "cluster: rank $gone exited ${grace} s ago and mpirun has not ended the job (ranks still" \
        "there:${alive_ranks:- none}; a host whose processes are stopped?): ending it" >&2
      # Not SIGINT: Open MPI's forced exit after a second interrupt crashes in PMIx_Finalize
      # while a daemon is stopped; nothing of mpirun's own cleanup can finish then anyway.
      kill -KILL "$launcher" 2>/dev/null || true
      kill_namespaces "$name"
      wait "$launcher" 2>/dev/null || true
      return 124
    fi
    sleep 0.5
  done
  local status=0
  wait "$launcher" || status=$?
  return "$status"
}

run() {
  local name="" placement=() grace=10 start_timeout=90 cyclic=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --name) name=$2; shift 2 ;;
      --cyclic) placement=(--map-by node); cyclic=1; shift ;;
      --exit-grace) grace=$2; shift 2 ;;
      --start-timeout) start_timeout=$2; shift 2 ;;
      --) shift; break ;;
      *) break ;;
    esac
  done
  [ -n "$name" ] || die "run: --name NAME"
  [[ "$grace" =~ ^[0-9]+$ && "$grace" -ge 1 ]] || die "run: --exit-grace: whole seconds, at least 1"
  [[ "$start_timeout" =~ ^[0-9]+$ && "$start_timeout" -ge 1 ]] || die "run: --start-timeout: whole seconds, at least 1"
  [ $# -gt 0 ] || die "run: a program to run"
  load_state "$name"
  local args=()
  mapfile -t args < <(mpirun_args)
  # mpirun runs inside the first host (the daemons connect back to its address), on its hostname.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
  # Every host's ranks share the machine's cores: waiting ranks sleep rather than poll (a2d's
  # A2D_MPI_WAIT; docs/benchmarks.md, "P = 64"), unless the caller chose.
  export A2D_MPI_WAIT=${A2D_MPI_WAIT:-sleep}
  if [ "$link" = rank ]; then
    # A rank in a namespace of its own cannot reach its daemon's PMIx server on the host's
    # loopback: let the server listen on the cluster's subnet too.
    export PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include="$subnet"
  fi
  local pids
  pids=$(mktemp -d "$state_root/$name/job.XXXXXX")
  export A2D_CLUSTER_PIDS=$pids
  local status=0 launcher
  ip netns exec "$name-h0" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$name-h0" \
    mpirun "${args[@]}" -x A2D_CLUSTER_PIDS "${placement[@]}" "$state_root/$name/rank" "$@" &
  launcher=$!
  # Interrupted (a test's time limit, ctrl-C): end the job, and what it left in the namespaces.
  trap 'kill -TERM "$launcher" 2>/dev/null; sleep 1; kill_namespaces "$name"; rm -rf "$pids"; exit 130' INT TERM
  watch_job "$launcher" "$pids" "$grace" "$start_timeout" "$((hosts * slots))" || status=$?
  trap - INT TERM
  # A failed job can leave ranks behind inside the namespaces: end them (ours only).
  [ "$status" -eq 0 ] || kill_namespaces "$name"
  rm -rf "$pids"
  return "$status"
}

# ---- the machine file ------------------------------------------------------------------------

section_of() {  # the [ranks P] section of a calibration file, as key=value lines
  awk -v want="[ranks $2]" '/^\[/{on = ($0 == want); next} on && /=/{gsub(/[ \t]/, ""); print}' "$1"
}

write_machine_file() {
  local name=$1 a2d=$2 calibrate=$3
  load_state "$name"
  local dir="$state_root/$name" ranks=$((hosts * slots)) bits
  bits=$(rate_bits "$rate")
  if [ "$calibrate" != 1 ]; then
    echo "cluster: --no-calibrate: no machine file (it needs kernel rates)" >&2
    return 0
  fi
  [ -x "$a2d" ] || die "no $a2d to calibrate with (build first, or --a2d PATH, or --no-calibrate)"
  echo "cluster: a2d calibrate across '$name' ($ranks ranks)" >&2
  local calibration="$dir/calibration.txt"
  run --name "$name" "$a2d" calibrate --out "$calibration" --iters 3 --kernel-seconds 0.3 \
    >"$dir/calibrate.log" 2>&1 || { cat "$dir/calibrate.log" >&2; die "a2d calibrate failed across '$name'"; }
  local -A across=() inside=()
  local key value
  while IFS='=' read -r key value; do across[$key]=$value; done < <(section_of "$calibration" "$ranks")
  [ -n "${across[kernel_forward_gflops]:-}" ] || die "no [ranks $ranks] section in $calibration"
  if [ "$slots" -gt 1 ]; then
    # The shared memory between the ranks of one host: its latency and bandwidth measured by
    # a calibration of S ranks on one host (outside the cluster; nothing crosses a link).
    mpirun -np "$slots" --oversubscribe --bind-to none --allow-run-as-root --mca btl self,vader \
      "$a2d" calibrate --out "$dir/intra.txt" --iters 3 --block 256 --kernel-seconds 0 \
      >"$dir/intra.log" 2>&1 || { cat "$dir/intra.log" >&2; die "the one-host calibration failed"; }
    while IFS='=' read -r key value; do inside[$key]=$value; done < <(section_of "$dir/intra.txt" "$slots")
  else
    inside[latency_us]=${across[latency_us]}
    inside[bandwidth_gbs]=${across[bandwidth_gbs]}
  fi
  local delay_value
  delay_value=$(delay_us "$delay")
  {
    echo "# a2d machine file, written by scripts/cluster/cluster.sh for cluster '$name' on $(date -u +%FT%TZ)"
    echo "# $hosts hosts x $slots ranks, one link of $rate${delay:+ (delay $delay)} per $link"
    echo "name = cluster-${hosts}x${slots}-$rate-per-$link"
    echo "device = cpu"
    echo "ranks_per_node = $slots"
    echo "# this machine's physical memory, shared by the ranks of every emulated host"
    echo "memory_gib = $(awk -v r="$ranks" '/^MemTotal:/ {printf "%.6g", $2 / 1048576 / r}' /proc/meminfo)"
    echo "shared_link = $([ "$link" = host ] && echo 1 || echo 0)"
    echo "# the link as shaped (tbf rate, bytes per second per direction); its latency: a ring"
    echo "# shift of 8 bytes across the cluster (a2d calibrate) plus the netem delay"
    echo "inter_bandwidth_gbs = $(awk -v b="$bits" 'BEGIN{printf "%.6g", b/8/1e9}')"
    echo "inter_latency_us = $(awk -v l="${across[latency_us]}" -v d="$delay_value" 'BEGIN{printf "%.6g", l+d}')"
    echo "# a2d calibrate's all-gather across the cluster measured ${across[bandwidth_gbs]} GB/s per rank"
    if [ "$slots" -gt 1 ]; then
      echo "# between the ranks of one host (shared memory): a2d calibrate of $slots ranks on one host"
    else
      echo "# one rank per host: nothing travels inside a node (the link's figures, unused)"
    fi
    echo "intra_latency_us = ${inside[latency_us]}"
    echo "intra_bandwidth_gbs = ${inside[bandwidth_gbs]}"
    echo "# the links, not the cores, carry the traffic: transfers overlap computation, so the"
    echo "# cores are not marked shared (a2d calibrate ran on ${across[cores]} cores; the kernel"
    echo "# rates below are per rank with all $ranks ranks computing at once)"
    echo "cores = 0"
    for key in kernel_forward_gflops kernel_backward_gflops kernel_forward_causal_gflops \
      kernel_backward_causal_gflops block kernel_forward_panel_us kernel_forward_key_us \
      permute_gbs sum_gbs merge_gbs sync_us step_sync_us; do
      [ -z "${across[$key]:-}" ] || echo "$key = ${across[$key]}"
    done
  } >"$dir/machine.txt"
  echo "cluster: wrote $dir/machine.txt" >&2
}

delay_us() {
  local d=${1:-0}
  case "$d" in
    *ms) awk -v v="${d%ms}" 'BEGIN{print v*1000}' ;;
    *us) echo "${d%us}" ;;
    0) echo 0 ;;
    *) die "--delay like 1ms or 500us, got '$d'" ;;
  esac
}

# ---- commands ---------------------------------------------------------------------------------

command=${1:-}
[ -n "$command" ] || usage 1
shift
case "$command" in
  up) up "$@" ;;
  run) run "$@" ;;
  down)
    [ "${1:-}" = --name ] && [ -n "${2:-}" ] || die "down: --name NAME"
    teardown "$2"
    ;;
  with)
    up_args=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do up_args+=("$1"); shift; done
    [ "${1:-}" = -- ] || die "with: [up options] -- PROGRAM ARGS..."
    shift
    name=$(up "${up_args[@]}" --owner $$) || exit 1
    trap 'teardown "$name"' EXIT
    trap 'exit 130' INT TERM
    export A2D_CLUSTER="$name" A2D_CLUSTER_DIR="$state_root/$name"
    status=0
    "$@" || status=$?
    exit "$status"
    ;;
  gc) gc ;;
  list)
    for dir in "$state_root"/*/; do
      [ -f "$dir/config" ] && (. "$dir/config"; echo "$name: $hosts x $slots, $rate, per $link, $subnet, owner $owner")
    done 2>/dev/null || true
    ;;
  check)
    if why=$(can_make_namespaces); then echo "cluster: namespaces can be made"; else echo "cluster: $why"; exit 1; fi
    ;;
  -h | --help | help) usage 0 ;;
  *) die "unknown command '$command' (up, run, down, with, gc, list, check)" ;;
esac
