"""Data transformers: statistics against numpy, what each view changes, the order rule, checkpoint state."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.data.types import Experience, StepType, TimeStep
from alfish.transforms import (DataTransformer, ObservationNormalizer, RewardClipping, RewardNormalizer,
                               RewardScaling, RunningMeanStd, SequentialDataTransformer, build_transformers)

BOX = gym.spaces.Box(-10.0, 10.0, shape=(3,), dtype=np.float32)


def time_step(obs, reward=None):
    n = obs.shape[0]
    return TimeStep(torch.full((n,), StepType.MID, dtype=torch.int8),
                    torch.zeros(n) if reward is None else reward, torch.ones(n), obs, torch.zeros(n, 1),
                    torch.arange(n))


def experience(obs, reward):
    shape = reward.shape
    return Experience(torch.full(shape, StepType.MID, dtype=torch.int8), reward, torch.ones(shape), obs,
                      torch.zeros(shape + (1,)), torch.zeros(shape, dtype=torch.long))


def test_running_mean_std_matches_numpy_over_uneven_batches():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(1000, 3))
    stats = RunningMeanStd((3,))
    for chunk in np.split(data, [1, 7, 100, 555]):
        stats.update(torch.as_tensor(chunk))
    assert int(stats.count) == 1000
    np.testing.assert_allclose(stats.mean.numpy(), data.mean(0), rtol=1e-10)
    np.testing.assert_allclose(stats.variance().numpy(), data.var(0), rtol=1e-10)


def test_observation_normalizer_normalizes_clips_and_updates_only_when_asked():
    norm = ObservationNormalizer(BOX, clip_value=1.5)
    obs = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 5.0]])
    out = norm.transform_timestep(time_step(obs), update_stats=True).observation
    # mean (2, 2, 4), population std (1, 0, 1): first column -> -1, +1; second -> 0 (std 0, eps only); third -1, +1
    assert torch.allclose(out, torch.tensor([[-1.0, 0.0, -1.0], [1.0, 0.0, 1.0]]), atol=1e-4)
    frozen = norm.stats.count.clone()
    far = norm.transform_timestep(time_step(torch.tensor([[100.0, 2.0, 4.0]])), update_stats=False).observation
    assert torch.equal(norm.stats.count, frozen)  # evaluation does not move the statistics
    assert far[0, 0].item() == pytest.approx(1.5)  # (100 - 2) / 1 clipped to clip_value


def test_observation_normalizer_replay_mode_updates_from_experience():
    norm = ObservationNormalizer(BOX, update_mode="replay")
    norm.transform_timestep(time_step(torch.ones(2, 3)), update_stats=True)
    assert int(norm.stats.count) == 0
    exp = experience(torch.arange(12.0).reshape(2, 2, 3), torch.zeros(2, 2))
    norm.transform_experience(exp)
    assert int(norm.stats.count) == 4
    with pytest.raises(ValueError, match="update_mode='both' must be 'rollout' or 'replay'"):
        ObservationNormalizer(BOX, update_mode="both")


def test_reward_transformers_by_hand():
    exp = experience(torch.zeros(1, 4, 3), torch.tensor([[-3.0, -0.5, 0.5, 3.0]]))
    assert torch.equal(RewardScaling(scale=2.0).transform_experience(exp).reward,
                       torch.tensor([[-6.0, -1.0, 1.0, 6.0]]))
    assert torch.equal(RewardClipping(minimum=-1.0, maximum=1.0).transform_experience(exp).reward,
                       torch.tensor([[-1.0, -0.5, 0.5, 1.0]]))
    with pytest.raises(ValueError, match="RewardClipping.minimum=2 must be <= RewardClipping.maximum=1"):
        RewardClipping(minimum=2, maximum=1)
    normalizer = RewardNormalizer()
    normalizer.transform_timestep(time_step(torch.zeros(4, 3), torch.tensor([-2.0, 0.0, 2.0, 0.0])), True)
    # population std of (-2, 0, 2, 0) = sqrt(2): rewards are divided by it, signs kept
    out = normalizer.transform_experience(exp).reward
    assert torch.allclose(out, exp.reward / 2 ** 0.5, atol=1e-5)


class _ReadsBuffer(DataTransformer):
    reads_buffer = True


def test_buffer_reading_transformer_after_another_is_an_error_naming_both():
    with pytest.raises(ValueError, match="_ReadsBuffer reads the replay buffer, so it must come before "
                                         "RewardScaling; reorder TrainerConfig.data_transformer_ctor"):
        SequentialDataTransformer([RewardScaling(), _ReadsBuffer()])
    SequentialDataTransformer([_ReadsBuffer(), RewardScaling()])  # the right order builds


def test_build_transformers_accepts_one_or_a_list_and_round_trips_state():
    one = build_transformers(ObservationNormalizer, BOX)
    assert len(one.transformers) == 1
    both = build_transformers([ObservationNormalizer, RewardScaling], BOX)
    both.transform_timestep(time_step(torch.randn(5, 3)), update_stats=True)
    fresh = build_transformers([ObservationNormalizer, RewardScaling], BOX)
    fresh.load_state_dict(both.state_dict())
    obs = torch.randn(2, 3)
    assert torch.equal(fresh.transform_timestep(time_step(obs), False).observation,
                       both.transform_timestep(time_step(obs), False).observation)
    assert len(build_transformers(None, BOX).transformers) == 0
