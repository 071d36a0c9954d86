"""Running-statistics normalizers of observations and rewards."""
from __future__ import annotations

from typing import Optional

import gin
import gymnasium as gym
import torch

from alfish.data.types import Experience, TimeStep
from alfish.transforms.base import DataTransformer


class RunningMeanStd(torch.nn.Module):
    """Mean and variance over every value seen, merged batch by batch (Chan et al.'s parallel update), float64.

    ``shape``: the shape of one value; batches are ``[N, *shape]``.
    """

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("m2", torch.zeros(shape, dtype=torch.float64))

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        batch = batch.reshape((-1,) + tuple(self.mean.shape)).double()
        n = batch.shape[0]
        if n == 0:
            return
        batch_mean = batch.mean(0)
        batch_m2 = ((batch - batch_mean) ** 2).sum(0)
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * (n / total)
        self.m2 += batch_m2 + delta ** 2 * (self.count * n / total)
        self.count.copy_(total)

    def variance(self) -> torch.Tensor:
        """Population variance (1 before anything was seen)."""
        return torch.where(self.count > 0, self.m2 / self.count.clamp(min=1.0), torch.ones_like(self.m2))


@gin.configurable
class ObservationNormalizer(DataTransformer):
    """``(obs - mean) / sqrt(var + eps)``, clipped to ``[-clip_value, clip_value]``.

    Statistics are updated from the rollout (every collected time step, ``update_mode='rollout'``) or from each replay
    sample (``'replay'``); evaluation and play only read them. Checkpointed with the model.
    """

    def __init__(self, observation_space: gym.spaces.Box, clip_value: float = 5.0, epsilon: float = 1e-8,
                 update_mode: str = "rollout"):
        super().__init__()
        if update_mode not in ("rollout", "replay"):
            raise ValueError(f"ObservationNormalizer.update_mode='{update_mode}' must be 'rollout' or 'replay'")
        self.stats = RunningMeanStd(tuple(observation_space.shape))
        self.clip_value, self.epsilon, self.update_mode = clip_value, epsilon, update_mode

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        std = torch.sqrt(self.stats.variance() + self.epsilon)
        out = ((obs.double() - self.stats.mean) / std).to(obs.dtype)
        return out.clamp(-self.clip_value, self.clip_value) if self.clip_value else out

    def transform_timestep(self, time_step: TimeStep, update_stats: bool) -> TimeStep:
        if update_stats and self.update_mode == "rollout":
            self.stats.update(time_step.observation)
        return time_step._replace(observation=self.normalize(time_step.observation))

    def transform_experience(self, exp: Experience) -> Experience:
        if self.training and self.update_mode == "replay":
            self.stats.update(exp.observation)
        return exp._replace(observation=self.normalize(exp.observation))


@gin.configurable
class RewardNormalizer(DataTransformer):
    """Divides rewards by the running standard deviation of the rewards seen in the rollout (no mean shift, so the
    sign of a reward is kept), clipped to ``[-clip_value, clip_value]``. Applied to training experience only."""

    def __init__(self, observation_space: Optional[gym.spaces.Box] = None, clip_value: float = 10.0,
                 epsilon: float = 1e-8):
        super().__init__()
        self.stats = RunningMeanStd(())
        self.clip_value, self.epsilon = clip_value, epsilon

    def transform_timestep(self, time_step: TimeStep, update_stats: bool) -> TimeStep:
        if update_stats:
            self.stats.update(time_step.reward)
        return time_step

    def transform_experience(self, exp: Experience) -> Experience:
        std = torch.sqrt(self.stats.variance() + self.epsilon).float()
        return exp._replace(reward=(exp.reward / std).clamp(-self.clip_value, self.clip_value))
