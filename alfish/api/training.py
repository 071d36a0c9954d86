"""``alfish.train``: ``python -m alfish.bin.train`` as a Python call, for notebooks and scripts.

It runs the command's own code path (``alfish.bin.train.run_training``): the same conf loading and checks, root_dir
checks, logging (stderr and ROOT_DIR/log.txt), resume from ROOT_DIR's newest checkpoint that verifies, config record,
signal handling and error diagnosis. What differs is how it ends:
  - what the command reports as one ``error:`` line and an exit status is raised as ``alfish.TrainError`` (the same
    line; ``exit_code`` is the command's status); a bug is raised as itself, with its traceback;
  - a run stopped by a signal (Ctrl-C, a notebook's "interrupt") writes its checkpoint as the command does, then raises
    ``TrainError`` (``exit_code`` 128+N); calling ``train`` again with the same root_dir resumes it;
  - on return the logging handlers it added are closed and removed, the root logger's level, torch's thread count and
    float32 matmul precision are put back, and gin's config is cleared, so a second call starts as a fresh process
    would (gin's config is process-global: ``train`` clears it before and after).
In a script, call it under ``if __name__ == "__main__":``: a run's child processes start by running the script again
(multiprocessing's spawn); a notebook needs nothing. Like the command, it seeds python's, numpy's and torch's global
random generators from ``TrainerConfig.random_seed``, and a second stop signal, an env step that hangs past
``create_environment.step_timeout_s`` or an iteration that outlives ``Trainer.stop_grace_s`` after a stop ends the
process (in a notebook: its kernel), as they end the command.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import signal
from typing import Any, Iterator, Optional, Sequence

import gin

from alfish.bin.train import TrainError, run_training
from alfish.rundir.bounded import RootDirContentError, bounded_lines, loads_bounded
from alfish.rundir.eval_log import EVAL_LOG, MAX_LINE_BYTES, MAX_TOTAL_BYTES, eval_log_path
from alfish.rundir.safe_paths import open_in_root

_MAX_RECORD_VALUES = 10_000  # a record is a few dozen values (alfish.rundir.eval_log)


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a finished ``alfish.train`` run reached.

    root_dir: the results directory (checkpoints, TensorBoard events under tb/, eval_log.jsonl, log.txt).
    iterations, env_steps: where the run's counters ended (env steps summed over all envs).
    average_return, average_episode_length: the final evaluation's (``TrainerConfig.evaluate``: the greedy policy on
        ``num_eval_episodes`` episodes of separate eval envs); None when the run did not evaluate.
    evaluation: the final evaluation's whole record in ROOT_DIR/eval_log.jsonl (``iteration``, ``env_steps``,
        ``average_return``, ``num_episodes``, the ``eval_uncertainty`` fields, ...); None when the run did not
        evaluate.
    """

    root_dir: str
    iterations: int
    env_steps: int
    average_return: Optional[float]
    average_episode_length: Optional[float]
    evaluation: Optional[dict[str, Any]]


def train(conf: str | os.PathLike, root_dir: str | os.PathLike, bindings: Sequence[str] = (), *,
          fresh: bool = False) -> TrainResult:
    """Train ``conf`` into ``root_dir`` as ``python -m alfish.bin.train --conf CONF --root_dir ROOT_DIR
    [--conf_param B ...] [--fresh]`` does (module docstring) and return its final evaluation.

    Args:
        conf: the gin conf file.
        root_dir: the results directory; a run already there resumes from its newest checkpoint that verifies.
        bindings: extra gin bindings, each as one ``--conf_param`` (e.g. ``'TrainerConfig.num_iterations=100'``).
        fresh: start over from iteration 0; the previous checkpoints, TensorBoard events and eval log are moved to
            ROOT_DIR/before-fresh-<time>/ (``--fresh``).

    Raises:
        TrainError: one line saying what is wrong and what to change (``exit_code``: the command's exit status).
        TypeError: ``bindings`` is not a list of strings.
    """
    refuse_child_start()
    conf, root_dir = os.fspath(conf), os.fspath(root_dir)
    params = checked_bindings(bindings)
    with process_state_restored():
        finished = run_training(conf, root_dir, params, fresh)
    if finished.exit_code != 0:
        raise TrainError(f"training stopped by {signal_name(finished.exit_code)} at iteration {finished.iterations}; "
                         f"call alfish.train again with the same root_dir to resume from its newest checkpoint",
                         finished.exit_code, reported=True)
    record = final_evaluation(root_dir, finished.iterations)
    return TrainResult(root_dir=root_dir, iterations=finished.iterations, env_steps=finished.env_steps,
                       average_return=None if record is None else float(record["average_return"]),
                       average_episode_length=None if record is None else float(record["average_episode_length"]),
                       evaluation=record)


def refuse_child_start() -> None:
    """Raises ``TrainError`` when called while this process starts as a multiprocessing child: spawn and forkserver
    start alfish's children (async evaluation and unroll, env workers) by running the parent's main script again, and
    a script that calls ``alfish.train`` outside ``if __name__ == "__main__":`` would start a second training run in
    each of them. (``_inheriting`` is what multiprocessing's own check of that mistake reads.)"""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise TrainError('alfish.train was called while a child process was starting: multiprocessing starts the '
                         'child processes of a run (async evaluation and unroll, env workers) by running your script '
                         'again, so call alfish.train under `if __name__ == "__main__":`', 2, reported=False)


def checked_bindings(bindings: Sequence[str]) -> list[str]:
    """``bindings`` as a list, refusing what is not a list or tuple of strings (a lone string would be read character
    by character).

    Raises:
        TypeError: one line saying what to pass.
    """
    if isinstance(bindings, str):
        raise TypeError(f"bindings must be a list of gin bindings, got the string {bindings!r}: pass [{bindings!r}]")
    if not isinstance(bindings, (list, tuple)):
        raise TypeError(f"bindings must be a list of gin bindings such as ['TrainerConfig.num_iterations=100'], got "
                        f"{type(bindings).__name__}")
    for param in bindings:
        if not isinstance(param, str):
            raise TypeError(f"bindings must be strings such as 'TrainerConfig.num_iterations=100', got "
                            f"{type(param).__name__} {param!r}")
    return list(bindings)


def signal_name(exit_code: int) -> str:
    """'SIGINT' for exit status 130 (128 + the signal's number), else 'a signal (exit status N)'."""
    try:
        return signal.Signals(exit_code - 128).name
    except ValueError:
        return f"a signal (exit status {exit_code})"


@contextlib.contextmanager
def process_state_restored() -> Iterator[None]:
    """Inside: a training run may add root-logger handlers, set the root logger's level, torch's thread count and
    float32 matmul precision, and parse a conf. On exit its handlers are closed and removed, and the rest put back;
    gin's config is cleared."""
    import torch  # (training imports it anyway)

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        root.setLevel(level)
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(precision)
        gin.clear_config()


def final_evaluation(root_dir: str, iteration: int) -> Optional[dict[str, Any]]:
    """The newest record of ``iteration`` in ROOT_DIR/eval_log.jsonl (every finished run that evaluates records its
    final iteration), or None when there is none. Lines that are not records are skipped, as the trainer skips them.

    Raises:
        UnsafePathError: the log is a symlink, FIFO, ... (one line naming it).
    """
    path = eval_log_path(root_dir)
    found = None
    try:
        with open_in_root(root_dir, EVAL_LOG, "rb") as f:
            for line in bounded_lines(f, path, MAX_LINE_BYTES, MAX_TOTAL_BYTES):
                try:
                    record = loads_bounded(line, path, _MAX_RECORD_VALUES)
                except RootDirContentError:
                    continue
                if isinstance(record, dict) and record.get("iteration") == iteration and all(
                        isinstance(record.get(k), (int, float)) for k in ("average_return", "average_episode_length")):
                    found = record
    except FileNotFoundError:
        return None
    return found
