#!/usr/bin/env python3
"""Runs a command that prints JSON lines and checks that every line parses and has the keys.
A row that says why it was skipped ("skipped": reason) needs only "algo" besides.

usage: check_json.py KEY[,KEY...] [--at-most KEY=VALUE]... [--equals KEY=VALUE]... -- command args...

--at-most KEY=VALUE: every line's KEY must be a number <= VALUE.
--equals KEY=VALUE:  every line's KEY, printed as JSON (strings without quotes), must be VALUE.
"""
import json
import subprocess
import sys

separator = sys.argv.index("--")
keys = sys.argv[1].split(",")
conditions = []
args = sys.argv[2:separator]
while args:
    kind, pair = args[0], args[1]
    args = args[2:]
    if kind not in ("--at-most", "--equals"):
        sys.exit(f"check_json: unknown option {kind}")
    key, value = pair.split("=", 1)
    conditions.append((kind, key, value))
    keys.append(key)
command = sys.argv[separator + 1:]
result = subprocess.run(command, capture_output=True, text=True)
print(result.stdout, end="")
print(result.stderr, end="", file=sys.stderr)
if result.returncode != 0:
    sys.exit(f"check_json: exit code {result.returncode}")
lines = [line for line in result.stdout.splitlines() if line.strip()]
if not lines:
    sys.exit("check_json: no output")
for line in lines:
    row = json.loads(line)
    required = ["algo", "skipped"] if "skipped" in row else keys
    missing = [key for key in required if key not in row]
    if missing:
        sys.exit(f"check_json: missing keys {missing} in {line}")
    for kind, key, value in [] if "skipped" in row else conditions:
        got = row[key]
        if kind == "--at-most" and not (isinstance(got, (int, float)) and got <= float(value)):
            sys.exit(f"check_json: {key} = {got}, expected at most {value} in {line}")
        text = got if isinstance(got, str) else json.dumps(got)
        if kind == "--equals" and text != value:
            sys.exit(f"check_json: {key} = {text}, expected {value} in {line}")
print(f"check_json: {len(lines)} rows, keys present" +
      (f", {len(conditions)} conditions hold" if conditions else ""))
