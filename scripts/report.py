#!/usr/bin/env python3
"""Tables of result rows, for the measurement scripts (scripts/bench/, scripts/sim/): one tool in
place of an inline Python table in each.

    scripts/report.py [INPUTS] [STEPS] [OUTPUT OPTIONS] COLUMN...

Inputs (in order; at least one):
  --rows FILE        JSON objects, one per line (`a2d bench --json`, `a2d kernel --json`); lines
                     that do not start with "{" are skipped. "-" reads standard input.
  --kv FILE          a `key = value` file (a calibration or machine file) as one row; "#" starts
                     a comment; the values are numbers where they read as numbers.
  --set NAME=VALUE   a field (a string) added to every row of the input named just before
                     (before any input: to every row).
Names:
  --let NAME=EXPR    NAME is EXPR in every expression after it (evaluated per row, so a lambda
                     sees the row's fields; repeatable)
Steps, in this order:
  --best KEY --by VALUE   per KEY (an expression), only the row with the largest VALUE (the first
                          on ties), at the place of the key's first row
  --where EXPR            only the rows where EXPR is true
  --sort EXPR             rows in the order of EXPR (stable)
Output:
  COLUMN             TITLE=EXPR[:SPEC]: EXPR an expression over a row, SPEC a format spec
                     (".1f", "9.2e", "24"); a string value is written as it is. Without
                     columns only the --summary lines are written.
  --markdown         a Markdown table (the default)
  --text             columns padded to the specs' widths, numbers right-aligned, one space apart
  --json             the rows as JSON objects, one per line (no columns)
  --title TEXT       a line before the table (repeatable)
  --summary EXPR     text after the table (repeatable; None writes nothing)
  --missing TEXT     a cell whose expression names a field the row lacks (default: empty)

Expressions are Python, with the row's fields as names and `row` (the row), `rows` (the rows
after --best), `find(**fields)` (the first of those rows with these fields, or None), `median`,
`math` and `statistics`. A table script is then its loop of measurements and one call, e.g.

    scripts/report.py --rows rows.jsonl --text 'algorithm=algo:24' 'fwd ms=fwd_ms:9.1f'
"""

import argparse
import json
import math
import re
import statistics
import sys


def number(text):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def read_rows(path):
    with (sys.stdin if path == "-" else open(path)) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def read_kv(path):
    row = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0]
            if "=" in line:
                key, value = line.split("=", 1)
                row[key.strip()] = number(value.strip())
    return [row]


class Inputs(argparse.Action):
    """--rows, --kv and --set in the order given."""

    def __call__(self, parser, namespace, value, option):
        namespace.inputs = (namespace.inputs or []) + [(option, value)]


def load(inputs):
    rows, common, last = [], {}, None
    for option, value in inputs:
        if option == "--set":
            name, _, text = value.partition("=")
            if not name:
                raise SystemExit("report.py: --set NAME=VALUE, got %r" % value)
            for row in (last if last is not None else []):
                row[name] = text
            if last is None:
                common[name] = text
            continue
        last = read_rows(value) if option == "--rows" else read_kv(value)
        for row in last:
            for name, text in common.items():
                row[name] = text
        rows += last
    return rows


def column(spec):
    match = re.fullmatch(r"([^=]+)=(.+?)(?::([<>^]?\d*(?:\.\d+)?[a-z%]?))?", spec, re.S)
    if not match:
        raise SystemExit("report.py: a column is TITLE=EXPR[:SPEC], got %r" % spec)
    title, expr, fmt = match.groups()
    return title, compile(expr, spec, "eval"), fmt or ""


class Table:
    def __init__(self, rows, lets=()):
        self.rows = rows
        self.lets = lets

    def find(self, **fields):
        return next((r for r in self.rows if all(r.get(k) == v for k, v in fields.items())),
                    None)

    def scope(self, row=None):
        names = {"rows": self.rows, "find": self.find, "median": statistics.median,
                 "math": math, "statistics": statistics, "row": row}
        if row is not None:
            names.update(row)
        return names

    def value(self, code, row=None):
        names = self.scope(row)  # globals: comprehensions in the expression see them too
        names["__builtins__"] = __builtins__
        for name, let in self.lets:
            names[name] = eval(let, names)
        return eval(code, names)


def cell(value, fmt, text, missing):
    """The cell's text: formatted with its spec, strings as they are (padded in --text)."""
    width = re.match(r"[<>^]?(\d*)", fmt).group(1)
    align = fmt[0] if fmt[:1] in "<>^" and fmt else ""
    if value is None:
        value = missing
    if isinstance(value, str):
        if not text:
            return value
        return format(value, (align or (">" if value == missing and missing else "<")) + width)
    return format(value, fmt)


def header(title, fmt, sample):
    width = re.match(r"[<>^]?(\d*)", fmt).group(1)
    align = fmt[0] if fmt[:1] in "<>^" and fmt else ""
    if not align:
        numeric = re.search(r"[bdeEfFgGn%]$", fmt) or (
            isinstance(sample, (int, float)) and not isinstance(sample, bool))
        align = ">" if numeric else "<"
    return format(title, align + width)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="report.py", add_help=True,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description=__doc__.split("\n\n")[0])
    parser.set_defaults(inputs=None)
    for option in ("--rows", "--kv", "--set"):
        parser.add_argument(option, action=Inputs, metavar="ARG")
    parser.add_argument("--let", action="append", default=[])
    parser.add_argument("--best")
    parser.add_argument("--by")
    parser.add_argument("--where", action="append", default=[])
    parser.add_argument("--sort")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--markdown", dest="form", action="store_const", const="markdown")
    form.add_argument("--text", dest="form", action="store_const", const="text")
    form.add_argument("--json", dest="form", action="store_const", const="json")
    parser.add_argument("--title", action="append", default=[])
    parser.add_argument("--summary", action="append", default=[])
    parser.add_argument("--missing", default="")
    parser.add_argument("columns", nargs="*")
    args = parser.parse_args(argv)
    if not args.inputs or not any(o != "--set" for o, _ in args.inputs):
        parser.error("no input: --rows FILE or --kv FILE")
    if bool(args.best) != bool(args.by):
        parser.error("--best KEY and --by VALUE go together")
    form = args.form or "markdown"
    if form != "json" and not args.columns and not args.summary:
        parser.error("no columns (TITLE=EXPR[:SPEC]) and no --summary")
    columns = [column(c) for c in args.columns]

    lets = []
    for let in args.let:
        name, _, expr = let.partition("=")
        if not name.isidentifier() or not expr:
            parser.error("--let NAME=EXPR, got %r" % let)
        lets.append((name, compile(expr, "--let", "eval")))
    table = Table(load(args.inputs), lets)
    if args.best:
        key, by = compile(args.best, "--best", "eval"), compile(args.by, "--by", "eval")
        best = {}
        for row in table.rows:
            k = table.value(key, row)
            if k not in best or table.value(by, row) > table.value(by, best[k]):
                best[k] = row
        table.rows = list(best.values())
    shown = table.rows
    for where in args.where:
        code = compile(where, "--where", "eval")
        shown = [r for r in shown if table.value(code, r)]
    if args.sort:
        code = compile(args.sort, "--sort", "eval")
        shown = sorted(shown, key=lambda r: table.value(code, r))

    for title in args.title:
        print(title)
    if form == "json":
        for row in shown:
            print(json.dumps(row))
    elif columns:
        cells = []
        for row in shown:
            values = []
            for _, code, _ in columns:
                try:
                    values.append(table.value(code, row))
                except NameError:  # a field this row lacks
                    values.append(None)
            cells.append(values)
        samples = [next((v for v in col if v is not None), None) for col in zip(*cells)] or \
            [None] * len(columns)
        heads = [header(title, fmt, sample) if form == "text" else title
                 for (title, _, fmt), sample in zip(columns, samples)]
        text = form == "text"
        lines = [[cell(v, fmt, text, args.missing) for v, (_, _, fmt) in zip(values, columns)]
                 for values in cells]
        if text:
            print(" ".join(heads))
            for line in lines:
                print(" ".join(line))
        else:
            for line in [heads, None] + lines:
                print("|---" * len(heads) + "|" if line is None else
                      "|" + "|".join(" %s " % c if c else " " for c in line) + "|")
    for summary in args.summary:
        value = table.value(compile(summary, "--summary", "eval"))
        if value is not None:
            print(value)


if __name__ == "__main__":
    main()
