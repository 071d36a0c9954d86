"""What the device-storage sampling tests share: the replay buffer as ``build.py`` assembles it for
``DevicePolicy.replay_storage='device'`` (on the ``meta`` device: shapes, no values, so any read of a device value or
any host tensor mixed into device data raises), the two transformers that read the buffer at sample time, episodes
to fill it with, and the check that a nest of tensors lies on one device."""
from __future__ import annotations

import pathlib
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from alfish.algorithms import DqnAlgorithm
from alfish.config import TrainerConfig
from alfish.data import nest
from alfish.data.types import Experience, StepType
from alfish.envs.spec import EnvSpec
from alfish.learn.device import DevicePolicy
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.trainer.build import build_replay_buffer
from alfish.transforms import FrameStacker, HindsightExperienceTransformer, build_transformers
from alfish.transforms.base import SequentialDataTransformer

META = torch.device("meta")
NUM_ENVS, CAPACITY, BATCH, LENGTH, EPISODE = 2, 16, 6, 2, 5
ACTIONS = gym.spaces.Discrete(2)
BOX = gym.spaces.Box(-100.0, 100.0, shape=(3,), dtype=np.float32)
GOAL = gym.spaces.Box(-100.0, 100.0, shape=(2,), dtype=np.float32)
GOALS = gym.spaces.Dict({"achieved_goal": GOAL, "desired_goal": GOAL, "observation": GOAL})

#: name -> (observation space, transformer constructor): the transformers that read the buffer at sample time.
READERS = {
    "frame_stacker": (BOX, lambda observation_space: FrameStacker(observation_space, stack_size=3)),
    "hindsight": (GOALS, lambda observation_space: HindsightExperienceTransformer(observation_space,
                                                                                 her_proportion=1.0)),
}


def replay_config(root_dir: pathlib.Path, priority_replay: bool) -> TrainerConfig:
    """The replay settings of a small DQN run (``build_replay_buffer`` reads no other)."""
    return TrainerConfig(root_dir=str(root_dir), algorithm_ctor=DqnAlgorithm, whole_replay_buffer_training=False,
                         mini_batch_size=BATCH, mini_batch_length=LENGTH, replay_buffer_length=CAPACITY,
                         priority_replay=priority_replay)


def device_replay(root_dir: pathlib.Path, reader: str | None, priority_replay: bool,
                  device: torch.device = META) -> tuple[ReplayBuffer, SequentialDataTransformer, EnvSpec]:
    """The buffer ``build_replay_buffer`` makes for storage on ``device`` (the training device), with the
    transformer ``reader`` (``None``: none) built as the trainer builds it."""
    space, ctor = READERS[reader] if reader is not None else (BOX, None)
    transformer = build_transformers([ctor] if ctor is not None else None, space)
    spec = EnvSpec(space, ACTIONS, NUM_ENVS)
    buffer = build_replay_buffer(replay_config(root_dir, priority_replay), spec, transformer,
                                 DevicePolicy(replay_storage="device"), device)
    return buffer, transformer, spec


def step(spec: EnvSpec, t: int) -> Experience:
    """Step ``t`` of every env (on the host, as the collector hands it over): episodes of ``EPISODE`` steps, every
    float of the observation ``t``."""
    kind = StepType.FIRST if t % EPISODE == 0 else StepType.LAST if t % EPISODE == EPISODE - 1 else StepType.MID
    time_step = spec.zero_time_step()
    observation = nest.map_nest(lambda x: torch.full_like(x, float(t)), time_step.observation)
    return Experience(step_type=torch.full((NUM_ENVS,), kind, dtype=torch.int8), reward=torch.zeros(NUM_ENVS),
                      discount=torch.ones(NUM_ENVS), observation=observation,
                      action=torch.zeros(NUM_ENVS, dtype=torch.int64), env_id=torch.arange(NUM_ENVS))


def fill(buffer: Any, spec: EnvSpec, steps: int = 20) -> None:
    for t in range(steps):
        buffer.add(step(spec, t))


def assert_on(tree: Any, device: torch.device) -> None:
    """Every tensor of ``tree`` (a batch, a ``BatchInfo``: ``None`` weights are no tensor) is on ``device``."""
    tensors = [x for x in nest.flatten(tree) if isinstance(x, torch.Tensor)]
    assert tensors
    for x in tensors:
        assert x.device == device, f"a {tuple(x.shape)} {x.dtype} tensor is on {x.device}, not {device}"
