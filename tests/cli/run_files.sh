#!/usr/bin/env bash
# a2d run with .npy inputs and outputs: sizes from the files, outputs in global order that do not
# depend on the number of ranks, no overwriting without --force, clear errors for bad files.
#   run_files.sh A2D_BINARY MPIEXEC
set -euo pipefail
a2d=$1
mpiexec=$2
here=$(cd "$(dirname "$0")" && pwd)
tool="python3 $here/npy_tool.py"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { "$mpiexec" --oversubscribe -np "$1" "$a2d" run "${@:2}"; }
fail() { echo "run_files.sh: $*" >&2; exit 1; }

# Mixed dtypes on purpose: float32 Q and dO, float64 K and V. B=2, N=37, H=4, Hkv=2, D=16.
$tool make "$work/q.npy" f4 1 2 37 4 16
$tool make "$work/k.npy" f8 2 2 37 2 16
$tool make "$work/v.npy" f8 3 2 37 2 16
$tool make "$work/do.npy" f4 4 2 37 4 16
inputs=(--q "$work/q.npy" --k "$work/k.npy" --v "$work/v.npy" --do "$work/do.npy" --backward)

run 3 "${inputs[@]}" --causal --check --out "$work/p3" || fail "3-rank run failed"
run 1 "${inputs[@]}" --causal --out "$work/p1" || fail "1-rank run failed"
run 4 "${inputs[@]}" --causal --algo attention2d-overlap --grid 2x2 --check --out "$work/p4" ||
  fail "4-rank overlapped run failed"
# The baselines read the same files and must write the same outputs (docs/baselines.md).
once=(--warmup 0 --iters 1)
run 3 "${inputs[@]}" "${once[@]}" --causal --algo ring --check --out "$work/ring3" ||
  fail "3-rank ring run failed"
run 4 "${inputs[@]}" "${once[@]}" --causal --algo allgather-kv --layout striped --stripe 2 --check \
  --out "$work/allgather4" || fail "4-rank allgather-kv run failed"
run 2 "${inputs[@]}" "${once[@]}" --causal --algo ulysses --check --out "$work/ulysses2" ||
  fail "2-rank ulysses run failed"
[ "$($tool shape "$work/p3/o.npy")" = 2x37x4x16 ] || fail "o.npy has the wrong shape"
[ "$($tool shape "$work/p3/lse.npy")" = 2x4x37 ] || fail "lse.npy has the wrong shape"
[ "$($tool shape "$work/p3/dk.npy")" = 2x37x2x16 ] || fail "dk.npy has the wrong shape"
for f in o lse dq dk dv; do
  $tool compare "$work/p3/$f.npy" "$work/p1/$f.npy" 1e-5 || fail "$f differs between 3 and 1 ranks"
  $tool compare "$work/p4/$f.npy" "$work/p1/$f.npy" 1e-5 || fail "$f differs between 4 and 1 ranks"
  for algo in ring3 allgather4 ulysses2; do
    $tool compare "$work/$algo/$f.npy" "$work/p1/$f.npy" 1e-5 || fail "$f of $algo differs from 1 rank"
  done
done

# 16 bits. bf16 from float32/64 files (rounded as they are read), outputs written as float32:
# within the bf16 bound of the fp32 outputs, on 3 ranks as on 1. fp16 from float16 files, outputs
# written as float16 where asked (their values are fp16 values); LSE stays float32.
run 3 "${inputs[@]}" --causal --dtype bf16 --check --out "$work/bf16_3" || fail "bf16 run failed"
run 1 "${inputs[@]}" --causal --dtype bf16 --out "$work/bf16_1" "${once[@]}" || fail "bf16 1-rank failed"
for f in o lse dq dk dv; do
  [ "$($tool dtype "$work/bf16_3/$f.npy")" = f4 ] || fail "bf16 $f.npy is not float32"
  $tool compare "$work/bf16_3/$f.npy" "$work/p1/$f.npy" 4e-2 || fail "bf16 $f far from fp32"
  $tool compare "$work/bf16_3/$f.npy" "$work/bf16_1/$f.npy" 4e-3 || fail "bf16 $f differs by ranks"
done
$tool make "$work/q16.npy" f2 1 2 37 4 16
$tool make "$work/k16.npy" f2 2 2 37 2 16
$tool make "$work/v16.npy" f2 3 2 37 2 16
$tool make "$work/do16.npy" f2 4 2 37 4 16
half=(--q "$work/q16.npy" --k "$work/k16.npy" --v "$work/v16.npy" --do "$work/do16.npy" --backward)
run 4 "${half[@]}" --causal --dtype fp16 --check --out "$work/fp16_4" --out-dtype float16 ||
  fail "fp16 run with float16 files failed"
for f in o dq dk dv; do
  [ "$($tool dtype "$work/fp16_4/$f.npy")" = f2 ] || fail "fp16 $f.npy is not float16"
done
[ "$($tool dtype "$work/fp16_4/lse.npy")" = f4 ] || fail "fp16 lse.npy is not float32"
if out=$(run 2 "${inputs[@]}" --dtype bf16 --out "$work/refused" --out-dtype float16 2>&1); then
  fail "wrote bf16 outputs as float16"
fi
[ "$(echo "$out" | grep -c 'it would round them again.*(on every rank)')" = 1 ] ||
  fail "--out-dtype float16 with bf16 not refused once, for every rank: $out"
[ ! -e "$work/refused/o.npy" ] || fail "a refused run wrote o.npy"

# Existing outputs are not overwritten without --force, and nothing is touched.
before=$(md5sum "$work/p3/o.npy")
if out=$(run 2 "${inputs[@]}" --out "$work/p3" 2>&1); then fail "overwrote without --force"; fi
grep -q "already exists; pass --force" <<<"$out" || fail "no clear message: $out"
[ "$(md5sum "$work/p3/o.npy")" = "$before" ] || fail "o.npy changed without --force"
run 2 "${inputs[@]}" --out "$work/p3" --force >/dev/null || fail "--force did not overwrite"

# Bad inputs: a clear error on every rank, exit code 2, no hang.
$tool make "$work/k_bad.npy" f4 5 2 37 2 8
if out=$(run 3 --q "$work/q.npy" --k "$work/k_bad.npy" --v "$work/v.npy" 2>&1); then fail "accepted a mismatched K"; fi
[ "$(echo "$out" | grep -c 'has shape \[2, 37, 2, 8\] but \[2, 37, 2, 16\] is required')" = 1 ] ||
  fail "mismatched K not reported exactly once: $out"
grep -q '\.cpp:' <<<"$out" && fail "source location without --verbose: $out"
if out=$(run 3 --q "$work/q.npy" --k "$work/k_bad.npy" --v "$work/v.npy" --verbose 2>&1); then fail "accepted a mismatched K"; fi
[ "$(echo "$out" | grep -c 'src/.*\.cpp:[0-9]*): .*has shape \[2, 37, 2, 8\]')" = 3 ] ||
  fail "--verbose: not every rank's report with its source line: $out"
echo "not numpy" > "$work/junk.npy"
if out=$(run 2 --q "$work/junk.npy" --k "$work/k.npy" --v "$work/v.npy" 2>&1); then fail "read a junk file"; fi
grep -q "bad magic" <<<"$out" || fail "junk file not reported: $out"
if out=$(run 2 "${inputs[@]}" --seq 100 2>&1); then fail "accepted --seq with files"; fi
grep -q "conflicts with --q" <<<"$out" || fail "conflict not reported: $out"
if out=$(run 2 "${inputs[@]}" --out /proc/a2d-cannot-write 2>&1); then fail "wrote into /proc"; fi
grep -q -- "--out /proc/a2d-cannot-write: cannot create the directory /proc/a2d-cannot-write" <<<"$out" ||
  fail "unwritable dir not reported: $out"
# Ulysses with K/V heads the ranks do not divide (2 heads, 3 ranks): refused on every rank.
if out=$(run 3 "${inputs[@]}" --algo ulysses 2>&1); then fail "ulysses accepted 2 K/V heads on 3 ranks"; fi
[ "$(echo "$out" | grep -c 'the number of ranks (3) must divide the number of K/V heads (2).*(on every rank)')" = 1 ] ||
  fail "ulysses refusal not reported once, for every rank: $out"
# Packed documents, sinks read from --sink and softcap: dsink.npy [heads] written with the other
# gradients, the same on 3 ranks (ATTENTION2D) as on 1 and with Ring.
$tool make "$work/sink.npy" f4 6 4
masked=("${inputs[@]}" "${once[@]}" --causal --doc-lens 1,20,1,9,6 --sink "$work/sink.npy"
  --softcap 2.5)
run 3 "${masked[@]}" --check --out "$work/m3" || fail "3-rank document/sink run failed"
run 1 "${masked[@]}" --out "$work/m1" || fail "1-rank document/sink run failed"
run 2 "${masked[@]}" --algo ring --check --out "$work/mring" || fail "ring document/sink run failed"
[ "$($tool shape "$work/m3/dsink.npy")" = 4 ] || fail "dsink.npy has the wrong shape"
for f in o lse dq dk dv dsink; do
  $tool compare "$work/m3/$f.npy" "$work/m1/$f.npy" 1e-5 || fail "$f differs between 3 and 1 ranks"
  $tool compare "$work/mring/$f.npy" "$work/m1/$f.npy" 1e-5 || fail "$f differs (ring)"
done
$tool make "$work/sink_bad.npy" f4 6 3
if out=$(run 2 "${inputs[@]}" --sink "$work/sink_bad.npy" 2>&1); then fail "accepted 3 sinks for 4 heads"; fi
grep -q "has shape \[3\] but \[4\] is required" <<<"$out" || fail "bad sink file not reported: $out"
if out=$(run 2 "${inputs[@]}" --doc-lens 30,6 2>&1); then fail "accepted lengths summing to 36"; fi
[ "$(echo "$out" | grep -c 'document lengths sum to 36 tokens, but the sequence has 37')" = 1 ] ||
  fail "bad document lengths not reported once: $out"
echo "run_files.sh: all checks passed"
