"""Evaluate checkpoints of a results directory, writing the records training writes (TensorBoard ``eval/...`` at the
checkpoint's iteration, ``eval_vs_env_steps/average_return`` at its env steps, one ``eval_log.jsonl`` line each).

    python -m alfish.bin.evaluate --root_dir runs/sac [--checkpoint_step N | --best | --all]
                                  [--num_episodes K] [--epsilon_greedy E] [--seed S] [--out_dir D]
                                  [--allow_import PREFIX ...]

The evaluation is training's: the stored config's ``TrainerConfig.num_eval_episodes`` (or --num_episodes) episodes
on ``num_eval_environments`` envs built from its ``eval``-scoped ``create_environment`` bindings, with the greedy
policy (``epsilon_greedy``: the config's, or --epsilon_greedy), through the transformers with their stored statistics,
on the episodes (env seeds) training's evaluation at that iteration used: a checkpoint written at an evaluation
iteration gets the return training recorded for it.
The records go to --out_dir (default ``ROOT_DIR/evaluations``), never into the run's own ``tb`` or ``eval_log.jsonl``.
``--all`` evaluates every checkpoint that verifies, oldest first (a curve of a finished run under a new evaluation
protocol). The results directory is read as ``play`` reads it: untrusted (see ``alfish.bin.play``).

Exit status: 0 when every evaluation was recorded; 2 for a problem with the arguments or what they name (reported in
one line).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Callable, Optional, Sequence

import gin
import gymnasium as gym

from alfish.bin.root_dir_args import add_allow_import
from alfish.bin.stored_run import load_checkpoint, load_policy_config, one_line, restore_policy
from alfish.config import ConfError, TrainerConfig
from alfish.config.untrusted import check_env_names, trusted_prefixes
from alfish.console.printable import printable
from alfish.envs.batched_env import BatchedEnv, create_environment, environment_settings
from alfish.evaluate.evaluator import Evaluator, RecordedAt, write_evaluation
from alfish.rundir.checkpoint import Checkpointer, CheckpointError, LoadedCheckpoint
from alfish.rundir.eval_log import EVAL_LOG
from alfish.rundir.safe_paths import UnsafePathError, kind_in_root, make_dirs_in_root
from alfish.seeding import EVAL_SEED_OFFSET
from alfish.trainer.summary import Summaries

EVALUATIONS = "evaluations"  # the default --out_dir, inside the root_dir


class EvaluateError(Exception):
    """A problem with the arguments; its message is one line saying what to change."""


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m alfish.bin.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root_dir", required=True)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--checkpoint_step", type=int, default=None, help="iteration of the checkpoint (default: "
                                                                         "the newest)")
    which.add_argument("--best", action="store_true", help="the best policy (ROOT_DIR/checkpoints/best)")
    which.add_argument("--all", action="store_true", help="every checkpoint that verifies, oldest first")
    parser.add_argument("--num_episodes", type=int, default=None,
                        help="episodes per evaluation (default: the run's TrainerConfig.num_eval_episodes)")
    parser.add_argument("--epsilon_greedy", type=float, default=None,
                        help="default: the run's TrainerConfig.epsilon_greedy")
    parser.add_argument("--seed", type=int, default=None, help="default: the run's evaluation seed")
    parser.add_argument("--out_dir", default=None, help="where the records go (default: ROOT_DIR/evaluations)")
    add_allow_import(parser)
    return parser.parse_args(argv)


def checkpoint_loaders(args: argparse.Namespace) -> list[Callable[[], Optional[LoadedCheckpoint]]]:
    """One loader per checkpoint to evaluate, oldest first. They are called in turn and each checkpoint is dropped
    before the next is loaded, so that one is in memory at a time (``--all`` over a long run's checkpoints would
    otherwise hold them all). An ``--all`` loader returns None for a checkpoint that does not verify (a warning)."""
    if not args.all:
        return [lambda: load_checkpoint(args.root_dir, args.checkpoint_step, args.best)]
    checkpointer = Checkpointer(os.path.join(args.root_dir, "checkpoints"), root_dir=args.root_dir)

    def loader(step: int) -> Callable[[], Optional[LoadedCheckpoint]]:
        def load() -> Optional[LoadedCheckpoint]:
            try:
                return checkpointer.load(step)
            except CheckpointError as err:
                logging.warning("skipping checkpoint %d: %s", step, one_line(err))
                return None
        return load

    return [loader(step) for step in checkpointer.steps()]


def default_out_dir(root_dir: str) -> str:
    """``ROOT_DIR/evaluations``, made (with its ``tb/``) below the root_dir without following a link, and refused
    when its ``eval_log.jsonl`` is anything but a regular file: records are never written through a planted link.

    Raises:
        UnsafePathError: one line naming the link (or FIFO, device, ...) and what to do.
    """
    out_dir = make_dirs_in_root(root_dir, os.path.join(EVALUATIONS, "tb"))
    out_dir = os.path.dirname(out_dir)
    log = os.path.join(out_dir, EVAL_LOG)
    kind = kind_in_root(root_dir, log)
    if kind not in ("missing", "file"):
        raise UnsafePathError(log, f"{log} is a {kind}, not a file; evaluate appends its records there and never "
                                   "through a link: remove it, or give --out_dir")
    return out_dir


def create_eval_env(config: TrainerConfig, seed: int, trusted: tuple[str, ...]) -> BatchedEnv:
    """The run's evaluation envs (``eval``-scoped bindings), after checking that their names import nothing
    untrusted."""
    with gin.config_scope("eval"):
        settings = environment_settings(num_parallel_environments=config.num_eval_environments, seed=seed)
    check_env_names({"eval/create_environment.env_name": settings.env_name,
                     "eval/create_environment.env_kwargs": settings.env_kwargs}, trusted)
    with gin.config_scope("eval"):
        return create_environment(num_parallel_environments=config.num_eval_environments, seed=seed)


def evaluation_index(config: TrainerConfig, ckpt: LoadedCheckpoint, iteration: int) -> int:
    """The index ``k`` of training's evaluation at ``iteration`` (its envs reset with ``reseed(seed, k)``), so that a
    checkpoint written at an evaluation iteration is scored on the episodes training scored it on: the first
    evaluation, at ``eval_interval``, is ``k = 0`` (a run with ``Trainer.evaluate_at_start`` counted one more, at 0)."""
    total_envs = environment_settings().num_parallel_environments * ckpt.count("world_size", 1)
    return max(0, iteration // config.resolved_eval_interval(total_envs) - 1)


class _Session:
    """What the evaluations of one command share: the eval envs (built for the first checkpoint, from its stored
    config) and the summaries written to ``out_dir`` (--out_dir, or ``default_out_dir`` made at the first
    evaluation)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.out_dir = args, args.out_dir
        self.trusted = trusted_prefixes(args.allow_import)
        self.env: Optional[BatchedEnv] = None
        self.summaries: Optional[Summaries] = None

    def evaluate(self, ckpt: LoadedCheckpoint) -> float:
        """Evaluate ``ckpt`` (nothing of it is kept after the return: the policy holds copies of its tensors),
        record the evaluation and return its average return."""
        args = self.args
        config = load_policy_config(args.root_dir, ckpt, self.trusted, "evaluate")
        seed = args.seed if args.seed is not None else ckpt.count("seed", 0) + EVAL_SEED_OFFSET
        if self.env is None:
            self.out_dir = self.out_dir or default_out_dir(args.root_dir)
            self.env = create_eval_env(config, seed, self.trusted)
            os.makedirs(self.out_dir, exist_ok=True)
            self.summaries = Summaries(self.out_dir, interval=1, first_interval=False, flush_secs=10, max_queue=100)
        transformer, algorithm = restore_policy(config, self.env, ckpt)
        evaluator = Evaluator(self.env, args.num_episodes or config.num_eval_episodes,
                              config.epsilon_greedy if args.epsilon_greedy is None else args.epsilon_greedy,
                              seed=seed, transform=transformer.rollout_view(update_stats=False),
                              uncertainty=config.eval_uncertainty)
        iteration = ckpt.count("iteration", 0)
        evaluator.num_evaluations = evaluation_index(config, ckpt, iteration)
        start = time.monotonic()
        result = evaluator.evaluate(algorithm)
        write_evaluation(result, self.summaries, self.out_dir,
                         RecordedAt(iteration, ckpt.count("env_steps", 0), ckpt.real("elapsed_s", 0)),
                         time.monotonic() - start)
        print(f"{printable(ckpt.path)}: average return {result.average_return:.3f} over {result.num_episodes} "
              "episodes", flush=True)
        return result.average_return

    def close(self) -> None:
        if self.summaries is not None:
            self.summaries.flush()
            self.summaries.close()
        if self.env is not None:
            self.env.close()


def evaluate(args: argparse.Namespace) -> list[float]:
    """Evaluate the checkpoints ``args`` names, one in memory at a time; returns their average returns."""
    if args.num_episodes is not None and args.num_episodes < 1:
        raise EvaluateError(f"--num_episodes {args.num_episodes} must be >= 1")
    session = _Session(args)
    returns: list[float] = []
    try:
        for load in checkpoint_loaders(args):
            ckpt = load()
            if ckpt is not None:
                returns.append(session.evaluate(ckpt))
            del ckpt  # before the next is loaded
    finally:
        session.close()
    if not returns:
        raise CheckpointError(f"no checkpoint that verifies under {args.root_dir}/checkpoints")
    return returns


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        evaluate(args)
    except (EvaluateError, CheckpointError, ConfError, ValueError, TypeError, KeyError, ImportError, OSError,
            gym.error.Error) as err:
        # OSError: a link where the records go (UnsafePathError), a disk that refuses them
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
