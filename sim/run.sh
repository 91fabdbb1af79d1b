#!/usr/bin/env bash
# Runs a2d sim (the SMPI build of a2d) under SimGrid's smpirun on a platform of sim/platforms/.
#
#   sim/run.sh --platform NAME -np P [--binary PATH] [--privatize] [--smpi 'EXTRA --cfg ...'] \
#              -- [a2d sim options]
#
# NAME: a100-16x4, h100-64x1, h100-fattree-32x8, -128x8, -512x8, cluster-* (sim/platforms/*.xml);
# the first P lines of NAME.hosts place the ranks (consecutive ranks on one node). The binary is
# build/smpi/a2d unless --binary or $A2D_SMPI_BINARY says otherwise. Every setting below is a
# documented SimGrid configuration option (docs/simulation.md, "What is simulated"):
#   network/model:CM02 with latency and bandwidth factors 1 and no TCP window bound: flows share
#     links max-min fairly at the platform's line rates and latencies (SimGrid's LV08 and SMPI
#     models are calibrated on TCP over Ethernet, which none of these platforms is);
#   smpi/simulate-computation:no: only the device's charges (sim.hpp) take simulated time, not
#     the host code between MPI calls;
#   smpi/shared-malloc:local: the device's placeholder buffers are one sparse shared mapping
#     that messages are never copied from or to;
#   smpi/allgatherv:mpich_ring: MPI_Allgatherv as the ring NCCL runs, each rank passing blocks
#     to its neighbour (SimGrid's algorithm named "ring" sends rank j's block straight to j + i at
#     step i, so that up to a whole node's ranks cross the node's link at once); the engine's
#     other collectives are its own rings of MPI_Sendrecv, or all-to-alls, which SMPI's default
#     posts all at once, as NCCL's grouped sends do;
#   smpi/barrier:ompi_recursivedoubling, smpi/allreduce:rdb, smpi/reduce:binomial: logarithmic
#     schedules for the small control collectives (agreement, timing), which the timed calls do
#     not contain: SMPI's defaults are linear at rank 0, and SimGrid's wait on P requests costs it
#     O(P^2) host time (at P = 4096 most of the simulation's);
#   -no-privatize: the ranks share the program's globals (docs/simulation.md, "Globals");
#     --privatize gives every rank its own copy of the program instead (smpi/privatization:dlopen:
#     about 20 MB more per rank), which must not change a result (sim/check_p16.py compares).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
platform="" np="" binary=${A2D_SMPI_BINARY:-$here/../build/smpi/a2d} extra=""
privatize=-no-privatize
while [[ $# -gt 0 ]]; do
  case $1 in
    --platform) platform=$2; shift 2 ;;
    -np) np=$2; shift 2 ;;
    --binary) binary=$2; shift 2 ;;
    --smpi) extra=$2; shift 2 ;;
    --privatize) privatize=--cfg=smpi/privatization:dlopen; shift ;;
    --) shift; break ;;
    *) echo "sim/run.sh: unknown option $1 (usage: sim/run.sh --platform NAME -np P -- [a2d sim options])" >&2; exit 2 ;;
  esac
done
# a2d sim's own --help: SimGrid would take it for its own under smpirun, and an SMPI binary runs
# only there, so the native build it was built beside (<build>/smpi/a2d: <build>/a2d) prints them.
for arg in "$@"; do
  if [[ $arg == --help || $arg == -h ]]; then exec "$(dirname "$binary")/../a2d" sim --help; fi
done
[[ -n $platform && -n $np ]] || { echo "sim/run.sh: --platform and -np are required" >&2; exit 2; }
xml=$here/platforms/$platform.xml
hosts=$here/platforms/$platform.hosts
[[ -f $xml && -f $hosts ]] || {
  echo "sim/run.sh: no platform '$platform' (sim/platforms/: $(cd "$here/platforms" && ls *.xml | sed 's/\.xml$//' | tr '\n' ' '))" >&2
  exit 2
}
slots=$(wc -l < "$hosts")
(( np >= 1 && np <= slots )) || { echo "sim/run.sh: $platform has $slots rank slots; -np $np does not fit" >&2; exit 2; }
[[ -x $binary ]] || { echo "sim/run.sh: no SMPI build of a2d at $binary (scripts/build.sh build builds it where libsimgrid-dev is installed)" >&2; exit 2; }
command -v smpirun > /dev/null || { echo "sim/run.sh: smpirun not found (scripts/setup.sh installs libsimgrid-dev)" >&2; exit 2; }

hostfile=$(mktemp "${TMPDIR:-/tmp}/a2d-sim-hosts.XXXXXX")
trap 'rm -f "$hostfile"' EXIT
head -n "$np" "$hosts" > "$hostfile"

# SimGrid's own lines when a2d sim exits non-zero (one per rank on stderr; the command line and
# its exit code on stdout) say nothing a2d's one-line error has not: filtered out, the exit code
# kept.
smpi_noise=(-e 'SMPI process did not return 0' -e '^Execution failed with code' -e "^$binary --cfg")
quiet_failure() { grep --line-buffered -v "${smpi_noise[@]}" || true; }
statusfile=$(mktemp "${TMPDIR:-/tmp}/a2d-sim-status.XXXXXX")
trap 'rm -f "$hostfile" "$statusfile"' EXIT
echo 0 > "$statusfile"
# stdout and stderr each through the filter, in pipelines (finished when this line is), with
# smpirun's exit code kept in $statusfile.
# shellcheck disable=SC2086
{ { smpirun "$privatize" -np "$np" -platform "$xml" -hostfile "$hostfile" \
  --cfg=network/model:CM02 --cfg=network/latency-factor:1 --cfg=network/bandwidth-factor:1 \
  --cfg=network/TCP-gamma:0 --cfg=network/crosstraffic:0 \
  --cfg=smpi/simulate-computation:no --cfg=smpi/shared-malloc:local \
  --cfg=smpi/allgatherv:mpich_ring --cfg=smpi/alltoallv:default \
  --cfg=smpi/barrier:ompi_recursivedoubling --cfg=smpi/allreduce:rdb --cfg=smpi/reduce:binomial \
  --log=root.thresh:warning --log=smpi_config.thresh:error \
  $extra "$binary" sim "$@" || echo $? > "$statusfile"; } 2>&1 1>&3 3>&- | quiet_failure >&2; } \
  3>&1 | quiet_failure
exit "$(cat "$statusfile")"
