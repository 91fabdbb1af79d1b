#!/usr/bin/env bash
# Flake hunt: runs tests (or a command) many times on a loaded machine and counts the failures,
# keeping each failure's output. A test that fails 1 time in 20 is a bug: this finds it.
#
#   scripts/dev/flake_hunt.sh [--build DIR] [--repeat K] [--load N] [--out DIR]
#                         (--tests REGEX | --preset NAME | --command "SHELL COMMAND")
#
#   --build DIR     the CTest build directory (default build)
#   --repeat K      runs of each test or of the command (default 20)
#   --load N        busy processes beside the runs, at normal priority (default: the number of
#                   cores, so that the runs and the load together keep the load average at about
#                   twice the cores or more); 0 for none
#   --out DIR       where the failures' outputs and the summary go (default flake-hunt/, ignored
#                   by git)
#   --tests REGEX   every CTest test matching REGEX (ctest -R), each run K times in turn
#   --preset NAME   timing: the tests with time bounds, several processes or a network
#                   (cluster.*, slurm.*, *signals*, *watchdog*, python.torch.*, python.launch);
#                   mpi6: the MPI tests at 6 ranks or more (*.np6 ... *.np16)
#   --command CMD   run CMD (bash -c) K times instead of tests: exit 0 is a pass
#
# Prints one line per run and, at the end, a table: test, runs, failures, the load average over
# its runs (min / mean / max of samples every 5 s), and where each failure's output is. Exits 1
# if anything failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build repeat=20 load="" out=flake-hunt regex="" command=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --load) load=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --tests) regex=$2; shift 2 ;;
    --preset)
      case "$2" in
        timing) regex='^(cluster\.|slurm\.)|signals|watchdog|^python\.torch\.|^python\.launch$' ;;
        mpi6) regex='\.np([6-9]|[1-9][0-9])$' ;;
        *) echo "flake_hunt: unknown preset '$2' (timing, mpi6)" >&2; exit 2 ;;
      esac
      shift 2
      ;;
    --command) command=$2; shift 2 ;;
    -h | --help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "flake_hunt: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$regex" ] || [ -n "$command" ] || { echo "flake_hunt: give --tests, --preset or --command" >&2; exit 2; }
[[ "$repeat" =~ ^[0-9]+$ && "$repeat" -ge 1 ]] || { echo "flake_hunt: --repeat: a count >= 1" >&2; exit 2; }
[ -n "$load" ] || load=$(nproc)
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# The load: busy processes, and a sampler of the load average.
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < load; i++)); do
  bash -c 'while :; do :; done' &
  pids+=($!)
done
samples="$out/load.samples"
: >"$samples"
(while :; do echo "$(date +%s) $(cut -d' ' -f1 /proc/loadavg)" >>"$samples"; sleep 5; done) &
pids+=($!)

load_between() {  # min / mean / max of the samples between two times
  awk -v a="$1" -v b="$2" '$1 >= a && $1 <= b {n++; s += $2; if (n == 1 || $2 < lo) lo = $2;
    if ($2 > hi) hi = $2} END {if (n) printf "%.1f / %.1f / %.1f", lo, s / n, hi; else print "-"}' "$samples"
}

names=()
if [ -n "$command" ]; then
  names=("0 command")
else
  # "NUMBER NAME": run by number (names may hold characters a regular expression would read).
  mapfile -t names < <(ctest --test-dir "$build" -N -R "$regex" | sed -n 's/^ *Test *#\([0-9]*\): /\1 /p')
  [ "${#names[@]}" -gt 0 ] || { echo "flake_hunt: no test matches '$regex' in $build" >&2; exit 2; }
fi
echo "flake_hunt: ${#names[@]} test(s) x $repeat runs beside $load busy processes ($(nproc) cores)" >&2

rows=()
failed_total=0
for entry in "${names[@]}"; do
  number=${entry%% *} name=${entry#* }
  failures=0 logs="" first=$(date +%s)
  for ((run = 1; run <= repeat; run++)); do
    log="$out/$(tr -c 'A-Za-z0-9._-' _ <<<"$name").run$run.log"
    start=$(date +%s)
    if [ -n "$command" ]; then
      bash -c "$command" >"$log" 2>&1 && code=0 || code=$?
    else
      ctest --test-dir "$build" -I "$number,$number" --output-on-failure >"$log" 2>&1 && code=0 || code=$?
    fi
    took=$(($(date +%s) - start))
    if [ "$code" -eq 0 ]; then
      rm -f "$log"
      echo "flake_hunt: $name run $run: pass (${took} s, load $(cut -d' ' -f1 /proc/loadavg))" >&2
    else
      failures=$((failures + 1))
      logs+=" $log"
      echo "flake_hunt: $name run $run: FAIL (exit $code, ${took} s; output in $log)" >&2
    fi
  done
  failed_total=$((failed_total + failures))
  rows+=("| $name | $repeat | $failures | $(load_between "$first" "$(date +%s)") |${logs:- -} |")
done

{
  echo "| test | runs | failures | load average (min / mean / max) | failures' output |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$out/summary.md"
[ "$failed_total" -eq 0 ] || { echo "flake_hunt: $failed_total failed runs" >&2; exit 1; }
echo "flake_hunt: no failure" >&2
