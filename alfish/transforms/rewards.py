"""Stateless reward shaping of the data the algorithm learns from (returns in TensorBoard and evaluation stay the
env's own). Both views change the reward: the rollout view feeds on-policy training, the experience view replay."""
from __future__ import annotations

from typing import Any, Optional

import gin
import gymnasium as gym

from alfish.data import nest
from alfish.data.types import Experience, TimeStep
from alfish.transforms.base import DataTransformer


@gin.configurable
class RewardScaling(DataTransformer):
    """``reward * scale``."""

    def __init__(self, observation_space: Optional[gym.spaces.Box] = None, scale: float = 1.0):
        super().__init__()
        self.scale = scale

    def transform_timestep(self, time_step: TimeStep, state: Any, update_stats: bool) -> tuple[TimeStep, Any]:
        return nest.replace_fields(time_step, reward=time_step.reward * self.scale), state

    def transform_experience(self, exp: Experience) -> Experience:
        return nest.replace_fields(exp, reward=exp.reward * self.scale)


@gin.configurable
class RewardClipping(DataTransformer):
    """``clamp(reward, minimum, maximum)``."""

    def __init__(self, observation_space: Optional[gym.spaces.Box] = None, minimum: float = -1.0,
                 maximum: float = 1.0):
        super().__init__()
        if minimum > maximum:
            raise ValueError(f"RewardClipping.minimum={minimum} must be <= RewardClipping.maximum={maximum}")
        self.minimum, self.maximum = minimum, maximum

    def transform_timestep(self, time_step: TimeStep, state: Any, update_stats: bool) -> tuple[TimeStep, Any]:
        return nest.replace_fields(time_step, reward=time_step.reward.clamp(self.minimum, self.maximum)), state

    def transform_experience(self, exp: Experience) -> Experience:
        return nest.replace_fields(exp, reward=exp.reward.clamp(self.minimum, self.maximum))
