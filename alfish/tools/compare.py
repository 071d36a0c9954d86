"""A table of alfish runs from their eval_log.jsonl: final and best evaluation return, env steps to reach a
threshold, env steps per second, wall-clock.

    python -m alfish.tools.compare runs/sac-s1 runs/td3-s1 --threshold -200
    python -m alfish.tools.compare --run sac='runs/sac-*' --run td3='runs/td3-*' --threshold -200 --format markdown
    python -m alfish.tools.compare runs/peer/td3_hopper/alfish/seed-0 runs/peer/td3_hopper/sb3/seed-0 --mean_from 150000

A row is a results directory named on its own, or a --run LABEL=DIR[,DIR...] group (its seeds; a DIR may be a quoted
glob pattern). A row's returns are read from its mean curve: the runs' evaluations interpolated onto the env steps
where all of them have data and averaged at each (for a single run: its own evaluations). Columns:

  runs          how many runs the row averages
  env steps     the mean curve's last env steps, where 'final' is read
  final         the mean curve's last return
  best, at      its highest return, and the env steps where that is first reached
  to >= T       the first env steps at which the mean curve reaches --threshold T ('-' if it never does)
  mean >= S     the mean of the mean curve's returns at env steps >= --mean_from S ('-' if it has none there): a
                late-run level less noisy than 'final', whose single evaluation can swing by a policy's luck
  steps/s       each run's env steps at its last evaluation over its wall-clock there (start-up and evaluation time
                included), averaged over the runs
  wall-clock s  each run's wall-clock seconds at its last evaluation (elapsed_s; the earlier parts of a resumed run
                included), averaged over the runs

--format text (aligned columns; the default), csv, markdown or json (numbers unrounded, null where text says '-').
Reads JSON only from the results directories. Exit status: 0, or 2 with one error line.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import sys
from typing import Optional, Sequence

import numpy as np

from alfish.tools.cli import ToolError, report
from alfish.tools.runs import Group, groups_from_args, read_group, tool_parser
from alfish.tools.stats import align

FORMATS = ("text", "csv", "markdown", "json")


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the table (see the module docstring); ``to_threshold`` and ``steps_per_s`` are None where the
    table says '-'."""

    label: str
    runs: int
    env_steps: float
    final: float
    best: float
    best_at: float
    to_threshold: Optional[float]
    steps_per_s: Optional[float]
    wall_clock_s: float
    mean_from: Optional[float] = None  # the 'mean >= S' column's value (None: not asked, or no evaluation there)


def summarize(group: Group, threshold: Optional[float] = None, field: str = "average_return",
              mean_from: Optional[float] = None) -> Row:
    """``group``'s row, from the eval logs' ``field`` (see the module docstring); ``mean_from`` in env steps."""
    curves = read_group(group, "env_steps", field=field)
    clocks = read_group(group, "wall_clock", field=field)  # the same evaluations, against elapsed_s
    try:
        x, values = align([c.x for c in curves], [c.y for c in curves])
    except ValueError as err:
        raise ToolError(f"{group.label}: {err}") from None
    mean = values.mean(axis=0)
    best = int(np.argmax(mean))  # the first of equal maxima: where the best return is first reached
    reached = np.flatnonzero(mean >= threshold) if threshold is not None else []
    rates = [c.x[-1] / t.x[-1] for c, t in zip(curves, clocks) if t.x[-1] > 0]
    late = mean[x >= mean_from] if mean_from is not None else []
    return Row(label=group.label, runs=len(curves), env_steps=float(x[-1]), final=float(mean[-1]),
               best=float(mean[best]), best_at=float(x[best]),
               to_threshold=float(x[reached[0]]) if len(reached) else None,
               mean_from=float(np.mean(late)) if len(late) else None,
               steps_per_s=float(np.mean(rates)) if len(rates) == len(curves) else None,
               wall_clock_s=float(np.mean([t.x[-1] for t in clocks])))


def header(threshold: Optional[float], mean_from: Optional[float] = None) -> list[str]:
    names = ["run", "runs", "env steps", "final", "best", "at"]
    if threshold is not None:
        names.append(f"to >= {threshold:g}")
    if mean_from is not None:
        names.append(f"mean >= {mean_from:g}")
    return names + ["steps/s", "wall-clock s"]


def cells(row: Row, threshold: Optional[float], mean_from: Optional[float] = None) -> list[str]:
    """``row`` as text: returns to 2 decimals, env steps whole, rates and seconds to 1 decimal, '-' for never."""
    def steps(value: Optional[float]) -> str:
        return "-" if value is None else f"{value:.0f}"

    out = [row.label, str(row.runs), steps(row.env_steps), f"{row.final:.2f}", f"{row.best:.2f}", steps(row.best_at)]
    if threshold is not None:
        out.append(steps(row.to_threshold))
    if mean_from is not None:
        out.append("-" if row.mean_from is None else f"{row.mean_from:.2f}")
    return out + ["-" if row.steps_per_s is None else f"{row.steps_per_s:.1f}", f"{row.wall_clock_s:.1f}"]


def record(row: Row, threshold: Optional[float], mean_from: Optional[float] = None) -> dict:
    """``row`` as JSON-ready numbers (None where the text says '-')."""
    out = dict(run=row.label, runs=row.runs, env_steps=row.env_steps, final=row.final, best=row.best,
               best_at_env_steps=row.best_at)
    if threshold is not None:
        out.update(threshold=threshold, env_steps_to_threshold=row.to_threshold)
    if mean_from is not None:
        out.update(mean_from_env_steps=mean_from, mean_return_from=row.mean_from)
    return {**out, "env_steps_per_s": row.steps_per_s, "wall_clock_s": row.wall_clock_s}


def format_table(rows: Sequence[Row], fmt: str, threshold: Optional[float] = None,
                 mean_from: Optional[float] = None) -> str:
    """The table in ``fmt`` (one of ``FORMATS``), ending with a newline."""
    if fmt == "json":
        return json.dumps([record(r, threshold, mean_from) for r in rows], indent=1) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(record(rows[0], threshold, mean_from).keys() if rows else header(threshold, mean_from))
        writer.writerows(["-" if v is None else v for v in record(r, threshold, mean_from).values()] for r in rows)
        return out.getvalue()
    return render_table([header(threshold, mean_from)] + [cells(r, threshold, mean_from) for r in rows], fmt)


def render_table(table: list[list[str]], fmt: str) -> str:
    """A header row and rows of text cells as ``'csv'``, ``'markdown'`` or aligned text (any other ``fmt``): the
    first column left-aligned, the others right-aligned so that the digits of numbers line up."""
    if fmt == "csv":
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(table)
        return out.getvalue()
    if fmt == "markdown":
        lines = ["| " + " | ".join(line) + " |" for line in table]
        lines.insert(1, "|" + "|".join(["---"] + ["---:"] * (len(table[0]) - 1)) + "|")
        return "\n".join(lines) + "\n"
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    return "".join("  ".join([line[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(line[1:], widths[1:])])
                   .rstrip() + "\n" for line in table)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = tool_parser("compare", __doc__, ": one row each", "a group of runs (seeds): one row")
    parser.add_argument("--threshold", type=float, default=None, help="a return to reach (adds the 'to >= T' column)")
    parser.add_argument("--mean_from", type=float, default=None, metavar="ENV_STEPS",
                        help="adds the 'mean >= S' column: the mean return over the evaluations from these env steps")
    parser.add_argument("--field", default="average_return", help="the eval log's number to compare")
    parser.add_argument("--format", default="text", choices=FORMATS)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        rows = [summarize(group, args.threshold, args.field, args.mean_from)
                for group in groups_from_args(args.run, args.dirs)]
    except ToolError as err:
        return report(err)
    sys.stdout.write(format_table(rows, args.format, args.threshold, args.mean_from))
    return 0


if __name__ == "__main__":
    sys.exit(main())
