"""Synchronous evaluation of the greedy (or epsilon-greedy) policy on separate environments."""
from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any, Callable, NamedTuple, Optional

import torch

from alfish.algorithms.base import Algorithm
from alfish.collect.unroller import to_device
from alfish.data.types import StepType, TimeStep
from alfish.envs.batched_env import BatchedEnv
from alfish.learn.device import CPU
from alfish.seeding import reseed


class EvalResult(NamedTuple):
    average_return: float
    average_length: float
    num_episodes: int


class Evaluator:
    """Runs ``num_episodes`` on ``env`` (``B`` envs).

    Counting is unbiased towards short episodes: each env contributes exactly its first ``ceil(num_episodes / B)``
    episodes, so the result averages ``B * ceil(num_episodes / B)`` episodes. Each evaluation resets the envs with a
    new seed (``reseed(seed, k)`` for the k-th evaluation): reproducible, but not always the same start states.
    """

    def __init__(self, env: BatchedEnv, num_episodes: int, epsilon_greedy: float, seed: int = 0,
                 max_steps: int = 1_000_000, transform: Optional[Callable[[TimeStep], TimeStep]] = None):
        self.env = env
        self.transform = transform or (lambda time_step: time_step)  # data transformers, statistics frozen
        self.seed = seed
        self.num_evaluations = 0
        self.per_env = math.ceil(num_episodes / env.num_envs)
        self.epsilon_greedy = epsilon_greedy
        self.max_steps = max_steps

    @torch.inference_mode()
    def evaluate(self, algorithm: Algorithm) -> EvalResult:
        was_training = algorithm.training
        algorithm.eval()
        n = self.env.num_envs
        device = next(iter(algorithm.parameters())).device  # the evaluator acts where the algorithm trains
        done = torch.zeros(n, dtype=torch.int64)
        ret = torch.zeros(n, dtype=torch.float64)
        length = torch.zeros(n, dtype=torch.int64)
        returns, lengths = [], []
        time_step = self.env.reset(seed=reseed(self.seed, self.num_evaluations))
        self.num_evaluations += 1
        state = algorithm.initial_state(n, device)
        for _ in range(self.max_steps):
            if bool((done >= self.per_env).all()):
                break
            seen = self.transform(to_device(time_step, device))  # to the policy's device and back: once per step each
            # a recurrent policy's state is reset at each FIRST step (EMPTY, untouched, for a stateless one)
            alg_step = algorithm.predict_step(seen, algorithm.reset_state(state, seen.step_type),
                                              epsilon_greedy=self.epsilon_greedy)
            action, state = to_device(alg_step.output, CPU), alg_step.state
            time_step = self.env.step(action)
            counting = (done < self.per_env) & (time_step.step_type != StepType.FIRST)
            ret += torch.where(counting, time_step.reward.double(), 0.0)
            length += counting.long()
            finished = counting & (time_step.step_type == StepType.LAST)
            if bool(finished.any()):
                returns += ret[finished].tolist()
                lengths += length[finished].tolist()
                ret[finished], length[finished] = 0.0, 0
                done += finished.long()
        else:
            raise RuntimeError(f"evaluation did not finish {self.per_env} episodes per env within {self.max_steps} "
                               "steps; does the env ever end an episode (add a TimeLimit)?")
        algorithm.train(was_training)
        return EvalResult(sum(returns) / len(returns), sum(lengths) / len(lengths), len(returns))


def record_evaluation(evaluator: Evaluator, algorithm: Algorithm, summaries: Any, root_dir: str, counters: Any) -> None:
    """Evaluate, then write the result to TensorBoard (``eval/``), one line to ``root_dir/eval_log.jsonl`` and the log.

    ``counters``: the trainer's (``iteration``, ``env_steps``, ``elapsed_s()``).
    """
    start = time.monotonic()
    result = evaluator.evaluate(algorithm)
    it, env_steps = counters.iteration, counters.env_steps
    summaries.scalars("eval", dict(average_return=result.average_return,
                                   average_episode_length=result.average_length, num_episodes=result.num_episodes), it)
    summaries.scalar("eval_vs_env_steps/average_return", result.average_return, env_steps)
    seconds = time.monotonic() - start
    record = dict(iteration=it, env_steps=env_steps, elapsed_s=round(counters.elapsed_s(), 3), eval_s=round(seconds, 3),
                  average_return=result.average_return, average_episode_length=result.average_length,
                  num_episodes=result.num_episodes)
    with open(os.path.join(root_dir, "eval_log.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")
    logging.info("eval at iteration %d (env steps %d): return %.2f, length %.1f over %d episodes (%.1fs)", it,
                 env_steps, result.average_return, result.average_length, result.num_episodes, seconds)
