"""Image observations: stored as integers (uint8), scaled to floats only on the way into the algorithm."""
from __future__ import annotations

from typing import Any

import gin
import gymnasium as gym
import numpy as np
import torch

from alfish.data import nest
from alfish.data.types import Experience, TimeStep
from alfish.transforms.base import DataTransformer


@gin.configurable
class ImageScaleTransformer(DataTransformer):
    """``uint8 [0, 255] -> float32 [min, max]`` (default ``[-1, 1]``) for the observation (or, for dict observations,
    the ``fields`` given). The replay buffer keeps the uint8 frames: 1 byte per pixel instead of 4."""

    def __init__(self, observation_space: gym.Space, min: float = -1.0, max: float = 1.0,  # noqa: A002 (ALF's names)
                 fields: Any = None):
        super().__init__()
        if min >= max:
            raise ValueError(f"ImageScaleTransformer.min={min} must be < ImageScaleTransformer.max={max}")
        self.low, self.high = float(min), float(max)
        if isinstance(observation_space, gym.spaces.Dict):
            self.fields = list(fields) if fields is not None else list(observation_space.spaces)
            spaces = {f: observation_space[f] for f in self.fields}
        else:
            if fields is not None:
                raise ValueError(f"ImageScaleTransformer.fields={fields} needs dict observations; leave it unset "
                                 f"for {observation_space}")
            self.fields, spaces = None, {"observation": observation_space}
        for name, space in spaces.items():
            if not (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8):
                raise ValueError(f"ImageScaleTransformer scales uint8 images, but {name} is {space}")

    def output_observation_space(self, input_space: gym.Space) -> gym.Space:
        def scaled(space: gym.spaces.Box) -> gym.spaces.Box:
            return gym.spaces.Box(self.low, self.high, shape=space.shape, dtype=np.float32)
        if self.fields is None:
            return scaled(input_space)
        return gym.spaces.Dict({k: scaled(v) if k in self.fields else v for k, v in input_space.spaces.items()})

    def _scale(self, obs: Any) -> Any:
        one = lambda x: x.to(torch.float32) * ((self.high - self.low) / 255.0) + self.low  # noqa: E731
        if self.fields is None:
            return one(obs)
        return {k: one(v) if k in self.fields else v for k, v in obs.items()}

    def transform_timestep(self, time_step: TimeStep, state: Any, update_stats: bool) -> tuple[TimeStep, Any]:
        return nest.replace_fields(time_step, observation=self._scale(time_step.observation)), state

    def transform_experience(self, exp: Experience) -> Experience:
        return nest.replace_fields(exp, observation=self._scale(exp.observation))
