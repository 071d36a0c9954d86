"""Offline data next to an online buffer whose storage is on the training device, assembled as the trainer does it
(``build_replay_buffer``, ``build_offline_replay``, ``combine_replay``): the data stay on the host, the online rings on
the device (``meta`` in the CPU tests: see ``tests/replay/device_parts.py``)."""
from __future__ import annotations

import pathlib

import gymnasium as gym
import numpy as np
import torch

from alfish.algorithms import DqnAlgorithm
from alfish.data.types import StepType
from alfish.replay.offline.mixed import MixedReplayBuffer
from alfish.replay.offline.options import OfflineOptions
from alfish.replay.offline.steps import Steps
from alfish.trainer.offline_parts import build_offline_replay, combine_replay
from alfish.transforms.base import SequentialDataTransformer
from tests.replay.device_parts import ACTIONS, EPISODE, META, device_replay, fill, replay_config


def offline_steps(space: gym.Space, episodes: int = 3) -> Steps:
    """``episodes`` episodes of ``EPISODE`` steps in ``space``: every float of step ``t``'s observation is ``-1 - t``
    (the online steps' are ``t >= 0``: a row says which part it came from)."""
    t = np.arange(episodes * EPISODE)
    kind = np.where(t % EPISODE == 0, StepType.FIRST, np.where(t % EPISODE == EPISODE - 1, StepType.LAST,
                                                                 StepType.MID)).astype(np.int8)

    def observed(box: gym.spaces.Box) -> np.ndarray:
        return np.broadcast_to((-1.0 - t).reshape((-1,) + (1,) * len(box.shape)), t.shape + box.shape).astype(
            np.float32)

    observation = ({k: observed(s) for k, s in space.spaces.items()} if isinstance(space, gym.spaces.Dict)
                   else observed(space))
    return Steps(step_type=kind, reward=np.zeros(len(t), np.float32), discount=np.ones(len(t), np.float32),
                 observation=observation, action=np.zeros(len(t), np.int64), num_episodes=episodes,
                 observation_space=space, action_space=ACTIONS, source="test data")


def device_mixture(root_dir: pathlib.Path, reader: str | None, priority_replay: bool, mixing: str = "mixed",
                   device: torch.device = META) -> tuple[MixedReplayBuffer, SequentialDataTransformer]:
    """The online buffer (storage on ``device``, filled) and the offline data (host), joined as the trainer joins
    them for ``OfflineData.mixing``; with the transformer ``reader`` (``None``: none)."""
    online, transformer, spec = device_replay(root_dir, reader, priority_replay, device)
    fill(online, spec)
    options = OfflineOptions(mixing=mixing, init_normalizers=False)
    algorithm = DqnAlgorithm(transformer.output_observation_space(spec.observation_space), ACTIONS, hidden_sizes=(4,))
    offline = build_offline_replay(replay_config(root_dir, priority_replay), options,
                                   offline_steps(spec.observation_space), algorithm, transformer, spec, device)
    return combine_replay(online, offline, options), transformer


def host_trees_record(buffer, received: list, monkeypatch) -> None:
    """Priorities for ``buffer``'s host trees are recorded instead of applied: on CUDA they are copied back without
    waiting and applied later (``DeferredPriorities``); meta priorities have no values to copy."""
    assert buffer.sampler.device == torch.device("cpu")
    monkeypatch.setattr(buffer.sampler, "update_priorities",
                        lambda storage, info, priorities: received.append((info, priorities)))
