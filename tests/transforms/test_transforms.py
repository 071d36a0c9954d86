"""Data transformers: statistics against numpy, what each view changes, the order rule, checkpoint state."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.data.types import BatchInfo, Experience, StepType, TimeStep
from alfish.replay.batching import to_time_major
from alfish.transforms import (
    FrameStacker,
    HindsightExperienceTransformer,
    ImageScaleTransformer,
    ObservationNormalizer,
    RewardClipping,
    RewardNormalizer,
    RewardScaling,
    RunningMeanStd,
    SequentialDataTransformer,
    UntransformedTimeStep,
    build_transformers,
)

BOX = gym.spaces.Box(-10.0, 10.0, shape=(3,), dtype=np.float32)
_GOAL = gym.spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float32)
GOAL_SPACE = gym.spaces.Dict({"achieved_goal": _GOAL, "desired_goal": _GOAL, "observation": _GOAL})


def time_step(obs, reward=None):
    n = reward.shape[0] if reward is not None else obs.shape[0]
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
    out = norm.transform_timestep(time_step(obs), None, update_stats=True)[0].observation
    # mean (2, 2, 4), population std (1, 0, 1): first column -> -1, +1; second -> 0 (std 0, eps only); third -1, +1
    assert torch.allclose(out, torch.tensor([[-1.0, 0.0, -1.0], [1.0, 0.0, 1.0]]), atol=1e-4)
    frozen = norm.stats.count.clone()
    far = norm.transform_timestep(time_step(torch.tensor([[100.0, 2.0, 4.0]])), None, False)[0].observation
    assert torch.equal(norm.stats.count, frozen)  # evaluation does not move the statistics
    assert far[0, 0].item() == pytest.approx(1.5)  # (100 - 2) / 1 clipped to clip_value


def test_observation_normalizer_freezes_an_iterations_statistics_for_its_rollout_and_training():
    norm = ObservationNormalizer(BOX, clip_value=0)
    norm.transform_timestep(time_step(torch.tensor([[0.0] * 3, [2.0] * 3])), None, update_stats=True)  # mean 1, var 1
    norm.begin_iteration()
    four = torch.full((1, 3), 4.0)
    rollout = norm.transform_timestep(time_step(four), None, update_stats=True)[0].observation
    assert torch.allclose(rollout, torch.full((1, 3), 3.0))  # (4 - 1) / 1 with the frozen statistics...
    assert int(norm.stats.count) == 3  # ...while the 4 is counted: 0, 2, 4 have mean 2 and variance 8/3
    trained = norm.transform_experience(experience(four.view(1, 1, 3), torch.zeros(1, 1))).observation
    assert torch.allclose(trained, torch.full((1, 1, 3), 3.0))  # the training batch normalizes as the rollout did
    newest = 2.0 / (8.0 / 3.0) ** 0.5
    played = norm.transform_timestep(time_step(four), None, update_stats=False)[0].observation
    assert played[0, 0].item() == pytest.approx(newest, rel=1e-6)  # evaluation and play read the newest
    norm.load_state_dict(norm.state_dict())  # loaded statistics are read as they are until the next freeze
    loaded = norm.transform_experience(experience(four.view(1, 1, 3), torch.zeros(1, 1))).observation
    assert loaded[0, 0, 0].item() == pytest.approx(newest, rel=1e-6)
    norm.begin_iteration()
    assert norm.transform_timestep(time_step(four), None, True)[0].observation[0, 0].item() == pytest.approx(
        newest, rel=1e-6)


def test_observation_normalizer_replay_mode_updates_from_experience():
    norm = ObservationNormalizer(BOX, update_mode="replay")
    norm.transform_timestep(time_step(torch.ones(2, 3)), None, update_stats=True)
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
    normalizer.transform_timestep(time_step(torch.zeros(4, 3), torch.tensor([-2.0, 0.0, 2.0, 0.0])), None, True)
    # population std of (-2, 0, 2, 0) = sqrt(2): rewards are divided by it, signs kept
    out = normalizer.transform_experience(exp).reward
    assert torch.allclose(out, exp.reward / 2 ** 0.5, atol=1e-5)


def test_wrong_transformer_order_is_an_error_naming_both():
    with pytest.raises(ValueError, match="data transformer FrameStacker reads the replay buffer, so it must come "
                                         "before ObservationNormalizer; reorder TrainerConfig.data_transformer_ctor"):
        build_transformers([ObservationNormalizer, FrameStacker], BOX)
    with pytest.raises(ValueError, match="data transformer UntransformedTimeStep keeps the untransformed data, so it "
                                         "must come before FrameStacker; reorder"):
        build_transformers([FrameStacker, UntransformedTimeStep], BOX)
    with pytest.raises(ValueError, match="HindsightExperienceTransformer reads the replay buffer, so it must come "
                                         "before RewardScaling"):
        SequentialDataTransformer([RewardScaling(), HindsightExperienceTransformer(GOAL_SPACE)])
    ok = build_transformers([UntransformedTimeStep, FrameStacker, ObservationNormalizer, RewardScaling], BOX)
    assert [type(t).__name__ for t in ok.transformers] == ["UntransformedTimeStep", "FrameStacker",
                                                           "ObservationNormalizer", "RewardScaling"]


def test_untransformed_time_step_keeps_the_raw_data_in_both_views():
    chain = build_transformers([UntransformedTimeStep, RewardScaling], BOX)
    raw = time_step(torch.ones(2, 3), torch.tensor([1.0, 2.0]))
    seen = chain.rollout_view(update_stats=True)(raw)
    assert seen.reward.tolist() == [1.0, 2.0]  # RewardScaling default scale 1
    scaled = build_transformers([UntransformedTimeStep, lambda observation_space: RewardScaling(scale=3.0)], BOX)
    seen = scaled.rollout_view(update_stats=True)(raw)
    assert seen.reward.tolist() == [3.0, 6.0] and seen.untransformed.reward.tolist() == [1.0, 2.0]
    exp = experience(torch.zeros(2, 4, 3), torch.ones(2, 4))  # [B, L]
    sampled = scaled.transform_sample(exp, BatchInfo(torch.arange(2), torch.zeros(2, dtype=torch.long)), None)
    out = scaled.transform_experience(to_time_major(sampled))
    assert torch.equal(out.reward, torch.full((4, 2), 3.0))
    assert torch.equal(out.untransformed.reward, torch.ones(4, 2))  # raw, and time-major like the rest


def test_image_scale_transformer_maps_uint8_to_the_range_and_declares_its_space():
    image = gym.spaces.Box(0, 255, shape=(1, 2, 2), dtype=np.uint8)
    scaler = ImageScaleTransformer(image)
    out_space = scaler.output_observation_space(image)
    assert out_space.dtype == np.float32 and float(out_space.low.min()) == -1.0 and float(out_space.high.max()) == 1.0
    obs = torch.tensor([[[[0, 255], [51, 204]]]], dtype=torch.uint8)
    seen, _ = scaler.transform_timestep(time_step(obs), None, update_stats=False)
    assert torch.allclose(seen.observation, torch.tensor([[[[-1.0, 1.0], [-0.6, 0.6]]]]))
    with pytest.raises(ValueError, match="ImageScaleTransformer scales uint8 images, but observation is Box"):
        ImageScaleTransformer(BOX)


def test_observation_normalizer_normalizes_only_the_chosen_dict_fields():
    norm = ObservationNormalizer(GOAL_SPACE, fields=["observation"], clip_value=0.0)
    obs = {"observation": torch.tensor([[1.0, 3.0], [3.0, 5.0]]), "achieved_goal": torch.ones(2, 2),
           "desired_goal": torch.full((2, 2), 7.0)}
    seen, _ = norm.transform_timestep(time_step(obs, torch.zeros(2)), None, update_stats=True)
    assert torch.allclose(seen.observation["observation"], torch.tensor([[-1.0, -1.0], [1.0, 1.0]]), atol=1e-4)
    assert torch.equal(seen.observation["desired_goal"], obs["desired_goal"])  # goals untouched
    with pytest.raises(ValueError, match=r"ObservationNormalizer.fields=\['bits'\] are not keys"):
        ObservationNormalizer(GOAL_SPACE, fields=["bits"])


def test_build_transformers_accepts_one_or_a_list_and_round_trips_state():
    one = build_transformers(ObservationNormalizer, BOX)
    assert len(one.transformers) == 1
    both = build_transformers([ObservationNormalizer, RewardScaling], BOX)
    both.rollout_view(update_stats=True)(time_step(torch.randn(5, 3)))
    fresh = build_transformers([ObservationNormalizer, RewardScaling], BOX)
    fresh.load_state_dict(both.state_dict())
    obs = torch.randn(2, 3)
    assert torch.equal(fresh.rollout_view(False)(time_step(obs)).observation,
                       both.rollout_view(False)(time_step(obs)).observation)
    assert len(build_transformers(None, BOX).transformers) == 0
