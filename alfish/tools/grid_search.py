"""Grid search (ALF's): train a conf at every point of a grid of gin bindings, for several seeds, in parallel
processes, one results directory per point and seed; then print a table of the points (``compare``'s columns).

    python -m alfish.tools.grid_search --conf confs/ppo_cartpole.gin --root_dir runs/grid \\
        --grid 'PpoAlgorithm.lr=[1e-3, 3e-4]' --grid 'PpoAlgorithm.clip_range=[0.1, 0.2]' \\
        [--seeds 2] [--parallel 2] [--threads_per_run 1] [--threshold 475] [--conf_param 'X.y=1' ...]
    python -m alfish.tools.grid_search --conf C --root_dir R --grid_file grid.json     # ALF's grid file:
        # {"parameters": {"PpoAlgorithm.lr": [1e-3, 3e-4], "PpoAlgorithm.clip_range": [0.1, 0.2]}, "repeats": 2}

Each value list is a Python literal (numbers, strings, tuples, booleans, None; read with ``ast.literal_eval``, never
executed); each value is bound as ``NAME=repr(value)``. The points are the grid's Cartesian product, in the order the
parameters are given. A point's directory is ``ROOT_DIR/<short name>=<value>,...`` (the last part of each binding's
name), its runs ``seed-<s>`` under it, each trained by ``python -m alfish.bin.train`` with
``TrainerConfig.random_seed = s`` and ``Trainer.num_threads = --threads_per_run`` (``OMP_NUM_THREADS`` likewise), at
most ``--parallel`` at a time; a run's stderr goes to ``<run>/grid_stderr.txt``.

Resumable: a run that finished is marked (``<run>/grid_done.json``) and is not trained again; a run that did not
finish (a crash, a killed search) is trained again with the same command, which resumes from its newest checkpoint.
The table is printed at the end and written to ``ROOT_DIR/grid_summary.txt`` and ``.json``. Each run that finished
gets a TensorBoard HParams session ``ROOT_DIR/hparams/<point>/seed-<s>`` (its bindings, its seed, its final and best
evaluation return: ``tensorboard --logdir ROOT_DIR/hparams`` compares the runs in the HParams tab). Exit status: 0 when
every run finished, 1 when some failed (named, with their last stderr line), 2 for bad arguments (one line).
"""
from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from alfish.tools.cli import ToolError, report
from alfish.tools.compare import format_table, summarize
from alfish.tools.hparams import BEST_RETURN, FINAL_RETURN, has_session, write_session
from alfish.tools.runs import Group

DONE = "grid_done.json"


@dataclasses.dataclass(frozen=True)
class Point:
    """One point of the grid: ``bindings`` (name, value) in the grid's parameter order."""

    bindings: tuple[tuple[str, Any], ...]

    @property
    def name(self) -> str:
        """``lr=0.001,clip_range=0.1``: short names, values as written; safe as a directory name."""
        parts = [f"{binding.rpartition('.')[2]}={value!r}" for binding, value in self.bindings]
        return re.sub(r"[^A-Za-z0-9_.=,+\-]", "_", ",".join(parts))

    def params(self) -> list[str]:
        return [f"{binding}={value!r}" for binding, value in self.bindings]


def parse_grid(specs: Sequence[str]) -> dict[str, list]:
    """``['A.b=[1, 2]', ...]`` -> ``{'A.b': [1, 2], ...}`` (one-line ToolError for a malformed one)."""
    grid: dict[str, list] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][\w./]*\.[A-Za-z_]\w*", name):
            raise ToolError(f"--grid {spec!r} must be NAME=[values], e.g. 'PpoAlgorithm.lr=[1e-3, 3e-4]'")
        grid[name] = literal_values(values, f"--grid {name}")
    return grid


def literal_values(text: Any, where: str) -> list:
    try:
        values = ast.literal_eval(text) if isinstance(text, str) else text
    except (ValueError, SyntaxError):
        raise ToolError(f"{where}: {text!r} is not a list of Python literals (numbers, strings, tuples, True/False, "
                        "None)") from None
    if not isinstance(values, (list, tuple)) or not values:
        raise ToolError(f"{where}: give a non-empty list of values, got {text!r}")
    return list(values)


def read_grid_file(path: str) -> tuple[dict[str, list], Optional[int]]:
    """ALF's grid file: ``{"parameters": {name: [values]}, "repeats": N}`` (other keys ignored)."""
    try:
        with open(path) as f:
            spec = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ToolError(f"--grid_file {path}: cannot read it as JSON ({err})") from None
    parameters = spec.get("parameters") if isinstance(spec, dict) else None
    if not isinstance(parameters, dict) or not parameters:
        raise ToolError(f"--grid_file {path}: needs a non-empty \"parameters\" object {{name: [values]}}")
    grid = {name: literal_values(values, f"--grid_file {name}") for name, values in parameters.items()}
    repeats = spec.get("repeats")
    return grid, int(repeats) if repeats is not None else None


def points_of(grid: dict[str, list]) -> list[Point]:
    names = list(grid)
    return [Point(tuple(zip(names, combo))) for combo in itertools.product(*(grid[n] for n in names))]


@dataclasses.dataclass
class RunOutcome:
    point: Point
    seed: int
    root: str
    ok: bool
    skipped: bool = False
    error: str = ""
    wall_s: float = 0.0


def train_run(conf: str, point: Point, seed: int, root: str, extra: Sequence[str], threads: int) -> RunOutcome:
    """Train one run (or nothing, if it finished in an earlier search)."""
    if os.path.exists(os.path.join(root, DONE)):
        return RunOutcome(point, seed, root, ok=True, skipped=True)
    os.makedirs(root, exist_ok=True)
    command = [sys.executable, "-m", "alfish.bin.train", "--conf", conf, "--root_dir", root]
    for param in point.params() + [f"TrainerConfig.random_seed={seed}", f"Trainer.num_threads={threads}",
                                   *extra]:
        command += ["--conf_param", param]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    start = time.monotonic()
    with open(os.path.join(root, "grid_stderr.txt"), "a") as err:
        code = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=err, env=env).returncode
    wall_s = time.monotonic() - start
    if code != 0:
        with open(os.path.join(root, "grid_stderr.txt")) as f:
            last = (f.read().strip().splitlines() or ["(no output)"])[-1]
        return RunOutcome(point, seed, root, ok=False, error=f"exit {code}: {last}", wall_s=wall_s)
    with open(os.path.join(root, DONE), "w") as f:
        json.dump(dict(bindings=point.params(), seed=seed, wall_s=round(wall_s, 1)), f)
    return RunOutcome(point, seed, root, ok=True, wall_s=wall_s)


def write_hparams(root_dir: str, outcome: RunOutcome, points: Sequence[Point]) -> None:
    """The finished run's TensorBoard HParams session ``ROOT_DIR/hparams/<point>/seed-<s>``: its bindings, its seed,
    its final and best evaluation return (none without an eval log); written once per run."""
    session = f"{outcome.point.name}/seed-{outcome.seed}"
    if has_session(root_dir, session):
        return
    domains: dict[str, list] = {}
    for point in points:
        for name, value in point.bindings:
            domains.setdefault(name, []).append(value)
    metrics = {}
    try:
        row = summarize(Group(session, (outcome.root,)))
        metrics = {FINAL_RETURN: row.final, BEST_RETURN: row.best}
    except ToolError:
        pass  # trained without evaluations: the session holds the bindings alone
    write_session(root_dir, session, {**dict(outcome.point.bindings), "seed": outcome.seed}, metrics, domains)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m alfish.tools.grid_search", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", required=True)
    parser.add_argument("--root_dir", required=True, help="one directory per point under it")
    parser.add_argument("--grid", action="append", default=[], metavar="NAME=[values]")
    parser.add_argument("--grid_file", default=None, help="ALF's grid file (JSON)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per point, 0..N-1 (default: the grid "
                                                                "file's repeats, else 1)")
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time")
    parser.add_argument("--threads_per_run", type=int, default=1, help="torch threads of each run")
    parser.add_argument("--conf_param", action="append", default=[], help="a binding for every run")
    parser.add_argument("--threshold", type=float, default=None, help="the table's 'env steps to >= T' column")
    parser.add_argument("--format", choices=("text", "csv", "markdown", "json"), default="text")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> tuple[list[Point], int]:
    if not os.path.isfile(args.conf):
        raise ToolError(f"--conf {args.conf}: no such file")
    if bool(args.grid) == bool(args.grid_file):
        raise ToolError("give the grid with --grid NAME=[values] (repeatable) or --grid_file FILE, not both")
    repeats = None
    grid = parse_grid(args.grid) if args.grid else None
    if args.grid_file:
        grid, repeats = read_grid_file(args.grid_file)
    seeds = args.seeds if args.seeds is not None else (repeats or 1)
    for flag, value in (("--seeds", seeds), ("--parallel", args.parallel), ("--threads_per_run",
                                                                           args.threads_per_run)):
        if value < 1:
            raise ToolError(f"{flag} {value} must be >= 1")
    return points_of(grid), seeds


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        points, seeds = check_args(args)
    except ToolError as err:
        return report(err)
    conf, root_dir = os.path.abspath(args.conf), os.path.abspath(args.root_dir)
    print(f"grid search: {len(points)} points x {seeds} seeds = {len(points) * seeds} runs, {args.parallel} at a "
          f"time, into {root_dir}", flush=True)
    outcomes: list[RunOutcome] = []
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        jobs = [pool.submit(train_run, conf, point, seed, os.path.join(root_dir, point.name, f"seed-{seed}"),
                            args.conf_param, args.threads_per_run)
                for point in points for seed in range(seeds)]
        for job in concurrent.futures.as_completed(jobs):
            outcome = job.result()
            outcomes.append(outcome)
            if outcome.ok:
                write_hparams(root_dir, outcome, points)
            state = ("finished earlier" if outcome.skipped else f"done in {outcome.wall_s:.0f} s" if outcome.ok
                     else f"FAILED ({outcome.error})")
            print(f"[{len(outcomes)}/{len(jobs)}] {outcome.point.name} seed {outcome.seed}: {state}", flush=True)
    failed = [o for o in outcomes if not o.ok]
    groups = [Group(point.name, tuple(o.root for o in outcomes if o.point == point and o.ok))
              for point in points]
    rows = [summarize(g, args.threshold) for g in groups if g.dirs]
    summary = format_table(rows, args.format, args.threshold) if rows else "(no run finished)"
    print(summary)
    with open(os.path.join(root_dir, "grid_summary.txt"), "w") as f:
        f.write(summary + "\n")
    with open(os.path.join(root_dir, "grid_summary.json"), "w") as f:
        f.write(format_table(rows, "json", args.threshold) if rows else "[]")
    for o in failed:
        print(f"failed: {o.point.name} seed {o.seed} ({o.root}): {o.error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
