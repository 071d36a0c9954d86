"""RingBuffer (per-env rings) with uniform sequences drawn through ReplayBuffer(storage, UniformSampler()), and
whole_buffer_minibatches.

Each stored step carries its absolute write index and its episode counter in ``rollout_info``, so contiguity,
wrap-around and episode boundaries can be checked on every sampled sequence.
"""
import io
from collections import Counter

import pytest
import torch

import alfish.envs.toy  # noqa: F401
from alfish.data.types import Experience, StepType
from alfish.envs.batched_env import BatchedEnv
from alfish.replay.batching import to_time_major, whole_buffer_minibatches
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.samplers import UniformSampler

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST


def step(env_ids, index, episode=None, step_type=None):
    """A hand-built stored step for rings ``env_ids``; ``index`` is each row's absolute write index."""
    env_ids = torch.as_tensor(env_ids, dtype=torch.int64)
    index = torch.as_tensor(index, dtype=torch.int64).expand(env_ids.shape)
    n = env_ids.shape[0]
    episode = torch.zeros(n, dtype=torch.int64) if episode is None else torch.as_tensor(episode).expand(n)
    return Experience(
        step_type=torch.full((n,), M, dtype=torch.int8) if step_type is None else step_type,
        reward=index.float(),
        discount=torch.ones(n),
        observation=torch.stack([index.float(), env_ids.float()], -1),  # [n, 2]
        action=torch.zeros(n, 1),
        env_id=env_ids,
        rollout_info={"index": index.clone(), "episode": episode.clone()},
    )


def filled(num_envs, capacity, steps):
    buf = RingBuffer(num_envs, capacity)
    for i in range(steps):
        buf.add(step(torch.arange(num_envs), i))
    return buf


def uniform(storage, generator=None):
    """The storage with a uniform sampler: ``sample`` draws what ``RingBuffer.sample_uniform`` used to."""
    return ReplayBuffer(storage, UniformSampler(generator))


# ------------------------------------------------------------------------- sequences from a real batched env ---

def test_sequences_from_real_env_are_contiguous_and_show_episode_boundaries():
    """Chain-v0 x 3 with random actions, 45 steps into rings of 16: every sampled sequence lies in one env's
    readable window [29, 45), its indices are consecutive, and the episode counter changes exactly where a LAST step
    is followed by a FIRST step."""
    num_envs, capacity, total, length = 3, 16, 45, 6
    env = BatchedEnv("alfish/Chain-v0", num_envs, seed=4)
    gen = torch.Generator().manual_seed(0)
    buf = uniform(RingBuffer(num_envs, capacity), torch.Generator().manual_seed(1))
    ts = env.reset()
    episode = torch.zeros(num_envs, dtype=torch.int64)
    for i in range(total):
        episode += (ts.step_type == F).long()  # counted by the test, from the stream it fed in
        action = torch.randint(0, 2, (num_envs,), generator=gen)
        exp = Experience.from_time_step(ts, action, {"index": torch.full((num_envs,), i), "episode": episode.clone()})
        buf.add(exp)
        ts = env.step(action)
    env.close()
    assert buf.num_stored().tolist() == [capacity] * num_envs

    exp, info = buf.sample(batch_size=600, length=length)
    idx, ep, st = exp.rollout_info["index"], exp.rollout_info["episode"], exp.step_type
    assert idx.shape == ep.shape == st.shape == (600, length)
    assert exp.observation.shape == (600, length, 5)
    # Which ring and where: BatchInfo agrees with what was stored.
    assert torch.equal(exp.env_id, info.env_ids.unsqueeze(1).expand(-1, length))
    assert torch.equal(idx[:, 0], info.positions)
    # Contiguous in write order and never wrapping from the newest slot (44) to the oldest (29).
    assert torch.equal(idx, info.positions.unsqueeze(1) + torch.arange(length))
    assert int(idx.min()) >= total - capacity and int(idx.max()) <= total - 1
    # Episode boundaries: the counter changes between k and k+1 exactly where st[k] is LAST and st[k+1] is FIRST.
    changes = ep[:, 1:] != ep[:, :-1]
    boundary = (st[:, :-1] == L) & (st[:, 1:] == F)
    assert torch.equal(changes, boundary)
    assert int(changes.sum()) > 50  # plenty of sequences do cross episodes
    # Every FIRST inside a sequence follows a LAST (the ring never splices two unrelated histories).
    assert torch.equal(st[:, 1:] == F, boundary)


def test_no_wrap_exact_set_of_sequences():
    # capacity 5, 7 writes: the ring holds indices 2..6 (slots 2,3,4,0,1). Length 3 -> exactly [2,3,4], [3,4,5],
    # [4,5,6]; never [5,6,2] or [6,2,3] (wrapping from the newest to the oldest).
    buf = uniform(filled(1, 5, 7), torch.Generator().manual_seed(0))
    exp, info = buf.sample(300, 3)
    seen = Counter(tuple(row) for row in exp.rollout_info["index"].tolist())
    assert set(seen) == {(2, 3, 4), (3, 4, 5), (4, 5, 6)}
    assert all(count > 60 for count in seen.values())  # ~100 each
    assert torch.equal(exp.reward, exp.rollout_info["index"].float())  # fields stay aligned
    assert set(info.positions.tolist()) == {2, 3, 4}


def test_start_positions_are_uniform_over_all_stored_sequences():
    """env 0 holds 15 writes in a ring of 10 (indices 5..14 -> 8 starts for length 3), env 1 only 5 (indices 0..4 ->
    3 starts). 11 sequences in all; each should be drawn ~1/11 of the time, so env 1 gets ~3/11 (not 1/2)."""
    buf = uniform(RingBuffer(2, 10), torch.Generator().manual_seed(123))
    for i in range(15):
        ids = [0, 1] if i < 5 else [0]
        buf.add(step(ids, i))
    assert buf.num_stored().tolist() == [10, 5]
    n = 22000
    _, info = buf.sample(n, 3)
    counts = Counter(zip(info.env_ids.tolist(), info.positions.tolist()))
    expected_keys = {(0, p) for p in range(5, 13)} | {(1, p) for p in range(3)}
    assert set(counts) == expected_keys
    # n / 11 = 2000 per sequence; binomial std = sqrt(n * 1/11 * 10/11) ~ 43, so +-300 is ~7 std: loose but it
    # catches e.g. "pick an env uniformly, then a start" (env 1's starts would get n / 6 ~ 3667 each).
    for key in expected_keys:
        assert 1700 <= counts[key] <= 2300, (key, counts[key])


def test_uniform_sampler_draws_what_ring_buffer_sample_uniform_drew():
    # Seeded runs must not change: these are the draws of the former RingBuffer.sample_uniform (generator seeded 5)
    # on the same buffer (uneven envs, after a clear), recorded before it moved into UniformSampler.
    buf = uniform(RingBuffer(3, 6), torch.Generator().manual_seed(5))
    for i in range(8):
        buf.add(step([0, 1, 2] if i < 4 else [0, 2], i))
    buf.clear(keep_last=5)
    assert buf.num_stored().tolist() == [5, 4, 5] and buf.oldest_index().tolist() == [3, 0, 3]
    _, info = buf.sample(10, 2)
    assert info.env_ids.tolist() == [2, 0, 0, 0, 0, 2, 1, 2, 2, 1]
    assert info.positions.tolist() == [5, 4, 3, 6, 6, 3, 1, 5, 4, 1]
    assert info.importance_weights is None


def test_too_few_steps_for_the_length_is_a_clear_error():
    buf = uniform(filled(2, 8, 3))
    with pytest.raises(RuntimeError, match=r"holds \[3, 3\] steps per env, too few for sequences of "
                                           r"mini_batch_length=4"):
        buf.sample(4, 4)


# ---------------------------------------------------------------------------------------------------- clearing ---

def test_clear_keep_last_keeps_exactly_the_newest_step_per_env():
    buf = filled(2, 5, 7)  # indices 2..6 readable per env
    buf.clear(keep_last=1)
    assert buf.num_stored().tolist() == [1, 1]
    assert buf.total_stored() == 2
    kept = buf.gather_all()
    assert kept.rollout_info["index"].tolist() == [[6], [6]]
    assert kept.observation.tolist() == [[[6.0, 0.0]], [[6.0, 1.0]]]
    # New steps continue after the kept one, contiguously: 6, 7, 8.
    for i in (7, 8):
        buf.add(step([0, 1], i))
    assert buf.gather_all().rollout_info["index"].tolist() == [[6, 7, 8], [6, 7, 8]]
    exp, _ = uniform(buf).sample(50, 2)
    assert {tuple(r) for r in exp.rollout_info["index"].tolist()} <= {(6, 7), (7, 8)}
    buf.clear()
    assert buf.num_stored().tolist() == [0, 0]


# ------------------------------------------------------------------------------------------------- gather_all ---

def test_gather_all_shapes_are_env_major():
    buf = filled(3, 8, 11)  # 8 readable per env: indices 3..10
    exp = buf.gather_all()
    assert exp.step_type.shape == exp.reward.shape == (3, 8)
    assert exp.observation.shape == (3, 8, 2)
    assert exp.action.shape == (3, 8, 1)
    assert exp.rollout_info["index"].tolist() == [list(range(3, 11))] * 3
    assert exp.env_id.tolist() == [[0] * 8, [1] * 8, [2] * 8]


def test_gather_all_needs_equal_counts():
    buf = RingBuffer(2, 8)
    buf.add(step([0, 1], 0))
    buf.add(step([0], 1))
    with pytest.raises(RuntimeError, match=r"same number of steps per env, got \[2, 1\]"):
        buf.gather_all()


# ---------------------------------------------------------------------------------------------- checkpointing ---

def test_state_dict_round_trip_gives_identical_samples():
    a = uniform(filled(2, 6, 9), torch.Generator().manual_seed(7))
    a.clear(keep_last=4)  # the readable window is part of the state
    state = a.state_dict()
    # Through the checkpoint format: torch.save + torch.load(weights_only=True).
    blob = io.BytesIO()
    torch.save(state, blob)
    blob.seek(0)
    state = torch.load(blob, weights_only=True)
    b = uniform(RingBuffer(2, 6), torch.Generator().manual_seed(7))
    b.load_state_dict(state, example=step([0, 1], 0))
    assert b.num_stored().tolist() == a.num_stored().tolist() == [4, 4]
    for _ in range(3):
        ea, ia = a.sample(16, 3)
        eb, ib = b.sample(16, 3)
        assert torch.equal(ia.env_ids, ib.env_ids) and torch.equal(ia.positions, ib.positions)
        for x, y in zip(torch.utils._pytree.tree_leaves(ea), torch.utils._pytree.tree_leaves(eb)):
            assert torch.equal(x, y)
    assert set(ea.rollout_info["index"].flatten().tolist()) <= {5, 6, 7, 8}
    # Writing continues at the same slots in both.
    a.add(step([0, 1], 9))
    b.add(step([0, 1], 9))
    assert torch.equal(a.gather_all()[0].rollout_info["index"], b.gather_all()[0].rollout_info["index"])
    assert b.gather_all()[0].rollout_info["index"].tolist() == [[5, 6, 7, 8, 9]] * 2


# ------------------------------------------------------------------------------------- whole-buffer mini-batches ---

def test_whole_buffer_minibatches_visit_every_sequence_once_per_epoch():
    buf = filled(3, 10, 10)
    exp = buf.gather_all()  # [3, 10]
    gen = torch.Generator().manual_seed(0)
    # 10 steps per env in sequences of 3 -> 3 per env (step 9 left out), 9 in all; batches of 4 -> 4, 4, 1.
    orders = []
    for _ in range(2):  # two epochs
        seen = []
        sizes = []
        for batch in whole_buffer_minibatches(exp, length=3, batch_size=4, generator=gen):
            idx = batch.rollout_info["index"]
            assert idx.shape[0] == 3  # time-major [L, B]
            assert batch.observation.shape == (3, idx.shape[1], 2)
            sizes.append(idx.shape[1])
            assert torch.equal(idx, idx[0] + torch.arange(3).unsqueeze(1))  # each column consecutive in time
            assert torch.equal(batch.env_id, batch.env_id[0].expand(3, -1))  # and from one env
            seen += list(zip(batch.env_id[0].tolist(), idx[0].tolist()))
        assert sizes == [4, 4, 1]
        assert sorted(seen) == [(e, s) for e in range(3) for s in (0, 3, 6)]
        orders.append(seen)
    assert orders[0] != orders[1]  # reshuffled each epoch
    (single,) = list(whole_buffer_minibatches(exp, length=5, batch_size=None))
    assert single.step_type.shape == (5, 6)  # 2 sequences per env, all in one batch
    assert list(whole_buffer_minibatches(exp, length=11, batch_size=None)) == []


def test_to_time_major_transposes_every_leaf():
    exp = filled(2, 4, 4).gather_all()  # [2, 4]
    tm = to_time_major(exp)
    assert tm.observation.shape == (4, 2, 2)
    assert tm.rollout_info["index"].tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]]
    assert tm.env_id.tolist() == [[0, 1]] * 4


def test_storage_holds_no_more_than_the_raw_bytes_of_a_step():
    # Pendulum-like step: obs 3 x f32 (12 B) + action 1 x f32 (4) + reward f32 (4) + discount f32 (4) + step type
    # int8 (1) = 25 B of raw data; env_id is the ring's own index and must not be stored.
    import torch as _torch

    from alfish.data.types import Experience as _Exp
    from alfish.replay.ring_buffer import RingBuffer as _Ring

    ring = _Ring(num_envs=2, capacity=100)
    step = _Exp(_torch.ones(2, dtype=_torch.int8), _torch.zeros(2), _torch.ones(2), _torch.zeros(2, 3),
                _torch.zeros(2, 1), _torch.arange(2))
    ring.add(step)
    stored_bytes = sum(t.numel() * t.element_size() for t in ring._storage)
    assert stored_bytes == 2 * 100 * 25
    # and gather gives env_id back: the ring index of each sequence
    exp = ring.gather(_torch.tensor([1, 0]), _torch.tensor([0, 0]), 1)
    assert exp.env_id.tolist() == [[1], [0]]


def test_a_ring_that_has_not_wrapped_saves_only_its_written_slots_and_loads_back_whole():
    ring = RingBuffer(num_envs=2, capacity=100)
    for t in range(7):
        ring.add(Experience(torch.ones(2, dtype=torch.int8), torch.full((2,), float(t)), torch.ones(2),
                            torch.full((2, 3), float(t)), torch.zeros(2, 1), torch.arange(2)))
    state = ring.state_dict()
    assert [tuple(leaf.shape[:2]) for leaf in state["leaves"]] == [(2, 7)] * len(state["leaves"])
    example = ring.gather(torch.tensor([0]), torch.tensor([0]), 1)
    fresh = RingBuffer(num_envs=2, capacity=100)
    fresh.load_state_dict(state, example)
    assert all(leaf.shape[1] == 100 for leaf in fresh._storage)
    got = fresh.gather(torch.tensor([1, 0]), torch.tensor([2, 6]), 1)
    assert got.reward[:, 0].tolist() == [2.0, 6.0] and got.observation[:, 0, 0].tolist() == [2.0, 6.0]
    for t in range(7, 130):  # wraps: then the whole ring is saved
        fresh.add(Experience(torch.ones(2, dtype=torch.int8), torch.full((2,), float(t)), torch.ones(2),
                             torch.full((2, 3), float(t)), torch.zeros(2, 1), torch.arange(2)))
    assert all(leaf.shape[1] == 100 for leaf in fresh.state_dict()["leaves"])
    smaller = RingBuffer(num_envs=2, capacity=50)
    with pytest.raises(ValueError, match="rings of \\[100\\] steps per env but this one has 50"):
        smaller.load_state_dict(fresh.state_dict(), example)
