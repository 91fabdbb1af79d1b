#!/usr/bin/env python3
"""Checks the help of every a2d subcommand (and of `model --decode`, `bench --decode`):

  - no line is longer than 100 characters;
  - under "options:", every line is an option ("  --name ...") or a continuation indented to the
    help column (24 spaces), never at column 0 or elsewhere;
  - every option is listed once, and its help says "default" at most once;
  - every --option the text names (outside `backquoted` commands of other subcommands) is one the
    subcommand takes;
  - no "1 ranks", "1 nodes", ... .

    check_help.py A2D_BINARY
Exits 1 naming every violation.
"""
import re
import subprocess
import sys

WIDTH = 100
COLUMN = 24


def help_of(a2d, args):
    out = subprocess.run([a2d] + args + ["--help"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("%s %s --help exited %d: %s" % (a2d, " ".join(args), out.returncode,
                                                          out.stderr))
    return out.stdout


def subcommands(a2d):
    text = subprocess.run([a2d, "--help"], capture_output=True, text=True).stdout
    names = []
    in_list = False
    for line in text.splitlines():
        if line.startswith("subcommands:"):
            in_list = True
            continue
        if in_list:
            match = re.match(r"  (\S+)\s", line)
            if not match:
                break
            names.append(match.group(1))
    return names


def check(name, text):
    problems = []
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if len(line) > WIDTH:
            problems.append("line %d is %d characters (> %d)" % (number, len(line), WIDTH))
        for word in re.findall(r"\b1 (ranks|nodes|GPUs|cores|tokens|plans|heads)\b", line):
            problems.append("line %d: '1 %s'" % (number, word))
    try:
        start = lines.index("options:")
    except ValueError:
        return problems + ["no 'options:' section"]
    options = {}  # name -> help text
    current = None
    for number, line in enumerate(lines[start + 1:], start + 2):
        option = re.match(r"  (--[a-z0-9-]+)( VALUE)?( +|$)(.*)", line)
        if option:
            current = option.group(1)
            if current in options:
                problems.append("%s is listed twice" % current)
            options[current] = option.group(4)
            continue
        if re.match(" {%d}\\S" % COLUMN, line) and current:
            options[current] += " " + line.strip()
            continue
        problems.append("line %d is neither an option nor indented to column %d: %r" %
                        (number, COLUMN, line))
    for option, help_text in options.items():
        count = len(re.findall(r"\bdefault\b", help_text, re.IGNORECASE))
        if count > 1:
            problems.append("%s says 'default' %d times: %s" % (option, count, help_text))
    # Options named in the text: the subcommand's own, unless quoted as another command.
    unquoted = re.sub(r"`[^`]*`", "", text)
    for named in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", unquoted))):
        if named not in options:
            problems.append("names %s, which it does not take" % named)
    return problems


def main():
    a2d = sys.argv[1]
    commands = [[name] for name in subcommands(a2d) if name != "info"]
    commands += [["model", "--decode"]]
    if ["bench"] in commands:
        commands += [["bench", "--decode"]]
    failed = 0
    for args in commands:
        problems = check(" ".join(args), help_of(a2d, args))
        for problem in problems:
            print("a2d %s --help: %s" % (" ".join(args), problem))
        failed += len(problems)
        if not problems:
            print("a2d %s --help: ok" % " ".join(args))
    if failed:
        print("check_help.py: %d problems" % failed)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
