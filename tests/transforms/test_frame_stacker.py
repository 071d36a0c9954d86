"""FrameStacker: the rollout view and the sample view both equal naive stacking, across episode boundaries and a
wrapped ring; the buffer stores single frames."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.data.types import BatchInfo, Experience, StepType, TimeStep
from alfish.replay.ring_buffer import RingBuffer
from alfish.transforms import FrameStacker, ObservationNormalizer, build_transformers

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
K = 3
NUM_ENVS, STEPS, CAPACITY = 2, 30, 20


def episode_step_types(num_steps: int, episode_lengths: list[int]) -> list[int]:
    """FIRST, MID..., LAST repeated with the given lengths (cycled)."""
    types, i = [], 0
    while len(types) < num_steps:
        n = episode_lengths[i % len(episode_lengths)]
        types += [F] + [M] * (n - 2) + [L]
        i += 1
    return types[:num_steps]


# env 0: episodes of 4 steps (shorter than K + 1 matters less); env 1: 2-step episodes (a stack spans at most 2 frames)
STEP_TYPES = [episode_step_types(STEPS, [4, 7]), episode_step_types(STEPS, [2, 5])]


def frame(env: int, t: int) -> torch.Tensor:
    """A distinct 2-dim frame for step t of env ``env``."""
    return torch.tensor([100.0 * env + t, -t])


def naive_stack(env: int, t: int) -> torch.Tensor:
    """The last K frames of env's step t, oldest first, repeating the episode's first frame before its start."""
    types = STEP_TYPES[env]
    start = t
    while types[start] != F:
        start -= 1
    return torch.cat([frame(env, max(t - d, start)) for d in range(K - 1, -1, -1)])


def time_step(t: int) -> TimeStep:
    step_type = torch.tensor([STEP_TYPES[e][t] for e in range(NUM_ENVS)], dtype=torch.int8)
    obs = torch.stack([frame(e, t) for e in range(NUM_ENVS)])
    return TimeStep(step_type, torch.zeros(NUM_ENVS), torch.ones(NUM_ENVS), obs,
                    torch.zeros(NUM_ENVS, dtype=torch.long), torch.arange(NUM_ENVS))


SPACE = gym.spaces.Box(-1000.0, 1000.0, shape=(2,), dtype=np.float32)


def test_output_space_concatenates_along_the_stack_axis():
    assert FrameStacker(SPACE, stack_size=K).output_observation_space(SPACE).shape == (2 * K,)
    image = gym.spaces.Box(0, 255, shape=(3, 8, 8), dtype=np.uint8)
    stacked = FrameStacker(image, stack_size=4).output_observation_space(image)
    assert stacked.shape == (12, 8, 8) and stacked.dtype == np.uint8
    # a normalizer after the stacker is built for the stacked shape
    chain = build_transformers([FrameStacker, ObservationNormalizer], SPACE)
    assert tuple(chain.transformers[1].stats.mean.shape) == (2 * 4,)  # default stack_size 4


def test_rollout_view_equals_naive_stacking():
    stacker = FrameStacker(SPACE, stack_size=K)
    state = None
    for t in range(STEPS):
        out, state = stacker.transform_timestep(time_step(t), state, update_stats=True)
        for e in range(NUM_ENVS):
            assert torch.equal(out.observation[e], naive_stack(e, t)), (e, t)


def test_sample_view_equals_naive_stacking_on_a_wrapped_ring():
    buffer = RingBuffer(NUM_ENVS, CAPACITY)
    for t in range(STEPS):
        ts = time_step(t)
        buffer.add(Experience.from_time_step(ts, torch.zeros(NUM_ENVS, dtype=torch.long)))
    stacker = FrameStacker(SPACE, stack_size=K)
    length = 3
    oldest = int(buffer.oldest_index()[0])  # STEPS - CAPACITY = 10: steps 0..9 were overwritten
    checked = 0
    for e in range(NUM_ENVS):
        for p in range(oldest, STEPS - length + 1):
            # only where every frame naive stacking needs is still stored
            needed = [max(t - d, next(s for s in range(t, -1, -1) if STEP_TYPES[e][s] == F))
                      for t in range(p, p + length) for d in range(K)]
            if min(needed) < oldest:
                continue
            env_ids, positions = torch.tensor([e]), torch.tensor([p])
            exp = buffer.gather(env_ids, positions, length)
            out = stacker.transform_sample(exp, BatchInfo(env_ids, positions), buffer)
            assert out.observation.shape == (1, length, 2 * K)
            for i in range(length):
                assert torch.equal(out.observation[0, i], naive_stack(e, p + i)), (e, p, i)
            checked += 1
    assert checked >= 20


def test_sample_view_repeats_the_oldest_stored_frame_when_history_was_overwritten():
    buffer = RingBuffer(1, 4)
    for t in range(6):  # one long episode: steps 0..5, only 2..5 stored
        step_type = torch.tensor([F if t == 0 else M], dtype=torch.int8)
        buffer.add(Experience(step_type, torch.zeros(1), torch.ones(1), torch.tensor([[float(t)]]),
                              torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)))
    stacker = FrameStacker(gym.spaces.Box(-10, 10, shape=(1,)), stack_size=3)
    exp = buffer.gather(torch.tensor([0]), torch.tensor([2]), 2)
    out = stacker.transform_sample(exp, BatchInfo(torch.tensor([0]), torch.tensor([2])), buffer)
    assert out.observation[0].tolist() == [[2.0, 2.0, 2.0], [2.0, 2.0, 3.0]]


def test_buffer_stores_single_frames():
    buffer = RingBuffer(NUM_ENVS, 8)
    buffer.add(Experience.from_time_step(time_step(0), torch.zeros(NUM_ENVS, dtype=torch.long)))
    assert tuple(buffer._storage[3].shape) == (NUM_ENVS, 8, 2)  # observation leaf: one frame per slot


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="FrameStacker.stack_size=0 must be >= 1"):
        FrameStacker(SPACE, stack_size=0)
    with pytest.raises(ValueError, match="FrameStacker.stack_axis=1 is out of range"):
        FrameStacker(SPACE, stack_axis=1)


def test_atari_frames_cost_one_raw_frame_per_step_in_replay_and_stack_to_uint8_at_sample_time():
    """84x84 uint8 frames with a 4-frame stack: the buffer holds each frame once, so a step costs the frame's 7,056
    bytes plus 17 bytes of step type, reward, discount and action (1.0024x, within the 1.1x target); stacks of 4 come
    out as uint8 [4, 84, 84] for the network to scale."""
    num_envs, capacity, frame_bytes = 2, 64, 84 * 84
    buffer = RingBuffer(num_envs, capacity)
    space = gym.spaces.Box(0, 255, shape=(1, 84, 84), dtype=np.uint8)
    for t in range(capacity):
        obs = torch.full((num_envs, 1, 84, 84), t, dtype=torch.uint8)
        step_type = torch.full((num_envs,), F if t % 20 == 0 else M, dtype=torch.int8)
        ts = TimeStep(step_type, torch.zeros(num_envs), torch.ones(num_envs), obs,
                      torch.zeros(num_envs, dtype=torch.long), torch.arange(num_envs))
        buffer.add(Experience.from_time_step(ts, torch.zeros(num_envs, dtype=torch.long)))
    stored = sum(t.numel() * t.element_size() for t in buffer._storage)
    per_step = stored / (num_envs * capacity)
    assert per_step == frame_bytes + 1 + 4 + 4 + 8, per_step
    assert per_step / frame_bytes <= 1.1
    stacker = FrameStacker(space, stack_size=4)
    assert stacker.output_observation_space(space).shape == (4, 84, 84)
    env_ids, positions = torch.tensor([0, 1]), torch.tensor([22, 41])
    out = stacker.transform_sample(buffer.gather(env_ids, positions, 2), BatchInfo(env_ids, positions), buffer)
    assert out.observation.shape == (2, 2, 4, 84, 84) and out.observation.dtype == torch.uint8
    # step 22 of an episode starting at 20: frames 20, 20, 21, 22 (the first frame repeats before the start)
    assert out.observation[0, 0, :, 0, 0].tolist() == [20, 20, 21, 22]
    assert out.observation[1, 1, :, 0, 0].tolist() == [40, 40, 41, 42]  # step 42 of the episode from 40
