#!/usr/bin/env bash
# scripts/report.py, the table tool of the measurement scripts: every feature they use, each
# output compared exactly (text and Markdown tables, missing fields, --best/--where/--sort/--let,
# --summary, key = value inputs, --set, JSON lines) and its refusals. Under a second.
set -euo pipefail
cd "$(dirname "$0")/../.."
report=scripts/report.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "report.sh: $*" >&2; exit 1; }
same() {  # NAME EXPECTED-FILE ACTUAL-FILE
  diff -u "$2" "$3" >&2 || fail "$1: output differs"
}

cat >"$work/rows.jsonl" <<'ROWS'
{"algo": "attention2d", "grid": "2x2", "layout": "cyclic", "fwd_ms": 12.345, "messages_fwd": 3, "max_rel_err": 1.5e-07}
not a row: skipped
{"algo": "ring", "grid": "1x4", "layout": "zigzag", "fwd_ms": 9.87, "messages_fwd": 4}
ROWS
python3 "$report" --rows "$work/rows.jsonl" --text --missing - --title "# two rows" \
  'algorithm=algo + (" " + grid if algo.startswith("attention2d") else ""):16' \
  'fwd ms=fwd_ms:8.1f' 'msgs=messages_fwd:5d' 'max err=max_rel_err:9.2e' >"$work/out"
cat >"$work/want" <<'WANT'
# two rows
algorithm          fwd ms  msgs   max err
attention2d 2x2      12.3     3  1.50e-07
ring                  9.9     4         -
WANT
same text "$work/want" "$work/out"

cat >"$work/kernel.jsonl" <<'ROWS'
{"mode": "backward", "d": 64, "gflops": 10.0}
{"mode": "forward", "d": 64, "gflops": 20.0}
{"mode": "forward", "d": 64, "gflops": 25.0}
{"mode": "forward", "d": 128, "gflops": 30.0}
{"mode": "backward", "d": 64, "gflops": 5.0, "skipped": "no"}
ROWS
python3 "$report" --rows "$work/kernel.jsonl" --best 'mode, d' --by gflops \
  --let 'other=lambda m: find(mode=m, d=d)' --where 'd == 64' --sort 'mode != "forward"' \
  pass=mode D=d 'GFLOP/s=gflops:.1f' 'note=skipped' 'fwd / this=other("forward")["gflops"] / gflops:.2f' \
  --summary '"\nbest: %.1f" % max(r["gflops"] for r in rows)' >"$work/out"
cat >"$work/want" <<'WANT'
| pass | D | GFLOP/s | note | fwd / this |
|---|---|---|---|---|
| forward | 64 | 25.0 | | 1.00 |
| backward | 64 | 10.0 | | 2.50 |

best: 30.0
WANT
same markdown "$work/want" "$work/out"

printf '# a calibration\nlatency_us = 12.5\nbandwidth_gbs=3 # per rank\n' >"$work/c1.txt"
printf 'latency_us = 7\nbandwidth_gbs = 0.25\n' >"$work/c2.txt"
python3 "$report" --kv "$work/c1.txt" --set P=4 --kv "$work/c2.txt" --set P=16 \
  P=P 'latency µs=latency_us:.1f' 'GB/s=bandwidth_gbs:.2f' >"$work/out"
cat >"$work/want" <<'WANT'
| P | latency µs | GB/s |
|---|---|---|
| 4 | 12.5 | 3.00 |
| 16 | 7.0 | 0.25 |
WANT
same kv "$work/want" "$work/out"

printf '{"a": 1, "source": "old"}\n' | python3 "$report" --rows - --set source=measured \
  --set "load=1.0 2.0" --json >"$work/out"
echo '{"a": 1, "source": "measured", "load": "1.0 2.0"}' >"$work/want"
same json "$work/want" "$work/out"

printf '{"ms": 3}\n{"ms": 1}\n{"ms": 2}\n' |
  python3 "$report" --rows - --summary '"%.1f" % median([r["ms"] for r in rows])' >"$work/out"
echo 2.0 >"$work/want"
same summary "$work/want" "$work/out"

refused() {  # WORDS ARGS...: exits 2 with WORDS on stderr, nothing on stdout
  local words=$1 status=0
  shift
  python3 "$report" "$@" >"$work/out" 2>"$work/err" || status=$?
  [ "$status" -eq 2 ] && grep -q "$words" "$work/err" && [ ! -s "$work/out" ] ||
    fail "report.py $* should be refused with '$words' (status $status): $(cat "$work/err")"
}
refused "no input" 'a=b'
refused "no columns" --rows "$work/rows.jsonl"
refused "go together" --rows "$work/rows.jsonl" --best algo a=algo
refused "NAME=EXPR" --rows "$work/rows.jsonl" --let '1x=2' a=algo
echo "report.sh: all cases pass"
