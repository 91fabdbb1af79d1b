#!/usr/bin/env bash
# Runs a command and checks its exit code and output.
#   expect.sh EXIT_CODE PATTERN -- command args...
# PATTERN is an extended regular expression that stdout+stderr must match ('' = anything).
set -uo pipefail
expected=$1
pattern=$2
shift 3
output=$("$@" 2>&1)
code=$?
printf '%s\n' "$output"
if [ "$code" -ne "$expected" ]; then
  echo "expect.sh: exit code $code, expected $expected: $*" >&2
  exit 1
fi
if [ -n "$pattern" ] && ! grep -Eq -- "$pattern" <<<"$output"; then
  echo "expect.sh: output does not match /$pattern/: $*" >&2
  exit 1
fi
