"""EnvSpec: what an algorithm and its data transformers are built from, without the environment itself.

The collector that owns the training envs supplies it (the async unroll child reports it from its process); later an
offline dataset will. So exactly one training instance of each env exists, and a robot that can be opened only once
is opened once.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from alfish.data.types import StepType, TimeStep


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """The spaces of one env and the number of envs stepped together (picklable: it crosses processes).

    observation_space: a Box or a Dict of Boxes, as the env reports it (before data transformers).
    action_space: a Box, a Discrete, or a one-dimensional MultiDiscrete / MultiBinary (PPO and A2C only), or a
        ``MixedActionBox`` (a Tuple or Dict of one Discrete and one Box, packed; SAC only: envs/mixed_actions.py).
    num_envs: ``B``, envs in this process's batch.
    """

    observation_space: gym.Space
    action_space: gym.Space
    num_envs: int

    @staticmethod
    def of(env: Any) -> "EnvSpec":
        """The spec of a ``BatchedEnv`` (anything with ``observation_space``, ``action_space``, ``num_envs``)."""
        return EnvSpec(env.observation_space, env.action_space, env.num_envs)

    def zero_time_step(self) -> TimeStep:
        """A FIRST TimeStep ``[B]`` of zeros with the dtypes and shapes the env produces (for building structures:
        the replay buffer's layout, a check of what the rollout stores)."""
        n = self.num_envs
        space = self.observation_space
        if isinstance(space, gym.spaces.Dict):
            observation = {key: _zeros(n, leaf) for key, leaf in space.spaces.items()}
        else:
            observation = _zeros(n, space)
        dtype, shape = action_layout(self.action_space)
        prev_action = torch.zeros((n,) + shape, dtype=dtype)
        return TimeStep(step_type=torch.full((n,), StepType.FIRST, dtype=torch.int8), reward=torch.zeros(n),
                        discount=torch.ones(n), observation=observation, prev_action=prev_action,
                        env_id=torch.arange(n, dtype=torch.int64))


#: Action spaces of several discrete choices per step, driven as integer vectors (one categorical or one Bernoulli per
#: entry); only the algorithms whose policy has such a head accept them (``RLAlgorithm.drives_multi_actions``).
MULTI_ACTION_SPACES = (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


def action_layout(space: gym.Space) -> tuple[torch.dtype, tuple[int, ...]]:
    """``(dtype, shape)`` of one env's action as alfish's tensors hold it (env, rollout, replay, trajectories):
    Discrete: int64 ``()``; MultiDiscrete / MultiBinary: int64 ``(k,)`` (the env gets its space's own dtype, e.g.
    MultiBinary's int8); Box: float32 of its shape (a mixed action's ``MixedActionBox``: float32 ``(1 + d,)``)."""
    if isinstance(space, gym.spaces.Discrete):
        return torch.int64, ()
    if isinstance(space, MULTI_ACTION_SPACES):
        return torch.int64, tuple(space.shape)
    return torch.float32, tuple(space.shape)


def _zeros(num_envs: int, space: gym.spaces.Box) -> torch.Tensor:
    """Integer Boxes (uint8 images) keep their dtype, as ``BatchedEnv`` returns them; the rest are float32."""
    dtype = torch.from_numpy(np.zeros((), dtype=space.dtype)).dtype if np.issubdtype(space.dtype, np.integer) \
        else torch.float32
    return torch.zeros((num_envs,) + tuple(space.shape), dtype=dtype)
