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
from typing import Optional, Sequence

import gin
import gymnasium as gym

from alfish.bin.stored_run import load_checkpoint, load_policy_config, one_line, restore_policy
from alfish.config import ConfError, TrainerConfig
from alfish.config.untrusted import TRUST_ALL, check_env_names, trusted_prefixes
from alfish.envs.batched_env import BatchedEnv, create_environment, environment_settings
from alfish.evaluate.evaluator import Evaluator, RecordedAt, write_evaluation
from alfish.rundir.checkpoint import Checkpointer, CheckpointError, LoadedCheckpoint
from alfish.seeding import EVAL_SEED_OFFSET
from alfish.trainer.summary import Summaries


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
    parser.add_argument("--allow_import", action="append", default=[], metavar="PREFIX",
                        help="trust the modules under PREFIX (your own env/network package), as play does; "
                             f"'{TRUST_ALL}' trusts this root_dir completely")
    return parser.parse_args(argv)


def checkpoints_to_evaluate(args: argparse.Namespace) -> list[LoadedCheckpoint]:
    if not args.all:
        return [load_checkpoint(args.root_dir, args.checkpoint_step, args.best)]
    checkpointer = Checkpointer(os.path.join(args.root_dir, "checkpoints"), root_dir=args.root_dir)
    loaded = []
    for step in checkpointer.steps():
        try:
            loaded.append(checkpointer.load(step))
        except CheckpointError as err:
            logging.warning("skipping checkpoint %d: %s", step, one_line(err))
    if not loaded:
        raise CheckpointError(f"no checkpoint that verifies under {args.root_dir}/checkpoints")
    return loaded


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
    total_envs = environment_settings().num_parallel_environments * int(ckpt.meta.get("world_size", 1))
    return max(0, iteration // config.resolved_eval_interval(total_envs) - 1)


def evaluate(args: argparse.Namespace) -> list[float]:
    """Evaluate the checkpoints ``args`` names; returns their average returns."""
    if args.num_episodes is not None and args.num_episodes < 1:
        raise EvaluateError(f"--num_episodes {args.num_episodes} must be >= 1")
    trusted = trusted_prefixes(args.allow_import)
    out_dir = args.out_dir or os.path.join(args.root_dir, "evaluations")
    returns: list[float] = []
    env = summaries = None
    try:
        for ckpt in checkpoints_to_evaluate(args):
            config = load_policy_config(args.root_dir, ckpt, trusted, "evaluate")
            seed = args.seed if args.seed is not None else int(ckpt.meta.get("seed", 0)) + EVAL_SEED_OFFSET
            if env is None:
                env = create_eval_env(config, seed, trusted)
                os.makedirs(out_dir, exist_ok=True)
                summaries = Summaries(out_dir, interval=1, first_interval=False, flush_secs=10, max_queue=100)
            transformer, algorithm = restore_policy(config, env, ckpt)
            evaluator = Evaluator(env, args.num_episodes or config.num_eval_episodes,
                                  config.epsilon_greedy if args.epsilon_greedy is None else args.epsilon_greedy,
                                  seed=seed, transform=transformer.rollout_view(update_stats=False),
                                  uncertainty=config.eval_uncertainty)
            iteration, env_steps = int(ckpt.meta.get("iteration", 0)), int(ckpt.meta.get("env_steps", 0))
            evaluator.num_evaluations = evaluation_index(config, ckpt, iteration)
            start = time.monotonic()
            result = evaluator.evaluate(algorithm)
            write_evaluation(result, summaries, out_dir,
                             RecordedAt(iteration, env_steps, float(ckpt.meta.get("elapsed_s", 0))),
                             time.monotonic() - start)
            print(f"{ckpt.path}: average return {result.average_return:.3f} over {result.num_episodes} episodes",
                  flush=True)
            returns.append(result.average_return)
        if summaries is not None:
            summaries.flush()
    finally:
        if summaries is not None:
            summaries.close()
        if env is not None:
            env.close()
    return returns


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        evaluate(args)
    except (EvaluateError, CheckpointError, ConfError, ValueError, TypeError, KeyError, ImportError,
            gym.error.Error) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
