"""Synchronous unrolling: step the batched env with the algorithm's rollout policy."""
from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch

from alfish.algorithms.base import Algorithm
from alfish.data import nest
from alfish.data.types import AlgStep, Experience, TimeStep
from alfish.envs.batched_env import BatchedEnv
from alfish.trainer.metrics import EpisodeStats


class Unroller:
    """Owns the env's current TimeStep; each stored step is ``(time_step, action chosen at it, rollout info)``.

    ``transform`` maps the raw TimeStep to what the algorithm sees (data transformers' rollout view, updating their
    statistics); off-policy storage keeps the raw step, the on-policy trajectory the transformed one.
    """

    def __init__(self, env: BatchedEnv, algorithm: Algorithm, stats: EpisodeStats,
                 transform: Optional[Callable[[TimeStep], TimeStep]] = None):
        self.env, self.algorithm, self.stats = env, algorithm, stats
        self.transform = transform or (lambda time_step: time_step)
        self.time_step: TimeStep = env.reset()
        self._seen: Optional[TimeStep] = None  # self.time_step transformed (each env step is transformed once)
        self.stats.observe(self.time_step)

    def reset(self, seed: Optional[int] = None) -> None:
        self.time_step = self.env.reset(seed)
        self._seen = None
        self.stats.observe(self.time_step)

    def seen(self) -> TimeStep:
        """The current time step as the algorithm sees it. Transformed once per env step: stateful transformers
        (frame stacking) and running statistics must not see a step twice."""
        if self._seen is None:
            self._seen = self.transform(self.time_step)
        return self._seen

    def unroll(self, num_steps: int, store: Callable[[Experience], None], with_grad: bool,
               store_transformed: bool = False, random_actions: bool = False) -> None:
        """Take ``num_steps`` steps per env, handing each stored step ``[B, ...]`` to ``store`` (the raw step, or
        the transformed one with ``store_transformed``).

        Off-policy rollouts run under ``torch.inference_mode`` unless ``with_grad``. ``random_actions``: uniformly
        random actions instead of the policy's (a warm-up for algorithms whose rollout stores no info).
        """
        mode = contextlib.nullcontext() if with_grad else torch.inference_mode()
        with mode:
            for _ in range(num_steps):
                seen = self.seen()  # transformed even when acting randomly: running statistics see every step
                if random_actions:
                    alg_step = AlgStep(output=self.env.random_action())
                else:
                    alg_step = self.algorithm.rollout_step(seen)
                stored = seen if store_transformed else self.time_step
                store(Experience.from_time_step(stored, alg_step.output, alg_step.info))
                self.time_step, self._seen = self.env.step(alg_step.output), None
                self.stats.observe(self.time_step)

    def unroll_on_policy(self, num_steps: int) -> Experience:
        """Unroll with gradients and return the trajectory ``[num_steps + 1, B]``; the last row is the current step
        with its rollout info computed without gradients (it only bootstraps; its action is not taken)."""
        steps: list[Experience] = []
        self.unroll(num_steps, steps.append, with_grad=True, store_transformed=True)
        with torch.no_grad():
            seen = self.seen()
            alg_step = self.algorithm.rollout_step(seen)
        steps.append(Experience.from_time_step(seen, alg_step.output, alg_step.info))
        return nest.stack(steps)
