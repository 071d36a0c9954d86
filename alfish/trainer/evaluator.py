"""Synchronous evaluation of the greedy (or epsilon-greedy) policy on separate environments."""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import torch

from alfish.algorithms.base import Algorithm
from alfish.data.types import StepType, TimeStep
from alfish.envs.batched_env import BatchedEnv


class EvalResult(NamedTuple):
    average_return: float
    average_length: float
    num_episodes: int


class Evaluator:
    """Runs ``num_episodes`` on ``env`` (``B`` envs).

    Counting is unbiased towards short episodes: each env contributes exactly its first ``ceil(num_episodes / B)``
    episodes, so the result averages ``B * ceil(num_episodes / B)`` episodes. Each evaluation resets the envs with a
    new seed (``seed + 7919 * k`` for the k-th evaluation): reproducible, but not always the same start states.
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
        done = torch.zeros(n, dtype=torch.int64)
        ret = torch.zeros(n, dtype=torch.float64)
        length = torch.zeros(n, dtype=torch.int64)
        returns, lengths = [], []
        time_step = self.env.reset(seed=self.seed + 7919 * self.num_evaluations)
        self.num_evaluations += 1
        for _ in range(self.max_steps):
            if bool((done >= self.per_env).all()):
                break
            action = algorithm.predict_step(self.transform(time_step), epsilon_greedy=self.epsilon_greedy).output
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
