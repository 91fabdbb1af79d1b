#!/usr/bin/env bash
# The slowest tests of a CTest log (the lines "N/M Test #K: name ....  Passed  S sec"), slowest
# first: scripts/dev/slowest_tests.sh LOG [COUNT], COUNT 10 unless given.
#
# Reads the whole sorted list rather than closing the pipe after COUNT lines: under pipefail a
# `sort | head` whose input is larger than a pipe's buffer (64 KiB; the suite's two passes log
# ~1100 tests) ends with sort killed by SIGPIPE and the script with exit 141.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 LOG [COUNT]" >&2
  exit 2
fi
log=$1
count=${2:-10}
[[ $count =~ ^[0-9]+$ ]] || { echo "$0: COUNT must be a whole number, not '$count'" >&2; exit 2; }
[ -r "$log" ] || { echo "$0: cannot read '$log'" >&2; exit 2; }
sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \(.*[^ .]\) *\.*  *Passed *\([0-9.]*\) sec$/\2 \1/p' "$log" |
  sort -rn |
  awk -v count="$count" 'NR <= count {printf "  %8.1f s  %s\n", $1, substr($0, index($0, " ") + 1)}'
