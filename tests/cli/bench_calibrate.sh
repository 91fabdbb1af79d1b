#!/usr/bin/env bash
# a2d calibrate writes a calibration section per rank count; a2d bench runs every algorithm and
# grid with the model's prediction beside each row, as a table, JSON and CSV; a2d model reads the
# calibration; --plot draws an SVG.
#   bench_calibrate.sh A2D_BINARY MPIEXEC
set -euo pipefail
a2d=$1
mpiexec=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "bench_calibrate.sh: $*" >&2; exit 1; }
cal="$work/calibration.txt"

"$mpiexec" --oversubscribe -np 4 "$a2d" calibrate --out "$cal" --block 256 --iters 1 --kernel-seconds 0 >/dev/null
"$mpiexec" --oversubscribe -np 2 "$a2d" calibrate --out "$cal" --block 256 --iters 1 --kernel-seconds 0.2 >/dev/null
if "$mpiexec" --oversubscribe -np 2 "$a2d" calibrate --out "$work/bad.txt" --kernel-seconds -1 2>"$work/bad.err"; then
  fail "a negative --kernel-seconds was accepted"
fi
grep -q "timed region >= 0 seconds" "$work/bad.err" || fail "--kernel-seconds -1 not explained: $(cat "$work/bad.err")"
[ ! -e "$work/bad.txt" ] || fail "a refused calibration wrote its file"
grep -q '^\[ranks 4\]' "$cal" && grep -q '^\[ranks 2\]' "$cal" || fail "calibration sections missing"
for key in kernel_forward_causal_gflops kernel_backward_causal_gflops wait_share sum_gbs merge_gbs; do
  [ "$(grep -c "^$key = " "$cal")" -eq 2 ] || fail "calibration lacks $key in a section"
done

problem=(--seq 300 --heads 4 --kv-heads 2 --head-dim 32 --causal --backward --iters 1 --warmup 0)
python3 "$here/check_json.py" \
  algo,grid,ranks,fwd_ms,bwd_ms,pred_fwd_ms,pred_bwd_ms,bytes_sent_fwd,bytes_sent_bwd,messages_fwd,messages_bwd,peak_mem_bytes \
  -- "$mpiexec" --oversubscribe -np 4 "$a2d" bench "${problem[@]}" --calibration "$cal" --check --json \
  > "$work/bench.json" || fail "bench --json"
# Every algorithm of the table by default: 3 ATTENTION2D grids x 2 variants + ring + allgather-kv
# + the hybrid (U = 2 on 1x2 and 2x1, U = 4 on 1x1); ulysses skipped (4 ranks do not divide 2 K/V
# heads).
[ "$(grep -c '"fwd_ms"' "$work/bench.json")" -eq 11 ] || fail "expected 11 measured rows"
[ "$(grep -c '"algo": "hybrid"' "$work/bench.json")" -eq 3 ] || fail "expected 3 hybrid rows"
grep -q '"skipped": "ulysses shards the heads' "$work/bench.json" || fail "ulysses not skipped with its reason"
grep -q '"pass": false' "$work/bench.json" && fail "a row failed --check"
# Rows timed one after another instead of round-robin: the same rows, each still checked.
"$mpiexec" --oversubscribe -np 3 "$a2d" bench "${problem[@]}" --calibration "$cal" --check --json \
  --sequential --algo attention2d,ring > "$work/sequential.json" || fail "bench --sequential"
[ "$(grep -c '"fwd_ms"' "$work/sequential.json")" -eq 3 ] || fail "--sequential: expected 3 rows (1x3, 3x1, ring)"
grep -q '"pass": false' "$work/sequential.json" && fail "a --sequential row failed --check"
# Where the time went: measured and predicted milliseconds per phase, on every measured row.
for key in '"ms.forward.kernel"' '"ms.backward.kernel"' '"pred_ms.forward.kernel"' '"pred_ms.backward.kernel"'; do
  [ "$(grep -c "$key" "$work/bench.json")" -eq 11 ] || fail "phase times: $key not on every row"
done
grep -q '"ms.forward.kv_allgather"' "$work/bench.json" || fail "no communication phase time"
"$mpiexec" --oversubscribe -np 2 "$a2d" bench "${problem[@]}" --calibration "$cal" --csv --algo ring,attention2d \
  > "$work/bench.csv"
grep -q '^algo,grid,layout' <<<"$(head -1 "$work/bench.csv")" || fail "CSV header"
# --calibrate measures the machine in the same run and saves it before the rows are predicted.
"$mpiexec" --oversubscribe -np 2 "$a2d" bench "${problem[@]}" --calibration "$work/inline.txt" --calibrate \
  --json --algo ring > "$work/inline.json" || fail "bench --calibrate"
grep -q '^\[ranks 2\]' "$work/inline.txt" && grep -q '^head_dim = 32$' "$work/inline.txt" ||
  fail "bench --calibrate did not save a calibration at the problem's head dim"
grep -q '"pred_fwd_ms": [0-9]' "$work/inline.json" || fail "bench --calibrate rows lack predictions"
# The kernel's timings between the rows (after each row with --sequential), or not at all.
for mode in --sequential --no-resample-kernel; do
  rm -f "$work/inline.txt"
  "$mpiexec" --oversubscribe -np 2 "$a2d" bench "${problem[@]}" --calibration "$work/inline.txt" --calibrate \
    --json --algo ring,attention2d "$mode" > "$work/inline.json" || fail "bench --calibrate $mode"
  [ "$(grep -c '"pred_fwd_ms": [0-9]' "$work/inline.json")" -eq 3 ] || fail "bench --calibrate $mode: rows lack predictions"
  grep -q '^kernel_forward_causal_gflops = [0-9]' "$work/inline.txt" || fail "bench --calibrate $mode: no kernel rate saved"
done
if "$mpiexec" --oversubscribe -np 2 "$a2d" bench "${problem[@]}" --algo ring --no-resample-kernel 2>"$work/bad.err"; then
  fail "--no-resample-kernel without --calibrate was accepted"
fi
grep -q "needs --calibrate" "$work/bad.err" || fail "--no-resample-kernel refusal not explained: $(cat "$work/bad.err")"
[ "$(wc -l < "$work/bench.csv")" -eq 4 ] || fail "CSV rows"
out=$("$mpiexec" --oversubscribe -np 2 "$a2d" bench "${problem[@]}" --calibration "$cal") || fail "bench table: exit $?"
grep -q "measured / predicted" <<<"$out" || fail "bench table"

out=$("$a2d" model --machine local --calibration "$cal" --gpus 4 --seq 4096 --heads 8 --head-dim 64 --causal) ||
  fail "model --machine local: exit $?"
grep -q "calibrated at 4 ranks" <<<"$out" || fail "model --machine local"
if out=$("$a2d" model --machine local --calibration "$cal" --gpus 9 --seq 4096 2>&1); then fail "no calibration for 9"; fi
grep -q "mpirun -np 9 a2d calibrate" <<<"$out" || fail "missing calibration not explained: $out"
"$a2d" model --machine a100-hdr --gpus 16 --gpus-per-node 4 --seq 8192 --heads 16 --head-dim 96 --causal \
  --plot "$work/p.svg" >/dev/null
grep -q "<svg" "$work/p.svg" || fail "no SVG written"
"$a2d" model --machine h100-ndr --gpus 64 --gpus-per-node 1 --seq 32768 --heads 32 --head-dim 80 --causal \
  --plot "$work/n.png" --plot-x seq >/dev/null
[ -s "$work/n.png" ] || fail "no PNG written"
echo "bench_calibrate.sh: all checks passed"
