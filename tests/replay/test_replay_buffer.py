"""ReplayBuffer: the same cases for every sampler, through the one interface (add / sample / clear / state_dict).

The prioritized sampler runs with equal priorities (nothing updates them), so every case must hold for both. Each
stored step carries its absolute write index and its episode number in ``rollout_info``, and its env id in the
observation, so contiguity, wrap-around and episode boundaries can be checked on every sampled sequence.
"""
import io

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.utils import _pytree as pytree

from alfish.data.types import BatchInfo, Experience, StepType
from alfish.replay import PrioritizedSampler, ReplayBuffer, RingBuffer, UniformSampler
from alfish.transforms import FrameStacker, HindsightExperienceTransformer

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
SAMPLERS = ["uniform", "prioritized"]
EPISODE_LENGTHS = [4, 3]  # env e's episodes all have EPISODE_LENGTHS[e % 2] steps


def make(kind, num_envs, capacity, length, seed=0, track_episode_ends=False):
    gen = torch.Generator().manual_seed(seed)
    storage = RingBuffer(num_envs, capacity, track_episode_ends=track_episode_ends)
    if kind == "uniform":
        return ReplayBuffer(storage, UniformSampler(gen))
    return ReplayBuffer(storage, PrioritizedSampler(num_envs, capacity, sequence_length=length, generator=gen))


def step(env_ids, index):
    """Step ``index`` of rings ``env_ids``: episodes of ``EPISODE_LENGTHS[env % 2]`` steps (FIRST, MID..., LAST)."""
    env_ids = torch.as_tensor(env_ids, dtype=torch.int64)
    index = torch.as_tensor(index, dtype=torch.int64).expand(env_ids.shape)
    n = torch.tensor(EPISODE_LENGTHS)[env_ids % 2]
    within = index % n
    step_type = torch.where(within == 0, F, torch.where(within == n - 1, L, M)).to(torch.int8)
    return Experience(step_type=step_type, reward=index.float(), discount=torch.ones(len(env_ids)),
                      observation=torch.stack([index.float(), env_ids.float()], -1),
                      action=torch.zeros(len(env_ids), 1), env_id=env_ids,
                      rollout_info={"index": index.clone(), "episode": index // n})


def add(buf, env_ids=None):
    env_ids = torch.arange(buf.num_envs) if env_ids is None else torch.as_tensor(env_ids, dtype=torch.int64)
    buf.add(step(env_ids, buf.write_count()[env_ids]))


def filled(kind, num_envs, capacity, steps, length, seed=0):
    buf = make(kind, num_envs, capacity, length, seed)
    for _ in range(steps):
        add(buf)
    return buf


def starts(info):
    return set(zip(info.env_ids.tolist(), info.positions.tolist()))


@pytest.mark.parametrize("kind", SAMPLERS)
def test_sequences_are_contiguous_steps_of_one_env_and_may_span_an_episode_end(kind):
    length = 5
    buf = filled(kind, 2, 12, 20, length)  # wrapped: indices 8..19 readable per env
    exp, info = buf.sample(400, length)
    idx, episode, st = exp.rollout_info["index"], exp.rollout_info["episode"], exp.step_type
    assert idx.shape == st.shape == (400, length) and exp.observation.shape == (400, length, 2)
    assert info.env_ids.dtype == info.positions.dtype == torch.int64 and info.env_ids.shape == (400,)
    # One env per sequence, the one BatchInfo names; consecutive absolute indices starting at the BatchInfo position.
    assert torch.equal(exp.env_id, info.env_ids.unsqueeze(1).expand(-1, length))
    assert torch.equal(exp.observation[..., 1], exp.env_id.float())
    assert torch.equal(idx, info.positions.unsqueeze(1) + torch.arange(length))
    assert int(idx.min()) >= 8 and int(idx.max()) <= 19
    # Episode ends inside a sequence: the episode changes exactly where LAST is followed by FIRST, and it happens.
    changes = episode[:, 1:] != episode[:, :-1]
    boundary = (st[:, :-1] == L) & (st[:, 1:] == F)
    assert torch.equal(changes, boundary)
    assert int(boundary.any(1).sum()) > 100
    if kind == "uniform":
        assert info.importance_weights is None
    else:  # equal priorities: P(i) = 1 / N, so every weight (N * P(i)) ** -beta is 1
        assert info.importance_weights.dtype == torch.float32
        assert info.importance_weights.tolist() == pytest.approx([1.0] * 400)


@pytest.mark.parametrize("kind", SAMPLERS)
def test_sequences_never_wrap_from_the_newest_slot_to_the_oldest(kind):
    # capacity 5, 7 writes: the ring holds indices 2..6 (slots 2,3,4,0,1). Length 3 -> exactly [2,3,4], [3,4,5],
    # [4,5,6]; never [5,6,2] or [6,2,3].
    buf = filled(kind, 1, 5, 7, 3)
    exp, _ = buf.sample(300, 3)
    seen = {tuple(row) for row in exp.rollout_info["index"].tolist()}
    assert seen == {(2, 3, 4), (3, 4, 5), (4, 5, 6)}
    assert torch.equal(exp.reward, exp.rollout_info["index"].float())  # fields stay aligned


@pytest.mark.parametrize("kind", SAMPLERS)
def test_no_start_at_an_unreadable_index_after_clear_keep_last_1(kind):
    buf = filled(kind, 2, 8, 10, 2)  # indices 2..9 readable per env
    buf.sample(16, 2)
    buf.clear(keep_last=1)  # only index 9 is readable: no sequence of 2 fits
    assert buf.num_stored().tolist() == [1, 1] and len(buf) == 2
    with pytest.raises(RuntimeError, match=r"holds \[1, 1\] steps per env, too few for sequences of "
                                           r"mini_batch_length=2"):
        buf.sample(4, 2)
    for _ in range(2):  # indices 10, 11
        add(buf)
    exp, info = buf.sample(200, 2)
    assert starts(info) == {(e, p) for e in (0, 1) for p in (9, 10)}
    assert int(exp.rollout_info["index"].min()) == 9
    buf.clear()
    assert len(buf) == 0
    with pytest.raises(RuntimeError, match="too few for sequences"):
        buf.sample(4, 2)


@pytest.mark.parametrize("kind", SAMPLERS)
def test_state_dict_round_trip_gives_the_same_data_and_draws(kind):
    a = filled(kind, 2, 6, 9, 2, seed=1)
    a.clear(keep_last=4)  # the readable window is part of the state
    add(a, [1])  # uneven envs, and (prioritized) leaves awaiting a refresh when saved
    blob = io.BytesIO()  # through the checkpoint format: torch.save + torch.load(weights_only=True)
    torch.save(a.state_dict(), blob)
    blob.seek(0)
    state = torch.load(blob, weights_only=True)
    assert set(state) == {"storage", "sampler"}
    assert all(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(state))
    b = make(kind, 2, 6, 2, seed=99)
    b.load_state_dict(state, example=step([0], 0))
    assert len(b) == len(a) == 9 and b.num_stored().tolist() == [4, 5]
    for x, y in zip(pytree.tree_leaves(a.storage.gather(torch.tensor([0, 1]), a.oldest_index(), 4)),
                    pytree.tree_leaves(b.storage.gather(torch.tensor([0, 1]), b.oldest_index(), 4))):
        assert torch.equal(x, y)
    for _ in range(3):  # same seed -> same draws, also after both continue writing
        a.sampler.generator.manual_seed(11)
        b.sampler.generator.manual_seed(11)
        (ea, ia), (eb, ib) = a.sample(16, 2), b.sample(16, 2)
        assert all(x is y is None or torch.equal(x, y) for x, y in zip(ia, ib))  # (no weights: None)
        assert all(torch.equal(x, y) for x, y in zip(pytree.tree_leaves(ea), pytree.tree_leaves(eb)))
        add(a)
        add(b)


@pytest.mark.parametrize("kind", SAMPLERS)
def test_len_is_the_number_of_readable_steps(kind):
    buf = make(kind, 3, 4, 1)
    assert len(buf) == 0 and buf.num_stored().tolist() == [0, 0, 0]
    for envs in ([0, 1, 2], [0, 2], [0], [0], [0], [2]):  # env 0 wraps (5 writes in 4 slots)
        add(buf, envs)
    assert buf.num_stored().tolist() == [4, 1, 3]
    assert len(buf) == 8 == int(buf.num_stored().sum())
    buf.clear(keep_last=2)
    assert buf.num_stored().tolist() == [2, 1, 2] and len(buf) == 5
    assert buf.num_envs == 3 and buf.capacity == 4


@pytest.mark.parametrize("kind", SAMPLERS)
def test_update_priorities_without_priorities_does_nothing(kind):
    buf = filled(kind, 2, 8, 6, 2)
    _, info = buf.sample(8, 2)
    before = buf.state_dict()["sampler"]
    for none in (None, ()):
        buf.update_priorities(info, none)
    if kind == "uniform":  # a sampler without priorities ignores them
        buf.update_priorities(info, torch.rand(8))
    after = buf.state_dict()["sampler"]
    assert set(before) == set(after) and all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("kind", SAMPLERS)
def test_gather_all_is_env_major_with_its_batch_info(kind):
    buf = filled(kind, 3, 8, 11, 2)  # 8 readable per env: indices 3..10
    exp, info = buf.gather_all()
    assert exp.step_type.shape == (3, 8) and exp.observation.shape == (3, 8, 2)
    assert exp.rollout_info["index"].tolist() == [list(range(3, 11))] * 3
    assert info.env_ids.tolist() == [0, 1, 2] and info.positions.tolist() == [3, 3, 3]
    assert info.importance_weights is None


@pytest.mark.parametrize("kind", SAMPLERS)
def test_truncate_episodes_marks_the_newest_step_last(kind):
    buf = filled(kind, 2, 8, 6, 2)  # index 5: MID of env 0 (episodes of 4), LAST of env 1 (episodes of 3)
    buf.truncate_episodes()
    exp, _ = buf.gather_all()
    assert exp.step_type[:, -1].tolist() == [L, L]
    assert exp.step_type[0, :-1].tolist() == [F, M, M, L, F]  # nothing else changed


@pytest.mark.parametrize("kind", SAMPLERS)
def test_frame_stacker_reads_a_replay_buffer_as_it_reads_its_storage(kind):
    buf = filled(kind, 2, 10, 14, 3)  # wrapped: indices 4..13
    exp, info = buf.sample(32, 3)
    stacker = FrameStacker(gym.spaces.Box(-100, 100, shape=(2,), dtype=np.float32), stack_size=3)
    through_buffer = stacker.transform_sample(exp, info, buf)
    through_storage = stacker.transform_sample(exp, info, buf.storage)
    assert through_buffer.observation.shape == (32, 3, 6)
    assert torch.equal(through_buffer.observation, through_storage.observation)


@pytest.mark.parametrize("kind", SAMPLERS)
def test_hindsight_reads_a_replay_buffer_as_it_reads_its_storage(kind):
    goals = gym.spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)
    her = HindsightExperienceTransformer(
        gym.spaces.Dict({"achieved_goal": goals, "desired_goal": goals, "observation": goals}), her_proportion=1.0)
    buf = make(kind, 2, 10, 2, track_episode_ends=True)
    for _ in range(14):
        index = buf.write_count()
        s = step(torch.arange(2), index)
        achieved = torch.stack([index.float(), s.rollout_info["episode"].float()], -1)  # (step, episode)
        obs = {"achieved_goal": achieved, "desired_goal": torch.full((2, 2), -1.0), "observation": achieved}
        buf.add(s._replace(observation=obs))
    exp, info = buf.sample(32, 2)
    assert torch.equal(buf.episode_end(info.env_ids, info.positions),
                       buf.storage.episode_end(info.env_ids, info.positions))
    torch.manual_seed(0)
    through_buffer = her.transform_sample(exp, info, buf)
    torch.manual_seed(0)
    through_storage = her.transform_sample(exp, info, buf.storage)
    for x, y in zip(pytree.tree_leaves(through_buffer), pytree.tree_leaves(through_storage)):
        assert torch.equal(x, y)
    # Relabelled goals come from the sequence's own episode.
    new_goal = through_buffer.observation["desired_goal"]
    same_episode = exp.rollout_info["episode"][:, 0]
    assert bool((new_goal[:, 0, 1] == same_episode.float()).all())


def test_a_batch_info_from_sample_fits_update_priorities():
    buf = filled("prioritized", 2, 8, 6, 2)
    _, info = buf.sample(8, 2)
    assert isinstance(info, BatchInfo)
    buf.update_priorities(info, torch.full((8,), 3.0))
    assert float(buf.sampler._max_priority) == pytest.approx((3.0 + 1e-6) ** 0.7)


# ---------------------------------------------------------------------------------------- policy iterations ----
def test_every_add_path_stamps_its_slots_with_the_acting_iteration():
    """Lockstep ``add`` (all envs), indexed ``add`` (a subset), ``add_steps`` (lockstep slices, wrapping the ring):
    each written slot holds the acting iteration set before the write; slots not written keep theirs."""
    buf = make("uniform", num_envs=2, capacity=4, length=1)
    buf.set_acting_iteration(3)
    add(buf)  # lockstep: slot 0 of both envs
    buf.set_acting_iteration(5)
    add(buf, [1])  # env 1 only: its slot 1
    assert buf.storage.policy_iterations.tolist() == [[3, 0, 0, 0], [3, 5, 0, 0]]
    buf2 = make("uniform", num_envs=2, capacity=4, length=1)
    for stamp in (1, 2, 3):
        buf2.set_acting_iteration(stamp)
        add(buf2)  # slots 0, 1, 2 (lockstep)
    buf2.set_acting_iteration(9)
    index = buf2.write_count()[0] + torch.arange(3)  # 3 steps: slot 3, then slots 0 and 1 (the ring wraps)
    steps = [step(torch.arange(2), index[t]) for t in range(3)]
    buf2.add_steps(Experience(*[torch.stack(x, 1) if isinstance(x[0], torch.Tensor) else
                                {k: torch.stack([d[k] for d in x], 1) for k in x[0]} for x in zip(*steps)]))
    assert buf2.storage.policy_iterations.tolist() == [[9, 9, 3, 9], [9, 9, 3, 9]]
    assert buf2.policy_iterations(torch.tensor([0, 1]), torch.tensor([2, 5])).tolist() == [3, 9]


def test_the_summary_reports_the_policy_age_of_the_last_batch_and_the_stamps_survive_a_checkpoint():
    buf = make("uniform", num_envs=1, capacity=8, length=1)
    for stamp in (0, 2, 2, 6):
        buf.set_acting_iteration(stamp)
        add(buf)
    assert buf.summary() == {}  # nothing sampled and no current iteration yet
    buf.set_current_iteration(7)
    exp, info = buf.sample(64, 1)
    ages = {0: 7, 1: 5, 2: 5, 3: 1}  # position -> 7 - its acting iteration
    drawn = [ages[p] for p in info.positions.tolist()]
    summary = buf.summary()
    assert summary["replay/sampled_policy_age"] == pytest.approx(sum(drawn) / len(drawn))
    assert summary["replay/sampled_policy_age_max"] == max(drawn) == 7
    restored = make("uniform", num_envs=1, capacity=8, length=1)
    restored.load_state_dict(buf.state_dict(), step(torch.arange(1), torch.zeros(1, dtype=torch.int64)))
    assert restored.storage.policy_iterations[0].tolist() == [0, 2, 2, 6, 0, 0, 0, 0]
    state = buf.state_dict()
    del state["storage"]["policy_iterations"]  # a checkpoint from before the stamps: every step acted at 0
    restored.load_state_dict(state, step(torch.arange(1), torch.zeros(1, dtype=torch.int64)))
    assert restored.storage.policy_iterations.sum() == 0
