"""Normalizer statistics initialised from offline data (OfflineData.init_normalizers), against numpy by hand."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.replay.offline.d4rl import d4rl_to_steps
from alfish.replay.offline.statistics import init_normalizers
from alfish.transforms.base import SequentialDataTransformer
from alfish.transforms.frame_stacker import FrameStacker
from alfish.transforms.normalizers import ObservationNormalizer, RewardNormalizer
from tests.replay.test_offline_d4rl import two_episodes


def test_observation_and_reward_normalizers_start_from_the_datas_statistics():
    steps = d4rl_to_steps(two_episodes())  # observations 0 1 2 20 3 4 40; rewards of non-FIRST steps 1 2 3 4 5
    space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    obs_norm, rew_norm = ObservationNormalizer(space), RewardNormalizer(space)
    assert init_normalizers(SequentialDataTransformer([obs_norm, rew_norm]), steps) == [
        "ObservationNormalizer", "RewardNormalizer"]
    observations = np.array([0, 1, 2, 20, 3, 4, 40], np.float64)
    assert obs_norm.stats.mean.item() == pytest.approx(observations.mean())
    assert obs_norm.stats.variance().item() == pytest.approx(observations.var(), rel=1e-6)
    assert rew_norm.stats.variance().item() == pytest.approx(np.var([1.0, 2.0, 3.0, 4.0, 5.0]), rel=1e-6)
    normalized = obs_norm.normalize(torch.tensor([[40.0]]))
    assert normalized.item() == pytest.approx(min(5.0, (40 - observations.mean()) / observations.std()), rel=1e-5)


def test_a_normalizer_after_a_frame_stacker_is_left_to_the_rollout():
    steps = d4rl_to_steps(two_episodes())
    space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    stacker = FrameStacker(space, stack_size=2)
    obs_norm = ObservationNormalizer(stacker.output_observation_space(space))
    before = obs_norm.stats.count.clone()
    assert init_normalizers(SequentialDataTransformer([stacker, obs_norm]), steps) == []
    assert torch.equal(obs_norm.stats.count, before)  # untouched: it never sees raw observations
