"""Finding runs and reading their learning curves: ``eval_log.jsonl`` or a TensorBoard scalar, against env steps,
iterations or wall-clock seconds.

A results directory is untrusted input: only its JSON lines and TensorBoard event files are read, nothing in it is
executed, nothing is written to it.

Groups come from the command line as ``LABEL=DIR1,DIR2,...``, each DIR a directory or a glob pattern (quoted, e.g.
``sac='runs/sac-seed*'``): the runs of one configuration (its seeds), plotted or tabulated together. A DIR named on
its own is a group of one, labelled by its path.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import math
import os
from typing import IO, Any, Callable, Optional, Sequence

import numpy as np

from alfish.rundir.bounded import RootDirContentError, bounded_lines, loads_bounded
from alfish.rundir.safe_paths import UnsafePathError, kind_in_root, open_in_root
from alfish.tools.cli import ToolError

X_AXES = ("env_steps", "iteration", "wall_clock")
X_LABELS = {"env_steps": "env steps", "iteration": "iteration", "wall_clock": "wall-clock (s)"}
EVAL_LOG = "eval_log.jsonl"
# Bounds on reading an eval log from a results directory: alfish writes ~300 bytes and ~15 values a record.
MAX_EVAL_LINE_BYTES = 64 << 10
MAX_EVAL_LOG_BYTES = 256 << 20
MAX_EVAL_RECORD_VALUES = 4096
TB_DIR = "tb"
#: The trainer's summary of the env steps taken, at each summary step: maps TensorBoard steps to env steps.
ENV_STEPS_TAG = "train/env_steps"
#: Tags under these prefixes are written with the env steps as their TensorBoard step (the others: the iteration).
_VS_ENV_STEPS = "_vs_env_steps/"
# eval_log.jsonl's field for each x axis (elapsed_s: the run's wall-clock at the evaluation, earlier runs of a resumed
# experiment included; asynchronous evaluations: when the evaluated parameters were sent)
_LOG_X = {"env_steps": "env_steps", "iteration": "iteration", "wall_clock": "elapsed_s"}


@dataclasses.dataclass(frozen=True)
class Group:
    """The results directories of one configuration (e.g. its seeds); ``label`` names it in figures and tables."""

    label: str
    dirs: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Curve:
    """One run's scalar over training.

    x: ``[N]`` float64, strictly increasing: env steps, iterations or seconds. y: ``[N]`` float64 (the scalar).
    """

    run: str
    x: np.ndarray
    y: np.ndarray


# ------------------------------------------------------------------------------------------------ finding runs ----
def expand(patterns: Sequence[str], where: str) -> tuple[str, ...]:
    """The directories ``patterns`` name (each a path or a glob pattern), in order, each once.

    A glob pattern keeps only the directories it matches (so ``runs/*`` skips a ``runs/notes.txt``) and must match at
    least one; a plain path must be a directory. ``where``: what the error messages name (e.g. ``--run sac``).
    """
    found: list[str] = []
    for pattern in patterns:
        if not pattern:
            raise ToolError(f"{where}: an empty directory name (two commas in a row?)")
        if glob.has_magic(pattern):
            matches = [m for m in sorted(glob.glob(pattern)) if os.path.isdir(m)]
            if not matches:
                raise ToolError(f"{where}: the pattern {pattern!r} matches no directory")
        elif not os.path.isdir(pattern):
            raise ToolError(f"{where}: {pattern} is not a directory")
        else:
            matches = [pattern]
        found += [m for m in matches if m not in found]
    return tuple(found)


def parse_group(spec: str) -> Group:
    """``LABEL=DIR[,DIR...]`` (each DIR a directory or a glob pattern) as a Group."""
    label, sep, dirs = spec.partition("=")
    if not sep or not label or not dirs:
        raise ToolError(f"--run {spec!r} must be LABEL=DIR[,DIR...] (a DIR may be a quoted glob pattern)")
    return Group(label, expand(dirs.split(","), f"--run {label}"))


def tool_parser(tool: str, description: str, each_dir: str, each_run: str) -> argparse.ArgumentParser:
    """The parser of ``python -m alfish.tools.<tool>`` with the run selection every analysis tool takes: directories
    named on their own (``each_dir``: what each becomes) and ``--run LABEL=DIR[,DIR...]`` groups (``each_run``);
    ``groups_from_args(args.run, args.dirs)`` reads them."""
    parser = argparse.ArgumentParser(prog=f"python -m alfish.tools.{tool}", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="*", metavar="DIR", help=f"a results directory (or glob pattern){each_dir}")
    parser.add_argument("--run", action="append", default=[], metavar="LABEL=DIR[,DIR...]",
                        help=f"{each_run} (repeatable)")
    return parser


def groups_from_args(run_specs: Sequence[str], paths: Sequence[str]) -> list[Group]:
    """The groups of ``--run LABEL=DIRS`` options, then one group per directory named on its own (patterns
    expanded), labelled by its path. Raises ToolError for none at all or a label used twice."""
    groups = [parse_group(spec) for spec in run_specs]
    groups += [Group(d.rstrip(os.sep) or d, (d,)) for d in expand(paths, "run directory")]
    if not groups:
        raise ToolError("name at least one results directory, or --run LABEL=DIR[,DIR...]")
    labels = [g.label for g in groups]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ToolError(f"the label {twice[0]!r} names two groups; give each --run its own label")
    return groups


# ------------------------------------------------------------------------------------------------ eval_log.jsonl ----
def read_eval_log(root: str, convert: Optional[Callable[[dict, int], Any]] = None,
                  missing_ok: bool = False) -> list[Any]:
    """The records of ``root/eval_log.jsonl``, in file order (one JSON object a line, as
    ``alfish.evaluate.evaluator.write_evaluation`` writes them); with ``convert``, ``convert(record, number)`` of each
    (``number`` counts the records from 1) is kept instead, e.g. the two numbers of a curve's point, so that what is
    kept in memory is bounded by the number of lines, not by what each line holds.

    A last line without its newline (a write cut short when the run was killed) is left out; any other line that is
    not a JSON object is an error naming the file and line. The file is read inside ``root`` without following a
    link, streaming, at most ``MAX_EVAL_LINE_BYTES`` a line and ``MAX_EVAL_LOG_BYTES`` in all (a FIFO, a device or a
    file of gigabytes is one error line). ``missing_ok``: no file is no records (else an error).
    """
    path = os.path.join(root, EVAL_LOG)
    records = []
    try:
        with open_in_root(root, EVAL_LOG, "rb") as f:
            for number, line in enumerate(bounded_lines(f, path, MAX_EVAL_LINE_BYTES, MAX_EVAL_LOG_BYTES), 1):
                if not _ended_with_newline(f):
                    break  # the unfinished last line
                if line.strip():
                    record = _record(line, f"{path}:{number}")
                    records.append(record if convert is None else convert(record, len(records) + 1))
    except FileNotFoundError:
        if missing_ok:
            return []
        raise ToolError(f"{root} has no {EVAL_LOG} (trained without TrainerConfig.evaluate?); plot a TensorBoard "
                        "scalar with --tag instead") from None
    except RootDirContentError as err:
        raise ToolError(str(err)) from None
    except OSError as err:  # UnsafePathError (a link, FIFO, device): its message says what to do
        raise ToolError(str(err) if isinstance(err, UnsafePathError) else
                        f"cannot read {path}: {err.strerror or err}") from None
    return records


def _ended_with_newline(f: IO[bytes]) -> bool:
    """Whether the line just read from ``f`` ended with a newline (``bounded_lines`` strips it)."""
    position = f.tell()
    f.seek(position - 1)
    ended = f.read(1) == b"\n"
    f.seek(position)
    return ended


def _record(line: bytes, where: str) -> dict:
    """The JSON object ``line`` holds (bounded: a line of an eval log is a record of a few numbers)."""
    try:
        record = loads_bounded(line, where, MAX_EVAL_RECORD_VALUES)
    except RootDirContentError as err:
        raise ToolError(f"{where}: not a JSON line ({err})") from None
    if not isinstance(record, dict):
        raise ToolError(f"{where}: not a JSON object")
    return record


def eval_curve(root: str, x: str, field: str = "average_return") -> Curve:
    """``field`` of ``root``'s evaluations against ``x`` (one of ``X_AXES``)."""
    path = os.path.join(root, EVAL_LOG)
    key = _LOG_X[x]

    def point(record: dict, number: int) -> tuple[float, float]:
        for name in (key, field):
            if not _is_number(record.get(name)):
                numbers = sorted(k for k, v in record.items() if _is_number(v))
                raise ToolError(f"{path}: record {number} has no number {name!r} (it has {', '.join(numbers)})")
        return float(record[key]), float(record[field])

    points = read_eval_log(root, point)
    if not points:
        raise ToolError(f"{path} has no evaluation yet")
    return _curve(root, [p[0] for p in points], [p[1] for p in points])


# ------------------------------------------------------------------------------------------------ TensorBoard ----
def tb_curve(root: str, tag: str, x: str) -> Curve:
    """The TensorBoard scalar ``tag`` of ``root/tb`` against ``x`` (one of ``X_AXES``).

    The trainer writes most scalars (``eval/...``, ``train/...``, ``loss/...``) with the iteration as their step (the
    learner's update count with ``TrainerConfig.update_counter_every_mini_batch``) and ``*_vs_env_steps/...`` with
    the env steps. For ``x='env_steps'`` the other tags' steps are mapped through ``train/env_steps`` (linear between
    its summaries, and beyond them along its first and last segments: after the initial collection each iteration
    takes the same number of env steps). ``x='wall_clock'``: seconds since the run's first event (a resumed run's
    pauses included). TensorBoard stores values as float32 (exact integers up to 2**24).
    """
    mapped = x == "env_steps" and _VS_ENV_STEPS not in tag  # steps to map through train/env_steps
    events, first_time, env_steps = _tb_scalars(root, tag, need_env_steps=mapped)
    steps = np.array([e.step for e in events], dtype=np.float64)
    values = np.array([e.value for e in events], dtype=np.float64)
    if x == "wall_clock":
        xs = np.array([e.wall_time for e in events], dtype=np.float64) - first_time
    elif _VS_ENV_STEPS in tag:
        if x == "iteration":
            raise ToolError(f"{root}: the TensorBoard scalar {tag!r} is recorded against env steps; plot it with "
                            "--x env_steps or --x wall_clock")
        xs = steps
    elif not mapped:  # x == "iteration"
        xs = steps
    else:
        ref = _curve(root, [e.step for e in env_steps], [e.value for e in env_steps])
        xs = _interpolate_linear(steps, ref.x, ref.y, f"{root}: {ENV_STEPS_TAG}")
    return _curve(root, xs.tolist(), values.tolist())


def _tb_scalars(root: str, tag: str, need_env_steps: bool) -> tuple[list, float, list]:
    """(tag's events, the wall time of the run's first event, the ``train/env_steps`` events if ``need_env_steps``)."""
    from google.protobuf.message import DecodeError
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = os.path.join(root, TB_DIR)
    try:
        kind = kind_in_root(root, TB_DIR)
    except OSError as err:
        raise ToolError(f"cannot read {tb}: {err.strerror or err}") from None
    if kind == "symlink":
        raise ToolError(f"{tb} is a symlink; alfish never follows links inside a results directory: replace it with "
                        "a real directory")
    if kind != "dir":
        raise ToolError(f"{root} has no {TB_DIR}/ folder of TensorBoard events")
    # scalars=0 keeps every event (the default keeps a sample of 10,000); the accumulator drops the events a resumed
    # run wrote again (purge_orphaned_data), so each step has the newest run's value
    acc = EventAccumulator(tb, size_guidance={"scalars": 0})
    try:
        acc.Reload()
        first_time = acc.FirstEventTimestamp()  # ValueError when there is no event at all
    except (OSError, ValueError, RuntimeError, DecodeError) as err:
        raise ToolError(f"cannot read the TensorBoard events in {tb}: {' '.join(str(err).split())}") from None
    tags = acc.Tags().get("scalars", [])
    if tag not in tags:
        raise ToolError(f"{tb} has no scalar {tag!r}; it has {len(tags)}: {', '.join(sorted(tags)[:12])}"
                        f"{', ...' if len(tags) > 12 else ''}")
    if need_env_steps and ENV_STEPS_TAG not in tags:
        raise ToolError(f"{tb} has no {ENV_STEPS_TAG} to turn {tag!r}'s steps into env steps; use --x iteration (or "
                        "the eval log, without --tag)")
    return acc.Scalars(tag), first_time, acc.Scalars(ENV_STEPS_TAG) if need_env_steps else []


def _interpolate_linear(x: np.ndarray, xp: np.ndarray, fp: np.ndarray, what: str) -> np.ndarray:
    """``fp`` at ``x``: linear between the points ``(xp, fp)`` (``xp`` increasing) and along the first and last
    segments beyond them."""
    if len(xp) < 2:
        if np.all(x == xp[0]):
            return np.full_like(x, fp[0])
        raise ToolError(f"{what} has only one summary; cannot map other steps to env steps (use --x iteration)")
    out = np.interp(x, xp, fp)
    before, after = x < xp[0], x > xp[-1]
    out[before] = fp[0] + (x[before] - xp[0]) * (fp[1] - fp[0]) / (xp[1] - xp[0])
    out[after] = fp[-1] + (x[after] - xp[-1]) * (fp[-1] - fp[-2]) / (xp[-1] - xp[-2])
    return out


# ------------------------------------------------------------------------------------------------ either source ----
def read_curve(root: str, x: str, tag: Optional[str] = None, field: str = "average_return") -> Curve:
    """``root``'s curve against ``x``: the TensorBoard scalar ``tag`` if given, else eval_log.jsonl's ``field``."""
    if x not in X_AXES:
        raise ToolError(f"x axis {x!r} must be one of {', '.join(X_AXES)}")
    return tb_curve(root, tag, x) if tag else eval_curve(root, x, field)


def read_group(group: Group, x: str, tag: Optional[str] = None, field: str = "average_return") -> list[Curve]:
    """The curve of each run of ``group`` (see ``read_curve``)."""
    return [read_curve(d, x, tag, field) for d in group.dirs]


def _curve(run: str, xs: Sequence[float], ys: Sequence[float]) -> Curve:
    """A Curve from points in the order they were recorded, keeping each x's newest history: a run resumed from an
    older checkpoint records the iterations after it again, and its points replace those at and after their x."""
    kept_x: list[float] = []
    kept_y: list[float] = []
    for a, b in zip(xs, ys):
        if not math.isfinite(a):
            raise ToolError(f"{run}: a point has x = {a}")
        while kept_x and kept_x[-1] >= a:
            kept_x.pop()
            kept_y.pop()
        kept_x.append(a)
        kept_y.append(b)
    if not kept_x:
        raise ToolError(f"{run}: the curve has no point")
    return Curve(run, np.asarray(kept_x, dtype=np.float64), np.asarray(kept_y, dtype=np.float64))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
