"""Running-statistics normalizers of observations and rewards."""
from __future__ import annotations

from typing import Any, Optional, Sequence

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
    """``(obs - mean) / sqrt(var + eps)``, clipped to ``[-clip_value, clip_value]`` (0: no clipping).

    Statistics are updated from the rollout (every collected time step, ``update_mode='rollout'``) or from each replay
    sample (``'replay'``); evaluation and play only read them. Checkpointed with the model.
    ``fields``: for dict observations, the keys to normalize (default: all); must be None for Box observations.
    """

    def __init__(self, observation_space: gym.Space, clip_value: float = 5.0, epsilon: float = 1e-8,
                 update_mode: str = "rollout", fields: Optional[Sequence[str]] = None):
        super().__init__()
        if update_mode not in ("rollout", "replay"):
            raise ValueError(f"ObservationNormalizer.update_mode='{update_mode}' must be 'rollout' or 'replay'")
        self.clip_value, self.epsilon, self.update_mode = clip_value, epsilon, update_mode
        self.fields: Optional[list[str]] = None
        if isinstance(observation_space, gym.spaces.Dict):
            keys = list(observation_space.spaces)
            self.fields = list(fields) if fields is not None else keys
            unknown = [f for f in self.fields if f not in keys]
            if unknown:
                raise ValueError(f"ObservationNormalizer.fields={unknown} are not keys of the observation "
                                 f"space; its keys are {keys}")
            self.field_stats = torch.nn.ModuleDict(
                {f: RunningMeanStd(tuple(observation_space[f].shape)) for f in self.fields})
        elif fields is not None:
            raise ValueError(f"ObservationNormalizer.fields={list(fields)} needs dict observations; this "
                             f"observation space is {observation_space}: leave fields unset")
        else:
            self.stats = RunningMeanStd(tuple(observation_space.shape))

    def _normalize_one(self, stats: RunningMeanStd, obs: torch.Tensor, update: bool) -> torch.Tensor:
        if update:
            stats.update(obs)
        std = torch.sqrt(stats.variance() + self.epsilon)
        out = ((obs.double() - stats.mean) / std).to(torch.float32)
        return out.clamp(-self.clip_value, self.clip_value) if self.clip_value else out

    def _normalize(self, obs: Any, update: bool) -> Any:
        if self.fields is None:
            return self._normalize_one(self.stats, obs, update)
        return {k: self._normalize_one(self.field_stats[k], v, update) if k in self.field_stats else v
                for k, v in obs.items()}

    def normalize(self, obs: Any) -> Any:
        """Normalize without touching the statistics."""
        return self._normalize(obs, update=False)

    def transform_timestep(self, time_step: TimeStep, state: Any, update_stats: bool) -> tuple[TimeStep, Any]:
        update = update_stats and self.update_mode == "rollout"
        return time_step._replace(observation=self._normalize(time_step.observation, update)), state

    def transform_experience(self, exp: Experience) -> Experience:
        update = self.training and self.update_mode == "replay"
        return exp._replace(observation=self._normalize(exp.observation, update))


@gin.configurable
class RewardNormalizer(DataTransformer):
    """Divides rewards by the running standard deviation of the rewards seen in the rollout (no mean shift, so the
    sign of a reward is kept), clipped to ``[-clip_value, clip_value]``. Changes the data the algorithm learns from
    (rollout and experience views); returns in TensorBoard and evaluation stay the env's own."""

    def __init__(self, observation_space: Optional[gym.spaces.Box] = None, clip_value: float = 10.0,
                 epsilon: float = 1e-8):
        super().__init__()
        self.stats = RunningMeanStd(())
        self.clip_value, self.epsilon = clip_value, epsilon

    def transform_timestep(self, time_step: TimeStep, state: Any, update_stats: bool) -> tuple[TimeStep, Any]:
        if update_stats:
            self.stats.update(time_step.reward)
        return time_step._replace(reward=self._normalize(time_step.reward)), state

    def _normalize(self, reward: torch.Tensor) -> torch.Tensor:
        std = torch.sqrt(self.stats.variance() + self.epsilon).float()
        return (reward / std).clamp(-self.clip_value, self.clip_value)

    def transform_experience(self, exp: Experience) -> Experience:
        return exp._replace(reward=self._normalize(exp.reward))
