"""PrioritizedSampler next to a RingBuffer: frequencies, importance weights, drawable starts, checkpoint round trip.

Each stored step carries its absolute write index in ``rollout_info``, so every drawn sequence can be checked.
"""
import math

import pytest
import torch

from alfish.data.types import Experience
from alfish.replay.prioritized import PrioritizedSampler
from alfish.replay.ring_buffer import RingBuffer


def step(env_ids, index):
    env_ids = torch.as_tensor(env_ids, dtype=torch.int64)
    index = torch.as_tensor(index, dtype=torch.int64)
    n = env_ids.shape[0]
    return Experience(step_type=torch.ones(n, dtype=torch.int8), reward=index.float(), discount=torch.ones(n),
                      observation=index.float().unsqueeze(1), action=torch.zeros(n, 1), env_id=env_ids,
                      rollout_info=dict(index=index.clone()))


def write_counts(ring):
    return ring.oldest_index() + ring.num_stored()


def add(ring, sampler, env_ids=None):
    """One step to each of ``env_ids`` (all envs by default), recorded by the sampler as the ring's owner would."""
    env_ids = torch.arange(ring.num_envs) if env_ids is None else torch.as_tensor(env_ids, dtype=torch.int64)
    before = write_counts(ring)[env_ids]
    # Both forms: explicit write counts, or the sampler's own (alternating by the parity of the first count).
    sampler.on_add(env_ids, before if int(before[0]) % 2 else None)
    ring.add(step(env_ids, before))


def make(num_envs, capacity, steps, **kwargs):
    ring = RingBuffer(num_envs, capacity)
    sampler = PrioritizedSampler(num_envs, capacity, **kwargs)
    for _ in range(steps):
        add(ring, sampler)
    return ring, sampler


def drawable_starts(ring, length):
    """Reference: the set of (env, start) a sequence of ``length`` may start at."""
    oldest, wc = ring.oldest_index().tolist(), write_counts(ring).tolist()
    return {(e, p) for e in range(ring.num_envs) for p in range(oldest[e], wc[e] - length + 1)}


def check_trees_match_reference(ring, sampler):
    """Every leaf holds its assigned priority iff its start is drawable, else 0 (sum) / inf (min)."""
    sampler.sync(ring)
    expected_sum = torch.zeros(ring.num_envs * ring.capacity, dtype=torch.float64)
    for e, p in drawable_starts(ring, sampler.sequence_length):
        leaf = e * ring.capacity + p % ring.capacity
        expected_sum[leaf] = float(sampler._assigned[leaf])
    assert torch.equal(sampler._sum.leaves(), expected_sum)
    if sampler._min is not None:
        expected_min = torch.where(expected_sum > 0, expected_sum, math.inf).float()
        assert torch.equal(sampler._min.leaves(), expected_min)


def test_sampling_frequencies_match_priorities():
    # 4 drawable starts (1 env, L=1) with stored priorities 1, 2, 3, 4 (alpha=1, eps=0): P(i) = p_i / 10.
    ring, sampler = make(1, 8, 4, alpha=1.0, eps=0.0)
    sampler.update_priorities(torch.zeros(4, dtype=torch.int64), torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(200):
        _, positions, _ = sampler.sample(1000, 1, ring, beta=0.0, generator=gen)
        counts += torch.bincount(positions, minlength=4)
    freq = counts / counts.sum()
    assert counts.sum() == 200_000
    assert torch.allclose(freq, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.01), freq


def test_importance_weights_by_hand():
    # 1 env, 4 drawable starts, stored priorities p = 1, 2, 3, 4 (alpha=1, eps=0): total 10, N = 4, beta = 0.5.
    #   w_i = (N * p_i / total) ** -beta = (0.4 p_i) ** -0.5
    #     p=1: 0.4 ** -0.5 = 1.58114  p=2: 0.8 ** -0.5 = 1.11803  p=3: 1.2 ** -0.5 = 0.91287  p=4: 1.6 ** -0.5 = 0.79057
    #   normalize_by_max, max_over="buffer": divided by the weight of p_min = 1, i.e. (p_i / 1) ** -0.5:
    #     1, 0.70711, 0.57735, 0.5
    #   normalize_by_max, max_over="batch": divided by the largest weight in the drawn batch.
    raw = {0: 1.58114, 1: 1.11803, 2: 0.91287, 3: 0.79057}
    buffer = {0: 1.0, 1: 0.70711, 2: 0.57735, 3: 0.5}
    for kwargs in (dict(), dict(normalize_by_max=True), dict(normalize_by_max=True, max_over="buffer")):
        ring, sampler = make(1, 8, 4, alpha=1.0, eps=0.0, **kwargs)
        sampler.update_priorities(torch.zeros(4, dtype=torch.int64), torch.arange(4), torch.tensor([1.0, 2, 3, 4]))
        gen = torch.Generator().manual_seed(1)
        for _ in range(5):
            _, positions, weights = sampler.sample(6, 1, ring, beta=0.5, generator=gen)
            assert weights.dtype == torch.float32
            if not kwargs:
                expected = [raw[p] for p in positions.tolist()]
            elif kwargs.get("max_over") == "buffer":
                expected = [buffer[p] for p in positions.tolist()]
            else:
                top = max(raw[p] for p in positions.tolist())
                expected = [raw[p] / top for p in positions.tolist()]
            assert weights.tolist() == pytest.approx(expected, abs=1e-5)
    # beta = 0: all weights 1; a callable beta is read at each call.
    _, _, weights = sampler.sample(6, 1, ring, beta=lambda: 0.0)
    assert weights.tolist() == [1.0] * 6


def test_priority_update_by_hand():
    # alpha = 0.5, eps = 1: stored = (priority + 1) ** 0.5. Priorities 3 and 8 -> stored 2 and 3.
    # The other two starts keep the initial max priority 1: total = 2 + 3 + 1 + 1 = 7; max priority becomes 3,
    # which the next new start gets.
    ring, sampler = make(1, 8, 4, alpha=0.5, eps=1.0)
    sampler.update_priorities(torch.tensor([0, 0]), torch.tensor([1, 3]), torch.tensor([3.0, 8.0]))
    assert sampler._sum.leaves()[:4].tolist() == [1.0, 2.0, 1.0, 3.0]
    assert float(sampler._sum.total()) == 7.0
    add(ring, sampler)
    sampler.sync(ring)  # (on_add's leaves are refreshed in a batch at the next sync)
    assert float(sampler._sum.get(torch.tensor(4))) == 3.0
    # A callable alpha is read at each update: alpha = 1 -> stored 8 + 1 = 9.
    sampler.alpha = lambda: 1.0
    sampler.update_priorities(torch.tensor([0]), torch.tensor([0]), torch.tensor([8.0]))
    assert float(sampler._sum.get(torch.tensor(0))) == 9.0
    # Duplicates: the last one wins.
    sampler.update_priorities(torch.tensor([0, 0]), torch.tensor([2, 2]), torch.tensor([4.0, 1.0]))
    assert float(sampler._sum.get(torch.tensor(2))) == 2.0
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="finite and non-negative"):
            sampler.update_priorities(torch.tensor([0, 0]), torch.tensor([0, 1]), torch.tensor([1.0, bad]))


def test_update_of_an_overwritten_start_is_ignored():
    ring, sampler = make(2, 4, 4, alpha=1.0, eps=0.0)
    env_ids, positions, _ = sampler.sample(8, 1, ring, beta=0.4)
    for _ in range(4):  # every sampled start is overwritten
        add(ring, sampler)
    before = sampler._sum._values.clone()
    sampler.update_priorities(env_ids, positions, torch.full((8,), 100.0), ring=ring)
    assert torch.equal(sampler._sum._values, before)
    assert float(sampler._max_priority) == 1.0


@pytest.mark.parametrize("length", [1, 3])
def test_only_drawable_starts_are_drawn_through_wraparound_async_adds_and_clear(length):
    gen = torch.Generator().manual_seed(length)
    ring = RingBuffer(3, 6)
    sampler = PrioritizedSampler(3, 6, sequence_length=length, alpha=1.0, normalize_by_max=True, max_over="buffer")
    seen = set()
    for i in range(60):
        envs = torch.nonzero(torch.rand(3, generator=gen) < 0.7).squeeze(1)  # a random subset of envs steps
        if len(envs):
            add(ring, sampler, envs)
        if i % 17 == 16:
            ring.clear(keep_last=int(torch.randint(0, 4, (1,), generator=gen)))
        allowed = drawable_starts(ring, length)
        check_trees_match_reference(ring, sampler)
        if not allowed:
            with pytest.raises(RuntimeError, match="too few for sequences"):
                sampler.sample(4, length, ring, beta=0.4, generator=gen)
            continue
        env_ids, positions, weights = sampler.sample(16, length, ring, beta=0.4, generator=gen)
        drawn = set(zip(env_ids.tolist(), positions.tolist()))
        assert drawn <= allowed, drawn - allowed
        seen |= drawn
        exp = ring.gather(env_ids, positions, length)
        assert torch.equal(exp.rollout_info["index"], positions.unsqueeze(1) + torch.arange(length))
        assert bool((weights <= 1.0 + 1e-6).all())  # normalized by the buffer's max
        if i % 5 == 0:
            sampler.update_priorities(env_ids, positions, torch.rand(16, generator=gen) * 5)
    assert len(seen) > 50  # the draws covered many different starts, including after wrap-around


def test_a_long_collection_before_the_first_sample():
    # 700 adds of 2 envs dirty 2,800 leaves: refreshed in bounded batches while adding, the rest at the first sample.
    ring, sampler = make(2, 50, 700, sequence_length=4, alpha=1.0, normalize_by_max=True, max_over="buffer")
    check_trees_match_reference(ring, sampler)
    env_ids, positions, _ = sampler.sample(64, 4, ring, beta=0.4)
    assert set(zip(env_ids.tolist(), positions.tolist())) <= drawable_starts(ring, 4)


def test_clear_then_one_step_leaves_exactly_one_start_per_env():
    ring, sampler = make(2, 8, 10, sequence_length=3)
    sampler.sample(4, 3, ring, beta=0.4)
    ring.clear(keep_last=2)  # kept: indices 8, 9; no sequence of 3 fits
    with pytest.raises(RuntimeError, match="too few"):
        sampler.sample(4, 3, ring, beta=0.4)
    add(ring, sampler)  # index 10: start 8 becomes drawable
    env_ids, positions, _ = sampler.sample(8, 3, ring, beta=0.4)
    assert positions.tolist() == [8] * 8 and sorted(set(env_ids.tolist())) == [0, 1]


def test_state_dict_round_trip_gives_identical_draws():
    for kwargs in (dict(), dict(normalize_by_max=True, max_over="buffer")):
        ring, sampler = make(2, 16, 25, sequence_length=2, **kwargs)
        sampler.update_priorities(*sampler.sample(8, 2, ring, beta=0.4)[:2], torch.arange(8.0))
        ring2 = RingBuffer(2, 16)
        ring2.load_state_dict(ring.state_dict(), step(torch.zeros(1), torch.zeros(1)))
        sampler2 = PrioritizedSampler(2, 16, sequence_length=2, **kwargs)
        sampler2.load_state_dict(sampler.state_dict())
        for s in (sampler, sampler2):
            assert all(isinstance(v, torch.Tensor) for v in s.state_dict().values())
        for _ in range(3):
            a = sampler.sample(32, 2, ring, beta=0.5, generator=torch.Generator().manual_seed(7))
            b = sampler2.sample(32, 2, ring2, beta=0.5, generator=torch.Generator().manual_seed(7))
            assert all(torch.equal(x, y) for x, y in zip(a, b))
            add(ring, sampler)
            add(ring2, sampler2)
    # A sampler with a min tree can load a state saved without one.
    plain_ring, plain = make(1, 8, 5, alpha=1.0, eps=0.0)
    plain.update_priorities(torch.tensor([0, 0]), torch.tensor([1, 2]), torch.tensor([0.5, 3.0]))
    with_min = PrioritizedSampler(1, 8, alpha=1.0, eps=0.0, normalize_by_max=True, max_over="buffer")
    with_min.load_state_dict(plain.state_dict())
    check_trees_match_reference(plain_ring, with_min)
    assert float(with_min._min.min()) == 0.5


def test_usage_errors_are_clear():
    ring, sampler = make(1, 8, 4, sequence_length=2)
    with pytest.raises(ValueError, match="sequence_length=2 .fixed at construction., asked for length=3"):
        sampler.sample(4, 3, ring, beta=0.4)
    ring.add(step([0], [4]))  # added without telling the sampler
    with pytest.raises(RuntimeError, match="call on_add for every RingBuffer.add"):
        sampler.sample(4, 2, ring, beta=0.4)
    with pytest.raises(ValueError, match="sequence_length must lie in"):
        PrioritizedSampler(1, 4, sequence_length=5)
    with pytest.raises(ValueError, match="max_over"):
        PrioritizedSampler(1, 4, max_over="global")
    ring, sampler = make(1, 4, 2, eps=0.0)
    sampler.update_priorities(torch.tensor([0, 0]), torch.tensor([0, 1]), torch.zeros(2))
    with pytest.raises(RuntimeError, match="every drawable start has priority 0"):
        sampler.sample(4, 1, ring, beta=0.4)


def test_sample_batch_returns_experience_and_batch_info():
    ring, sampler = make(2, 8, 6, sequence_length=2)
    exp, info = sampler.sample_batch(ring, 5, beta=0.4)
    assert exp.observation.shape == (5, 2, 1)
    assert torch.equal(exp.rollout_info["index"][:, 0], info.positions)
    assert info.importance_weights.shape == (5,)
