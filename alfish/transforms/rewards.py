"""Stateless reward shaping applied to training experience (the env's own rewards still drive the return metrics)."""
from __future__ import annotations

from typing import Optional

import gin
import gymnasium as gym

from alfish.data.types import Experience
from alfish.transforms.base import DataTransformer


@gin.configurable
class RewardScaling(DataTransformer):
    """``reward * scale``."""

    def __init__(self, observation_space: Optional[gym.spaces.Box] = None, scale: float = 1.0):
        super().__init__()
        self.scale = scale

    def transform_experience(self, exp: Experience) -> Experience:
        return exp._replace(reward=exp.reward * self.scale)


@gin.configurable
class RewardClipping(DataTransformer):
    """``clamp(reward, minimum, maximum)``."""

    def __init__(self, observation_space: Optional[gym.spaces.Box] = None, minimum: float = -1.0,
                 maximum: float = 1.0):
        super().__init__()
        if minimum > maximum:
            raise ValueError(f"RewardClipping.minimum={minimum} must be <= RewardClipping.maximum={maximum}")
        self.minimum, self.maximum = minimum, maximum

    def transform_experience(self, exp: Experience) -> Experience:
        return exp._replace(reward=exp.reward.clamp(self.minimum, self.maximum))
