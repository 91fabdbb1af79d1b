#!/usr/bin/env python3
"""Runs a command that prints JSON lines and checks that every line parses and has the keys.
A row that says why it was skipped ("skipped": reason) needs only "algo" besides.

usage: check_json.py KEY[,KEY...] -- command args...
"""
import json
import subprocess
import sys

keys = sys.argv[1].split(",")
command = sys.argv[sys.argv.index("--") + 1:]
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
print(f"check_json: {len(lines)} rows, keys present")
