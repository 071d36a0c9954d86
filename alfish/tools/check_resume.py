"""Check that a run stopped and resumed equals the run that never stopped, tensor for tensor.

    python -m alfish.tools.check_resume --conf confs/sac_pendulum.gin --iterations 300 [--conf_param 'X.y=1' ...]
                                        [--work_dir DIR] [--keep]

Three ``python -m alfish.bin.train`` processes on the conf, unchanged but for a simulated preemption (SIGTERM after
an iteration, as a cluster sends it: the trainer writes a checkpoint and exits):

  A  stopped after iteration 2N                       (the run that never stopped before 2N)
  B  stopped after iteration N, then resumed in a new process and stopped after iteration 2N

then A's and B's checkpoints at 2N are compared: every tensor (parameters, optimizer state, replay buffer, data
transformers, the envs' episodes in flight, RNG states), the counters, and the evaluations (returns and iterations;
times excluded; an asynchronous evaluation sent just before the stop may be recorded by one run and still pending in
the other's checkpoint, depending on the evaluator's speed: that is no difference, ``compare_evaluations``). The first
difference is printed with its path (e.g. ``learner/optimizer/state/3/exp_avg``) and the exit status is 1; 0 when
everything is equal; 2 for bad arguments. Choose N so that episodes are in flight at the stop (not a multiple of the
episode length): that is what the envs' restore is for.

Exact for a synchronous unroll on one process (``async_unroll=False``, no torchrun) with deterministic environments,
at the same device type, thread count and compile setting (``README``: "Exact resume").
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Optional, Sequence

import torch

from alfish.rundir.checkpoint import Checkpointer
from alfish.tools.cli import ToolError, report
from alfish.tools.runs import read_eval_log

STOPPED = 128 + 15  # train's exit status after SIGTERM
TIMING = ("elapsed_s", "eval_s", "asynchronous")


def train(conf: str, root: str, stop_at: int, params: Sequence[str], timeout_s: float) -> None:
    command = [sys.executable, "-m", "alfish.bin.train", "--conf", conf, "--root_dir", root,
               "--conf_param", "Trainer.callbacks = [@SimulatedPreemption()]",
               "--conf_param", f"SimulatedPreemption.iteration = {stop_at}"]
    for param in params:
        command += ["--conf_param", param]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if proc.returncode != STOPPED:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ToolError(f"training {root} to iteration {stop_at} ended with exit status {proc.returncode}, not "
                        f"{STOPPED} (stopped with a checkpoint): {last}")


def first_difference(a: Any, b: Any, path: str = "") -> Optional[str]:
    """The path of the first leaf where the nests ``a`` and ``b`` differ (with both values), or None."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{path}: a tensor on one side only"
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{path}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        if not torch.equal(a, b):
            where = (a != b).nonzero()
            first = tuple(where[0].tolist()) if len(where) else ()
            count = int((a != b).sum()) if a.dtype != torch.bool else int(where.shape[0])
            return (f"{path}: {count} of {a.numel()} elements differ (first at {list(first)}: "
                    f"{a[first].item() if first else a.item()} vs {b[first].item() if first else b.item()})")
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{path}: keys {sorted(map(str, set(a) ^ set(b)))} on one side only"
        for key in a:
            if key in TIMING:  # wall-clock, e.g. of an evaluation the stop interrupted
                continue
            found = first_difference(a[key], b[key], f"{path}/{key}")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}/{i}")
            if found:
                return found
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def evaluations(root: str) -> list[dict]:
    """``root``'s recorded evaluations without their times (read bounded, inside ``root``: ``read_eval_log``)."""
    return [{k: v for k, v in record.items() if k not in TIMING} for record in read_eval_log(root, missing_ok=True)]


def compare(root_a: str, root_b: str, step: int) -> Optional[str]:
    """The first difference between the two runs' checkpoints at ``step`` and their evaluations, or None."""
    a = Checkpointer(os.path.join(root_a, "checkpoints"), root_dir=root_a).load(step)
    b = Checkpointer(os.path.join(root_b, "checkpoints"), root_dir=root_b).load(step)
    pending_a, pending_b = a.tensors.pop("pending_evaluations", []), b.tensors.pop("pending_evaluations", [])
    found = first_difference(a.tensors, b.tensors)
    if found:
        return found
    for key in ("iteration", "env_steps", "unroll_credit", "num_episodes", "seed"):
        if a.meta.get(key) != b.meta.get(key):
            return f"meta/{key}: {a.meta.get(key)!r} vs {b.meta.get(key)!r}"
    return compare_evaluations(evaluations(root_a), pending_a, evaluations(root_b), pending_b)


def compare_evaluations(recorded_a: list[dict], pending_a: list[dict], recorded_b: list[dict],
                        pending_b: list[dict]) -> Optional[str]:
    """The first difference between two runs' evaluations, or None. Each evaluation is either recorded (a line of
    ``eval_log.jsonl``, times excluded) or pending in the checkpoint (sent before the stop, re-run after a resume).
    Which of the two an evaluation sent just before the stop is depends on how fast the evaluator was, not on the
    run: an iteration recorded in one run and pending in the other is no difference. An iteration recorded (or
    pending) in both must be equal; one that a run has neither recorded nor pending is a difference."""
    def by_iteration(items: list[dict]) -> dict[int, list[dict]]:
        grouped: dict[int, list[dict]] = {}
        for item in items:
            grouped.setdefault(int(item["iteration"]), []).append(item)
        return grouped

    rec_a, rec_b = by_iteration(recorded_a), by_iteration(recorded_b)
    pend_a, pend_b = by_iteration(pending_a), by_iteration(pending_b)
    for iteration in sorted(set(rec_a) | set(rec_b) | set(pend_a) | set(pend_b)):
        if iteration in rec_a and iteration in rec_b:
            found = first_difference(rec_a[iteration], rec_b[iteration], f"eval_log.jsonl/iteration {iteration}")
        elif iteration in pend_a and iteration in pend_b:
            found = first_difference(pend_a[iteration], pend_b[iteration], f"pending_evaluations/iteration {iteration}")
        elif (iteration in rec_a and iteration in pend_b) or (iteration in pend_a and iteration in rec_b):
            found = None  # sent before the stop: recorded by one run in time, kept pending by the other
        else:
            side = "the first run" if iteration in rec_a or iteration in pend_a else "the second run"
            found = f"the evaluation of iteration {iteration}: only {side} recorded or kept it"
        if found:
            return found
    return None


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m alfish.tools.check_resume", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", required=True)
    parser.add_argument("--iterations", type=int, required=True, help="N: stop after N, compare at 2N")
    parser.add_argument("--conf_param", action="append", default=[])
    parser.add_argument("--work_dir", default=None, help="where the two runs go (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the runs (default: removed when they agree)")
    parser.add_argument("--timeout_s", type=float, default=3600.0, help="per training process")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.iterations < 1:
            raise ToolError(f"--iterations {args.iterations} must be >= 1")
        if not os.path.isfile(args.conf):
            raise ToolError(f"--conf {args.conf}: no such file")
        work = args.work_dir or tempfile.mkdtemp(prefix="alfish-check-resume-")
        root_a, root_b = os.path.join(work, "uninterrupted"), os.path.join(work, "resumed")
        n = args.iterations
        train(args.conf, root_a, 2 * n, args.conf_param, args.timeout_s)
        train(args.conf, root_b, n, args.conf_param, args.timeout_s)
        train(args.conf, root_b, 2 * n, args.conf_param, args.timeout_s)  # resumes from B's checkpoint at N
        difference = compare(root_a, root_b, 2 * n)
    except ToolError as err:
        return report(err)
    if difference is None:
        print(f"resume is exact: stopped at iteration {n} and resumed, the run equals the one that never stopped at "
              f"iteration {2 * n} (every checkpoint tensor and evaluation)")
        if not args.keep and args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    print(f"resume is not exact: the first difference at iteration {2 * n} is {difference} (runs kept in {work})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
