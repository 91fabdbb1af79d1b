#!/usr/bin/env bash
# A Slurm cluster on the emulated hosts of scripts/cluster/cluster.sh: munged, slurmctld on a controller
# host of its own, one slurmd per host, so jobs are submitted as on a real cluster.
#
#   scripts/slurm/slurm_cluster.sh up   --hosts H [--slots S] [--rate 100mbit] [--name NAME] [--owner PID]
#   scripts/slurm/slurm_cluster.sh exec --name NAME [--] COMMAND ARGS...   (on the controller host, with
#                                 SLURM_CONF set: sinfo, sbatch, srun, squeue, scancel, scontrol)
#   scripts/slurm/slurm_cluster.sh down --name NAME
#   scripts/slurm/slurm_cluster.sh with [up options] -- COMMAND ARGS...   (up, COMMAND with SLURM_CONF
#                                 and A2D_SLURM=NAME exported, down, also on failure; COMMAND runs
#                                 where the caller is: use `exec` inside it for Slurm's commands)
#   scripts/slurm/slurm_cluster.sh gc                                     (tear down clusters whose owner died)
#   scripts/slurm/slurm_cluster.sh check                                  (exit 0 if a cluster can start here)
#
# The hosts are scripts/cluster/cluster.sh's (namespaces NAME-h0 ..., each with its hostname and a link
# shaped to --rate, one per host). The controller host NAME-ctl is one more namespace on the same
# bridge (address .254 of the cluster's /24, unshaped): slurmctld runs there, and so do the
# commands of `exec` (it is the login node too). NodeName per host with its address, CPUs = S
# (SlurmdParameters=config_overrides: more CPUs than this machine has), proctrack/linuxproc and
# task/none (no cgroups needed), select/cons_tres with CR_CPU (S tasks of one CPU each per node),
# MpiDefault=none (jobs say srun --mpi=pmix_v4: docs/slurm.md says why that plugin).
#
# Every file lives in the run directory /run/a2d-slurm/NAME (slurm.conf, the munge key and socket,
# the state, spool, pid and log files); nothing is written to /etc. One munged serves every host
# (they share this machine's file system, so its socket is every host's; on a real cluster each
# node runs its own with the same key). Accounting: no slurmdbd, so `sacct` has no records; a
# job's end state is in `squeue -t all` / `scontrol show job` for MinJobAge (300 s) and in the
# run directory's jobcomp.txt (jobcomp/filetxt).
#
# `up` waits (60 s at most) until `sinfo` shows every node idle, else prints the daemons' logs
# and fails. `down` ends what `up` started by the pids it recorded (slurmctld, the slurmds,
# munged), then whatever is left inside the cluster's namespaces (job steps), then the hosts
# (scripts/cluster/cluster.sh down), and removes the run directory.
set -euo pipefail

state_root=/run/a2d-slurm
repo=$(cd "$(dirname "$0")/../.." && pwd)
cluster_sh="$repo/scripts/cluster/cluster.sh"

die() {
  echo "slurm_cluster: $*" >&2
  exit 1
}

usage() {
  sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

can_start() {  # why not, on stdout, and status 1; nothing and 0 if a cluster can start here
  local why
  why=$("$cluster_sh" check 2>&1) || { echo "${why#cluster: }"; return 1; }
  local tool
  for tool in munged slurmctld slurmd sinfo srun sbatch scancel; do
    command -v "$tool" >/dev/null || { echo "no $tool (scripts/setup.sh installs slurm-wlm and munge)"; return 1; }
  done
  return 0
}

# ---- down ------------------------------------------------------------------------------------

alive() {  # a process that exists and is not a zombie
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

stop_pids() {  # TERM, then (after up to 5 s) KILL, the processes whose pids the files hold
  local file pid pids=() waited
  for file in "$@"; do
    [ -f "$file" ] || continue
    pid=$(cat "$file")
    [[ "$pid" =~ ^[0-9]+$ ]] || continue
    alive "$pid" && { kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); }
  done
  for ((waited = 0; waited < 50; waited++)); do
    local left=0
    for pid in "${pids[@]}"; do alive "$pid" && left=1; done
    [ "$left" -eq 1 ] || return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

teardown() {
  local name=$1 dir="$state_root/$1" pid
  # The daemons first (slurmctld before the slurmds, so it does not mark them down), then munged.
  stop_pids "$dir/slurmctld.pid"
  stop_pids "$dir"/slurmd.*.pid
  stop_pids "$dir/munged.pid"
  # What is left on the controller host (an srun or sbatch of `exec`), then the namespace.
  if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$name-ctl"; then
    for pid in $(ip netns pids "$name-ctl" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$name-ctl" 2>/dev/null || true
  fi
  # The hosts, and what runs in them still (job steps: slurmstepd and its tasks).
  [ ! -f "/run/a2d-cluster/$name/config" ] || "$cluster_sh" down --name "$name"
  # The run directory: configuration, state, spool (PMIx's per-step files), logs.
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
      echo "slurm_cluster: tearing down '$name' (its owner $owner is gone)" >&2
      teardown "$name"
    fi
  done
}

# ---- up --------------------------------------------------------------------------------------

# Runs COMMAND in the background inside namespace NS on hostname HOST, its pid in PIDFILE (the
# shell execs the command, so the pid is the daemon's), its output in LOG.
start_in() {
  local ns=$1 host=$2 pidfile=$3 log=$4
  shift 4
  setsid ip netns exec "$ns" unshare --uts -- sh -c \
    'echo $$ >"$1" && hostname "$2" && shift 2 && exec "$@"' sh "$pidfile" "$host" "$@" \
    </dev/null >"$log" 2>&1 &
}

write_slurm_conf() {  # the cluster's slurm.conf (after the cluster's config is loaded)
  local dir=$1 h nodes=""
  for ((h = 0; h < hosts; h++)); do
    nodes+="NodeName=$name-h$h NodeAddr=$prefix.$((h + 1)) NodeHostname=$name-h$h CPUs=$slots State=UNKNOWN"$'\n'
  done
  cat >"$dir/slurm.conf" <<EOF
# written by scripts/slurm/slurm_cluster.sh for cluster '$name' ($hosts hosts x $slots CPUs)
ClusterName=$name
SlurmctldHost=$name-ctl($prefix.254)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.daemon.pid
SlurmdPidFile=$dir/spool/%n/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$dir/tmp
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
SlurmctldTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
$nodes
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  : >"$dir/plugstack.conf"
  # slurmd 22.05 loads a cgroup plugin even with proctrack/linuxproc and task/none, and its
  # autodetection fails on this machine (a tmpfs at /sys/fs/cgroup with v1 hierarchies under
  # it): name v1. Nothing is confined by it (no cgroup plugin is configured to use it).
  cat >"$dir/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
EOF
}

up() {
  local hosts=0 slots=1 rate=100mbit name="" owner=$PPID
  while [ $# -gt 0 ]; do
    case "$1" in
      --hosts) hosts=$2; shift 2 ;;
      --slots) slots=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --name) name=$2; shift 2 ;;
      --owner) owner=$2; shift 2 ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  [[ "$hosts" =~ ^[0-9]+$ && "$hosts" -ge 1 && "$hosts" -le 200 ]] || die "--hosts 1..200"
  local why
  why=$(can_start) || die "cannot start a Slurm cluster here: $why"
  [ -n "$name" ] || name="a2ds$$"
  # (cluster.sh checks the name's form)
  mkdir -p "$state_root"
  chmod 755 "$state_root"
  gc
  [ ! -e "$state_root/$name" ] || die "a Slurm cluster named '$name' is up (scripts/slurm/slurm_cluster.sh down --name $name)"
  "$cluster_sh" up --hosts "$hosts" --slots "$slots" --rate "$rate" --name "$name" \
    --owner "$owner" --no-calibrate >/dev/null 2>"$state_root/.$name.up.log" ||
    { cat "$state_root/.$name.up.log" >&2; rm -f "$state_root/.$name.up.log"; die "the hosts did not come up"; }
  rm -f "$state_root/.$name.up.log"
  local dir="$state_root/$name"
  mkdir -p "$dir"/{state,spool,log,tmp}
  chmod 755 "$dir"  # munged wants its socket's directories searchable by all
  trap 'teardown "$name"; exit 1' ERR INT TERM
  local subnet
  subnet=$(sed -n 's/^subnet=//p' "/run/a2d-cluster/$name/config")
  local prefix=${subnet%.0/24}
  cat >"$dir/config" <<EOF
name=$name
owner=$owner
hosts=$hosts
slots=$slots
prefix=$prefix
EOF
  local h
  for ((h = 0; h < hosts; h++)); do mkdir -p "$dir/spool/$name-h$h"; done
  write_slurm_conf "$dir"

  # The controller host: one more endpoint on the cluster's bridge, unshaped.
  ip netns add "$name-ctl"
  ip -n "$name-ctl" link set lo up
  ip -n "$name-br" link add pctl type veth peer name eth0 netns "$name-ctl"
  ip -n "$name-br" link set pctl master br0 up
  ip -n "$name-ctl" addr add "$prefix.254/24" dev eth0
  ip -n "$name-ctl" link set eth0 up

  # munged: a fresh key of this cluster only, readable by root only.
  dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge.key"
  setsid munged --force --foreground --key-file="$dir/munge.key" --socket="$dir/munge.socket" \
    --pid-file="$dir/munged.daemon.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munged.seed" </dev/null >"$dir/log/munged.out" 2>&1 &
  echo $! >"$dir/munged.pid"
  local waited=0
  while [ ! -S "$dir/munge.socket" ] && [ "$waited" -lt 50 ]; do sleep 0.1; waited=$((waited + 1)); done
  [ -S "$dir/munge.socket" ] || { cat "$dir/log/munged.out" "$dir/log/munged.log" >&2 2>/dev/null; die "munged did not start"; }

  export SLURM_CONF="$dir/slurm.conf"
  start_in "$name-ctl" "$name-ctl" "$dir/slurmctld.pid" "$dir/log/slurmctld.out" \
    slurmctld -D -i -f "$SLURM_CONF"
  # Each slurmd in a mount namespace of its own, where the node's own directory is mounted on
  # TmpFS: Slurm's PMIx plugin makes its per-step directories there under names without the
  # node's, so nodes sharing one TmpFS collide ("Cannot create directory ... File exists").
  for ((h = 0; h < hosts; h++)); do
    mkdir -p "$dir/tmp-of/$name-h$h"
    start_in "$name-h$h" "$name-h$h" "$dir/slurmd.$name-h$h.pid" "$dir/log/slurmd.$name-h$h.out" \
      unshare --mount --propagation private -- sh -c \
      'mount --bind "$1" "$2" && shift 2 && exec "$@"' sh "$dir/tmp-of/$name-h$h" "$dir/tmp" \
      slurmd -D -N "$name-h$h" -f "$SLURM_CONF"
  done

  # Until sinfo shows every node idle: 60 s at most.
  local idle=0 states="" deadline=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$deadline" ]; do
    states=$(timeout 10 "$0" exec --name "$name" sinfo -h -N -o '%N %T' 2>&1 || true)
    idle=$(grep -c ' idle$' <<<"$states" || true)
    [ "$idle" -lt "$hosts" ] || break
    sleep 0.5
  done
  if [ "$idle" -lt "$hosts" ]; then
    echo "slurm_cluster: after 60 s, $idle of $hosts nodes idle; sinfo says:" >&2
    echo "$states" >&2
    tail -n 20 "$dir"/log/*.log "$dir"/log/*.out >&2 2>/dev/null || true
    die "the Slurm cluster '$name' did not come up"
  fi
  trap - ERR INT TERM
  echo "slurm_cluster: '$name' up: $hosts nodes x $slots CPUs, $rate links, controller $prefix.254;" \
    "SLURM_CONF=$dir/slurm.conf" >&2
  echo "$name"
}

# ---- exec ------------------------------------------------------------------------------------

# in_ctl NAME COMMAND ARGS...: on the controller host, with its SLURM_CONF, and Open MPI's
# settings for the cluster's network as scripts/cluster/cluster.sh gives mpirun (TCP on the cluster's
# subnet, shared memory inside a host, yielding when idle: the hosts share 2 cores); srun passes
# the environment on to the tasks. A variable already set wins.
in_ctl() {
  local name=$1 prefix
  shift
  prefix=$(sed -n 's/^prefix=//p' "$state_root/$name/config")
  SLURM_CONF="$state_root/$name/slurm.conf" \
    OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp} \
    OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-$prefix.0/24} \
    OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1} \
    ip netns exec "$name-ctl" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$name-ctl" "$@"
}

# ---- commands ---------------------------------------------------------------------------------

command=${1:-}
[ -n "$command" ] || usage 1
shift
case "$command" in
  up) up "$@" ;;
  exec)
    [ "${1:-}" = --name ] && [ -n "${2:-}" ] || die "exec: --name NAME [--] COMMAND ARGS..."
    name=$2
    shift 2
    [ "${1:-}" != -- ] || shift
    [ $# -gt 0 ] || die "exec: a command to run"
    [ -f "$state_root/$name/config" ] || die "no Slurm cluster named '$name'"
    in_ctl "$name" "$@"
    ;;
  down)
    [ "${1:-}" = --name ] && [ -n "${2:-}" ] || die "down: --name NAME"
    teardown "$2"
    ;;
  with)
    up_args=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do up_args+=("$1"); shift; done
    [ "${1:-}" = -- ] || die "with: [up options] -- COMMAND ARGS..."
    shift
    name=$(up "${up_args[@]}" --owner $$) || exit 1
    trap 'teardown "$name"' EXIT
    trap 'exit 130' INT TERM
    export A2D_SLURM="$name" SLURM_CONF="$state_root/$name/slurm.conf"
    status=0
    "$@" || status=$?
    exit "$status"
    ;;
  gc) gc ;;
  check)
    if why=$(can_start); then echo "slurm_cluster: a Slurm cluster can start here"; else echo "slurm_cluster: $why"; exit 1; fi
    ;;
  -h | --help | help) usage 0 ;;
  *) die "unknown command '$command' (up, exec, down, with, gc, check)" ;;
esac
