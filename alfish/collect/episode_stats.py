"""Episode return and length of the training envs, tracked from the stream of TimeSteps without per-env Python
loops."""
from __future__ import annotations

from collections import deque

import torch

from alfish.data.types import StepType, TimeStep


class EpisodeStats:
    """Accumulates each env's return and length; keeps the last ``window`` finished episodes.

    Length counts actions taken (non-FIRST steps); the return sums their rewards.
    """

    def __init__(self, num_envs: int, window: int = 10):
        self._return = torch.zeros(num_envs, dtype=torch.float64)
        self._length = torch.zeros(num_envs, dtype=torch.int64)
        self.returns: deque[float] = deque(maxlen=window)
        self.lengths: deque[int] = deque(maxlen=window)
        self.num_episodes = 0

    def observe(self, time_step: TimeStep) -> None:
        first = time_step.step_type == StepType.FIRST
        self._return = torch.where(first, 0.0, self._return + time_step.reward.double())
        self._length = torch.where(first, 0, self._length + 1)
        last = time_step.step_type == StepType.LAST
        if bool(last.any()):
            for r, n in zip(self._return[last].tolist(), self._length[last].tolist()):
                self.returns.append(r)
                self.lengths.append(n)
            self.num_episodes += int(last.sum())

    def average_return(self) -> float:
        return sum(self.returns) / len(self.returns) if self.returns else float("nan")

    def average_length(self) -> float:
        return sum(self.lengths) / len(self.lengths) if self.lengths else float("nan")
