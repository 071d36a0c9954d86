"""Keep a raw copy of the data for algorithms that need it next to the transformed one."""
from __future__ import annotations

from typing import Any

import gin
import gymnasium as gym

from alfish.data import nest
from alfish.data.types import BatchInfo, Experience, TimeStep
from alfish.transforms.base import STAGE_UNTRANSFORMED, DataTransformer


@gin.configurable
class UntransformedTimeStep(DataTransformer):
    """Sets ``untransformed`` to the raw data: the raw ``TimeStep`` in the rollout view, the raw sampled
    ``Experience`` ``[B, L]`` in the sample view (it becomes ``[L, B]`` with the rest). Must be the first transformer,
    so what it keeps is what the env produced (e.g. the unnormalized observation, the unshaped reward)."""

    stage = STAGE_UNTRANSFORMED

    def __init__(self, observation_space: gym.Space = None):
        super().__init__()

    def transform_timestep(self, time_step: TimeStep, state: Any, update_stats: bool) -> tuple[TimeStep, Any]:
        return nest.replace_fields(time_step, untransformed=time_step), state

    def transform_sample(self, exp: Experience, batch_info: BatchInfo, replay: Any) -> Experience:
        return nest.replace_fields(exp, untransformed=exp)
