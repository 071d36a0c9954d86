"""PrioritizedSampler inside a ReplayBuffer: frequencies, importance weights, drawable starts, checkpoint round trip.

Each stored step carries its absolute write index in ``rollout_info``, so every drawn sequence can be checked.
"""
import io
import math

import numpy as np
import pytest
import torch

from alfish.data.types import BatchInfo, Experience
from alfish.replay import segment_tree
from alfish.replay.prioritized import PrioritizedSampler
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.replay.ring_buffer import RingBuffer
from tests.replay.test_segment_tree import torch_code

try:
    from scipy.stats import chi2
except ImportError:  # scipy is optional
    chi2 = None


def step(env_ids, index):
    env_ids = torch.as_tensor(env_ids, dtype=torch.int64)
    index = torch.as_tensor(index, dtype=torch.int64)
    n = env_ids.shape[0]
    return Experience(step_type=torch.ones(n, dtype=torch.int8), reward=index.float(), discount=torch.ones(n),
                      observation=index.float().unsqueeze(1), action=torch.zeros(n, 1), env_id=env_ids,
                      rollout_info={"index": index.clone()})


def add(buf, env_ids=None):
    """One step to each of ``env_ids`` (all envs by default), carrying its absolute write index."""
    env_ids = torch.arange(buf.num_envs) if env_ids is None else torch.as_tensor(env_ids, dtype=torch.int64)
    buf.add(step(env_ids, buf.write_count()[env_ids]))


def make(num_envs, capacity, steps, **kwargs):
    buf = ReplayBuffer(RingBuffer(num_envs, capacity), PrioritizedSampler(num_envs, capacity, **kwargs))
    for _ in range(steps):
        add(buf)
    return buf, buf.sampler


def at(env_ids, positions):
    """The BatchInfo of the starts ``(env_ids, positions)``, as ``sample`` would return it."""
    return BatchInfo(env_ids=torch.as_tensor(env_ids, dtype=torch.int64),
                     positions=torch.as_tensor(positions, dtype=torch.int64))


def flush(storage, sampler):
    """Refresh the leaves dirtied by adds (done lazily, at the next sample or update)."""
    sampler._refresh(storage.write_count(), storage.oldest_index())


def drawable_starts(storage, length):
    """Reference: the set of (env, start) a sequence of ``length`` may start at."""
    oldest, wc = storage.oldest_index().tolist(), storage.write_count().tolist()
    return {(e, p) for e in range(storage.num_envs) for p in range(oldest[e], wc[e] - length + 1)}


def check_trees_match_reference(storage, sampler):
    """Every leaf holds its assigned priority iff its start is drawable, else 0 (sum) / inf (min)."""
    flush(storage, sampler)
    expected_sum = torch.zeros(storage.num_envs * storage.capacity, dtype=torch.float64)
    for e, p in drawable_starts(storage, sampler.sequence_length):
        leaf = e * storage.capacity + p % storage.capacity
        expected_sum[leaf] = float(sampler._assigned[leaf])
    assert torch.equal(sampler._sum.leaves(), expected_sum)
    if sampler._min is not None:
        expected_min = torch.where(expected_sum > 0, expected_sum, math.inf).float()
        assert torch.equal(sampler._min.leaves(), expected_min)


def test_sampling_frequencies_match_priorities():
    # 4 drawable starts (1 env, L=1) with stored priorities 1, 2, 3, 4 (alpha=1, eps=0): P(i) = p_i / 10.
    gen = torch.Generator().manual_seed(0)
    buf, sampler = make(1, 8, 4, alpha=1.0, beta=0.0, eps=0.0, generator=gen)
    buf.update_priorities(at([0] * 4, range(4)), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    counts = torch.zeros(4)
    for _ in range(200):
        info = sampler.sample(buf.storage, 1000, 1)
        counts += torch.bincount(info.positions, minlength=4)
    freq = counts / counts.sum()
    assert counts.sum() == 200_000
    assert torch.allclose(freq, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.01), freq


def test_sampling_frequencies_pass_a_chi_square_test():
    """5 starts with distinct priorities; with alpha=0.6, eps=0.1 each start's probability is
    (priority + eps) ** alpha / sum_j (priority_j + eps) ** alpha. Pearson's chi-square over 20,000 draws, df = 4, at
    p = 0.001 (critical value 18.467). The draws are stratified (one target per segment of [0, total) per batch), which
    makes the counts *less* variable than the multinomial the test assumes: that only makes it easier to pass, so it
    checks the probabilities, not the variance."""
    priorities = torch.tensor([0.2, 1.0, 2.5, 4.0, 7.0])
    alpha, eps = 0.6, 0.1
    buf, sampler = make(1, 8, 5, alpha=alpha, eps=eps, generator=torch.Generator().manual_seed(3))
    buf.update_priorities(at([0] * 5, range(5)), priorities)
    stored = (priorities.double() + eps) ** alpha
    expected_p = stored / stored.sum()
    batches, batch_size = 200, 100
    counts = torch.zeros(5, dtype=torch.float64)
    for _ in range(batches):
        counts += torch.bincount(sampler.sample(buf.storage, batch_size, 1).positions, minlength=5).double()
    expected = expected_p * batches * batch_size
    statistic = float(((counts - expected) ** 2 / expected).sum())
    critical = float(chi2.ppf(0.999, df=4)) if chi2 is not None else 18.467
    assert critical == pytest.approx(18.467, abs=1e-3)
    assert statistic < critical, (statistic, counts.tolist(), expected.tolist())


def test_importance_weights_by_hand():
    # 1 env, 4 drawable starts, stored priorities p = 1, 2, 3, 4 (alpha=1, eps=0): total 10, N = 4, beta = 0.5.
    #   w_i = (N * p_i / total) ** -beta = (0.4 p_i) ** -0.5
    #     p=1: 0.4 ** -0.5 = 1.58114  p=2: 0.8 ** -0.5 = 1.11803  p=3: 1.2 ** -0.5 = 0.91287  p=4: 1.6 ** -0.5 = 0.79057
    #   normalize_by_max, max_over="buffer": divided by the weight of p_min = 1, i.e. (p_i / 1) ** -0.5:
    #     1, 0.70711, 0.57735, 0.5
    #   normalize_by_max, max_over="batch": divided by the largest weight in the drawn batch.
    raw = {0: 1.58114, 1: 1.11803, 2: 0.91287, 3: 0.79057}
    buffer = {0: 1.0, 1: 0.70711, 2: 0.57735, 3: 0.5}
    for kwargs in ({}, {"normalize_by_max": True}, {"normalize_by_max": True, "max_over": "buffer"}):
        buf, sampler = make(1, 8, 4, alpha=1.0, beta=0.5, eps=0.0, generator=torch.Generator().manual_seed(1),
                            **kwargs)
        buf.update_priorities(at([0] * 4, range(4)), torch.tensor([1.0, 2, 3, 4]))
        for _ in range(5):
            _, info = buf.sample(6, 1)
            positions, weights = info.positions, info.importance_weights
            assert weights.dtype == torch.float32
            if not kwargs:
                expected = [raw[p] for p in positions.tolist()]
            elif kwargs.get("max_over") == "buffer":
                expected = [buffer[p] for p in positions.tolist()]
            else:
                top = max(raw[p] for p in positions.tolist())
                expected = [raw[p] / top for p in positions.tolist()]
            assert weights.tolist() == pytest.approx(expected, abs=1e-5)
    # beta = 0: all weights 1; a callable beta (a schedule) is read at each call.
    sampler.beta = lambda: 0.0
    _, info = buf.sample(6, 1)
    assert info.importance_weights.tolist() == [1.0] * 6


def test_priority_update_by_hand():
    # alpha = 0.5, eps = 1: stored = (priority + 1) ** 0.5. Priorities 3 and 8 -> stored 2 and 3.
    # The other two starts keep the initial max priority 1: total = 2 + 3 + 1 + 1 = 7; max priority becomes 3,
    # which the next new start gets.
    buf, sampler = make(1, 8, 4, alpha=0.5, eps=1.0)
    buf.update_priorities(at([0, 0], [1, 3]), torch.tensor([3.0, 8.0]))
    assert sampler._sum.leaves()[:4].tolist() == [1.0, 2.0, 1.0, 3.0]
    assert float(sampler._sum.total()) == 7.0
    add(buf)
    flush(buf.storage, sampler)  # (on_add's leaves are refreshed in a batch at the next sample or update)
    assert float(sampler._sum.get(torch.tensor(4))) == 3.0
    # A callable alpha is read at each update: alpha = 1 -> stored 8 + 1 = 9.
    sampler.alpha = lambda: 1.0
    buf.update_priorities(at([0], [0]), torch.tensor([8.0]))
    assert float(sampler._sum.get(torch.tensor(0))) == 9.0
    # Duplicates: the last one wins.
    buf.update_priorities(at([0, 0], [2, 2]), torch.tensor([4.0, 1.0]))
    assert float(sampler._sum.get(torch.tensor(2))) == 2.0
    # A priority that is not finite and >= 0 is replaced by 0 (stored (0 + eps) ** alpha = 1 here) and counted on the
    # sampler's device, without a host sync; validate=True (a debugging aid) raises instead.
    buf.update_priorities(at([0, 0, 0, 0], [0, 1, 3, 2]), torch.tensor([float("nan"), float("inf"), -1.0, 5.0]))
    assert int(sampler.invalid_priorities) == 3
    assert sampler._sum.get(torch.tensor([0, 1, 3, 2])).tolist() == [1.0, 1.0, 1.0, 6.0]
    sampler.validate = True
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="finite and non-negative"):
            buf.update_priorities(at([0, 0], [0, 1]), torch.tensor([1.0, bad]))
    assert int(sampler.invalid_priorities) == 3


def test_update_of_an_overwritten_start_is_ignored():
    buf, sampler = make(2, 4, 4, alpha=1.0, eps=0.0)
    _, info = buf.sample(8, 1)
    for _ in range(4):  # every sampled start is overwritten
        add(buf)
    flush(buf.storage, sampler)
    before = sampler._sum._values.clone()
    buf.update_priorities(info, torch.full((8,), 100.0))
    assert torch.equal(sampler._sum._values, before)
    assert float(sampler._max_priority) == 1.0


def test_update_of_a_cleared_start_is_ignored():
    buf, sampler = make(1, 8, 6, alpha=1.0, eps=0.0)
    _, info = buf.sample(8, 1)
    assert 5 in info.positions.tolist()  # (stratified: the last of 8 segments over 6 equal starts is start 5)
    buf.clear(keep_last=1)  # only start 5 is left
    buf.update_priorities(info, torch.where(info.positions == 5, 3.0, 100.0))
    assert float(sampler._max_priority) == 3.0  # the cleared starts' 100 was ignored
    assert sampler._sum.leaves()[:6].tolist() == [0.0] * 5 + [3.0]  # and they stay out of the tree


@pytest.mark.parametrize("length", [1, 3])
def test_only_drawable_starts_are_drawn_through_wraparound_async_adds_and_clear(length):
    gen = torch.Generator().manual_seed(length)
    buf = ReplayBuffer(RingBuffer(3, 6), PrioritizedSampler(3, 6, sequence_length=length, alpha=1.0, beta=0.4,
                                                            normalize_by_max=True, max_over="buffer", generator=gen))
    seen = set()
    for i in range(60):
        envs = torch.nonzero(torch.rand(3, generator=gen) < 0.7).squeeze(1)  # a random subset of envs steps
        if len(envs):
            add(buf, envs)
        if i % 17 == 16:
            buf.clear(keep_last=int(torch.randint(0, 4, (1,), generator=gen)))
        allowed = drawable_starts(buf.storage, length)
        check_trees_match_reference(buf.storage, buf.sampler)
        if not allowed:
            with pytest.raises(RuntimeError, match="too few for sequences"):
                buf.sample(4, length)
            continue
        exp, info = buf.sample(16, length)
        drawn = set(zip(info.env_ids.tolist(), info.positions.tolist()))
        assert drawn <= allowed, drawn - allowed
        seen |= drawn
        assert torch.equal(exp.rollout_info["index"], info.positions.unsqueeze(1) + torch.arange(length))
        assert bool((info.importance_weights <= 1.0 + 1e-6).all())  # normalized by the buffer's max
        if i % 5 == 0:
            buf.update_priorities(info, torch.rand(16, generator=gen) * 5)
    assert len(seen) > 50  # the draws covered many different starts, including after wrap-around


def test_a_long_collection_before_the_first_sample():
    # 700 adds of 2 envs dirty 2,800 leaves: refreshed in bounded batches while adding, the rest at the first sample.
    buf, sampler = make(2, 50, 700, sequence_length=4, alpha=1.0, normalize_by_max=True, max_over="buffer")
    check_trees_match_reference(buf.storage, sampler)
    _, info = buf.sample(64, 4)
    assert set(zip(info.env_ids.tolist(), info.positions.tolist())) <= drawable_starts(buf.storage, 4)


def test_clear_then_one_step_leaves_exactly_one_start_per_env():
    buf, _ = make(2, 8, 10, sequence_length=3)
    buf.sample(4, 3)
    buf.clear(keep_last=2)  # kept: indices 8, 9; no sequence of 3 fits
    with pytest.raises(RuntimeError, match="too few"):
        buf.sample(4, 3)
    add(buf)  # index 10: start 8 becomes drawable
    _, info = buf.sample(8, 3)
    assert info.positions.tolist() == [8] * 8 and sorted(set(info.env_ids.tolist())) == [0, 1]


def test_a_prefilled_storage_gets_the_initial_priority():
    storage = RingBuffer(2, 5)
    for i in range(7):  # wrapped: indices 2..6 readable
        storage.add(step([0, 1], [i, i]))
    buf = ReplayBuffer(storage, PrioritizedSampler(2, 5, sequence_length=2, initial_priority=2.0))
    check_trees_match_reference(storage, buf.sampler)
    assert float(buf.sampler._sum.total()) == 2 * 4 * 2.0  # 4 starts (2..5) per env
    _, info = buf.sample(16, 2)
    assert set(zip(info.env_ids.tolist(), info.positions.tolist())) <= drawable_starts(storage, 2)


def test_state_dict_round_trip_gives_identical_draws():
    for kwargs in ({}, {"normalize_by_max": True, "max_over": "buffer"}):
        buf, _ = make(2, 16, 25, sequence_length=2, beta=0.5, generator=torch.Generator(), **kwargs)
        _, info = buf.sample(8, 2)
        buf.update_priorities(info, torch.arange(8.0))
        add(buf)  # leaves awaiting a refresh are part of the state
        blob = io.BytesIO()  # through the checkpoint format: torch.save + torch.load(weights_only=True)
        torch.save(buf.state_dict(), blob)
        blob.seek(0)
        buf2 = ReplayBuffer(RingBuffer(2, 16), PrioritizedSampler(2, 16, sequence_length=2, beta=0.5,
                                                                  generator=torch.Generator(), **kwargs))
        buf2.load_state_dict(torch.load(blob, weights_only=True), step(torch.zeros(1), torch.zeros(1)))
        for s in (buf.sampler, buf2.sampler):
            assert all(isinstance(v, torch.Tensor) for v in s.state_dict().values())
        for _ in range(3):
            buf.sampler.generator.manual_seed(7)
            buf2.sampler.generator.manual_seed(7)
            a = buf.sampler.sample(buf.storage, 32, 2)
            b = buf2.sampler.sample(buf2.storage, 32, 2)
            assert all(torch.equal(x, y) for x, y in zip(a, b))
            add(buf)
            add(buf2)
    # A sampler with a min tree can load a state saved without one.
    plain_buf, plain = make(1, 8, 5, alpha=1.0, eps=0.0)
    plain_buf.update_priorities(at([0, 0], [1, 2]), torch.tensor([0.5, 3.0]))
    with_min = PrioritizedSampler(1, 8, alpha=1.0, eps=0.0, normalize_by_max=True, max_over="buffer")
    with_min.load_state_dict(plain.state_dict())
    check_trees_match_reference(plain_buf.storage, with_min)
    assert float(with_min._min.min()) == 0.5


def test_usage_errors_are_clear():
    buf, sampler = make(1, 8, 4, sequence_length=2)
    with pytest.raises(ValueError, match="sequence_length=2 .fixed at construction., asked for length=3"):
        buf.sample(4, 3)
    with pytest.raises(ValueError, match="sequences must be at least 1 step long, asked for length=0"):
        buf.sample(4, 0)
    with pytest.raises(ValueError, match="sequence_length must lie in"):
        PrioritizedSampler(1, 4, sequence_length=5)
    with pytest.raises(ValueError, match="max_over"):
        PrioritizedSampler(1, 4, max_over="global")
    with pytest.raises(ValueError, match=r"built for 2 envs x 8 steps, the storage holds 1 x 8"):
        ReplayBuffer(RingBuffer(1, 8), PrioritizedSampler(2, 8))
    with pytest.raises(ValueError, match=r"checkpoint's prioritized sampler has 8 slots, this one 16 \(2 envs x 8"):
        PrioritizedSampler(2, 8).load_state_dict(sampler.state_dict())
    with pytest.raises(ValueError, match=r"has no priorities \(it was sampled uniformly\)"):
        PrioritizedSampler(1, 8).load_state_dict({})
    with pytest.raises(ValueError, match=r"got 3 priorities for 2 sampled sequences"):
        buf.update_priorities(at([0, 0], [0, 1]), torch.ones(3))
    with pytest.raises(TypeError, match="priorities must be a tensor"):
        buf.update_priorities(at([0, 0], [0, 1]), [1.0, 2.0])
    buf, sampler = make(1, 4, 2, eps=0.0)
    buf.update_priorities(at([0, 0], [0, 1]), torch.zeros(2))
    with pytest.raises(RuntimeError, match="every drawable start has priority 0"):
        buf.sample(4, 1)


def test_sample_returns_experience_and_batch_info():
    buf, _ = make(2, 8, 6, sequence_length=2)
    exp, info = buf.sample(5, 2)
    assert exp.observation.shape == (5, 2, 1)
    assert torch.equal(exp.rollout_info["index"][:, 0], info.positions)
    assert info.importance_weights.shape == (5,)
    assert info.env_ids.dtype == info.positions.dtype == torch.int64


# ------------------------------------------------------------------------------------- host trees: the numpy path --
# A sampler with trees on the CPU runs numpy code (prioritized/host.py's docstring); every test above goes through
# it. These check it against a brute-force model of the rules, and against the torch code run on the same CPU data
# (``segment_tree.NUMPY_ON_CPU = False``), bit for bit.
# (``torch_code`` from test_segment_tree: samplers built inside run the torch code even with their trees on the CPU.)


@pytest.fixture(params=[(12, 5), (2, 2)], ids=["top12-step5", "top2-step2"])
def tree_shape(request, monkeypatch):
    """Also small tree shapes, so the small trees of these tests take several descent steps."""
    top, step = request.param
    monkeypatch.setattr(segment_tree, "TOP_LEVEL", top)
    monkeypatch.setattr(segment_tree, "DESCENT_LEVELS", step)


class BruteForce:
    """The sampler's rules, one slot at a time: assigned priorities (alpha = 1, so stored = priority + eps), the max
    priority, the tree value of each slot (its assigned priority iff the start written there last is drawable), the
    stratified draws by a cumulative sum. With integer priorities and eps = 0.5 every sum is exact."""

    def __init__(self, num_envs, capacity, length, eps):
        self.num_envs, self.capacity, self.length, self.eps = num_envs, capacity, length, eps
        self.assigned = np.zeros(num_envs * capacity)
        self.max = 1.0  # initial_priority
        self.invalid = 0

    def on_add(self, env_ids, counts_before):
        for e, w in zip(env_ids, counts_before):
            self.assigned[e * self.capacity + w % self.capacity] = self.max

    def leaf_values(self, storage):
        wc, oldest = storage.write_count().tolist(), storage.oldest_index().tolist()
        values = np.zeros(self.num_envs * self.capacity)
        for e in range(self.num_envs):
            for p in range(oldest[e], wc[e] - self.length + 1):  # the drawable starts
                values[e * self.capacity + p % self.capacity] = self.assigned[e * self.capacity + p % self.capacity]
        return values

    def sample(self, storage, u, beta, normalize_by_max, max_over):
        values = self.leaf_values(storage)
        cum = np.cumsum(values)
        total = cum[-1]
        targets = (np.arange(u.size) + u) * (total / u.size)
        leaves = np.searchsorted(cum, np.minimum(targets, np.nextafter(total, 0)), side="right")
        wc, oldest = storage.write_count().numpy(), storage.oldest_index().numpy()
        env_ids = leaves // self.capacity
        last = wc[env_ids] - 1
        positions = last - (last - leaves) % self.capacity
        n = np.maximum(wc - self.length + 1 - oldest, 0).sum()
        weights = (n * values[leaves] / total) ** -beta
        if normalize_by_max and max_over == "batch":
            weights = weights / weights.max()
        elif normalize_by_max:
            weights = (values[leaves] / values[values > 0].min()) ** -beta
        return env_ids, positions, weights

    def update(self, storage, env_ids, positions, priorities):
        wc, oldest = storage.write_count().tolist(), storage.oldest_index().tolist()
        new = {}
        for e, p, x in zip(env_ids, positions, priorities):  # in order: the last valid entry of a start wins
            if not (x >= 0 and x < math.inf):
                x = 0.0
                self.invalid += 1
            if oldest[e] <= p < wc[e]:
                new[e * self.capacity + p % self.capacity] = x + self.eps
        for leaf, value in new.items():
            self.assigned[leaf] = value
        self.max = max([self.max, *new.values()])  # (the priorities set, not those a later entry replaced)


@pytest.mark.parametrize("num_envs, capacity, length, kwargs", [
    (1, 40, 1, {}), (1, 40, 2, {"normalize_by_max": True}),
    (3, 20, 3, {"normalize_by_max": True, "max_over": "buffer"}), (2, 30, 2, {})])
def test_host_sampler_follows_a_brute_force_model(tree_shape, num_envs, capacity, length, kwargs):
    gen = torch.Generator().manual_seed(capacity + length)
    beta, eps = 0.5, 0.5
    buf, sampler = make(num_envs, capacity, 0, sequence_length=length, alpha=1.0, beta=beta, eps=eps,
                        generator=torch.Generator().manual_seed(1), **kwargs)
    model = BruteForce(num_envs, capacity, length, eps)
    storage = buf.storage
    for round_ in range(40):
        for _ in range(int(torch.randint(1, 8, (1,), generator=gen))):
            envs = torch.nonzero(torch.rand(num_envs, generator=gen) < 0.8).squeeze(1)
            if len(envs):
                model.on_add(envs.tolist(), storage.write_count()[envs].tolist())
                add(buf, envs)
        if round_ % 11 == 10:
            buf.clear(keep_last=int(torch.randint(0, 4, (1,), generator=gen)))
        if not drawable_starts(storage, length):
            continue
        batch = int(torch.randint(1, 50, (1,), generator=gen))
        state = sampler.generator.get_state()
        info = sampler.sample(storage, batch, length)
        u = torch.rand(batch, generator=torch.Generator().set_state(state), dtype=torch.float64).numpy()
        env_ids, positions, weights = model.sample(storage, u, beta, sampler.normalize_by_max, sampler.max_over)
        assert info.env_ids.dtype == info.positions.dtype == torch.int64
        assert info.importance_weights.dtype == torch.float32
        assert info.env_ids.tolist() == env_ids.tolist() and info.positions.tolist() == positions.tolist()
        assert info.importance_weights.tolist() == pytest.approx(weights.tolist(), rel=1e-6)
        # New priorities: small integers, some invalid; some entries repeated (the last one wins), some of them
        # for starts overwritten since (ignored).
        priorities = torch.randint(0, 10, (batch,), generator=gen).float()
        priorities[torch.rand(batch, generator=gen) < 0.1] = float("nan")
        priorities[torch.rand(batch, generator=gen) < 0.1] = -1.0
        priorities[torch.rand(batch, generator=gen) < 0.05] = float("inf")
        repeat = torch.randint(0, batch, (batch // 3,), generator=gen)
        env_all = torch.cat([info.env_ids, info.env_ids[repeat]])
        pos_all = torch.cat([info.positions, info.positions[repeat] - capacity * (round_ % 2)])
        priorities = torch.cat([priorities, torch.randint(0, 10, (repeat.numel(),), generator=gen).float()])
        if round_ % 4 == 2:  # the newest step of env 0: in the ring, but no drawable start when L > 1
            env_all = torch.cat([env_all, torch.tensor([0])])
            pos_all = torch.cat([pos_all, storage.write_count()[:1] - 1])
            priorities = torch.cat([priorities, torch.tensor([7.0])])
        model.update(storage, env_all.tolist(), pos_all.tolist(), priorities.tolist())
        buf.update_priorities(at(env_all, pos_all), priorities)
        flush(storage, sampler)
        assert sampler._assigned.tolist() == model.assigned.tolist()
        assert sampler._sum.leaves().tolist() == model.leaf_values(storage).tolist()
        assert float(sampler._max_priority) == model.max
        invalid = sampler.invalid_priorities
        assert invalid.dtype == torch.int64 and invalid.dim() == 0 and int(invalid) == model.invalid
        check_trees_match_reference(storage, sampler)


def run_scenario(num_envs, capacity, length, seed, **kwargs):
    """Random adds, clears, samples and updates (duplicates, overwritten starts, invalid priorities, float32 and
    float64 priorities); returns every sample and the final state."""
    gen = torch.Generator().manual_seed(seed)
    buf, sampler = make(num_envs, capacity, 0, sequence_length=length, alpha=0.6, beta=0.4,
                        generator=torch.Generator().manual_seed(seed), **kwargs)
    draws = []
    for round_ in range(60):
        for _ in range(int(torch.randint(1, capacity // 10, (1,), generator=gen))):
            envs = torch.nonzero(torch.rand(num_envs, generator=gen) < 0.8).squeeze(1)
            if len(envs):
                add(buf, envs)
        if round_ % 17 == 16:
            buf.clear(keep_last=int(torch.randint(0, 5, (1,), generator=gen)))
        if not buf.storage.holds_sequence(length):
            continue
        info = buf.sampler.sample(buf.storage, int(torch.randint(1, 300, (1,), generator=gen)), length)
        draws.append(info)
        priorities = torch.rand(info.env_ids.numel(), generator=gen) * 10
        if round_ % 5 == 0:
            priorities[::7] = float("nan")
            priorities[1::11] = -1.0
            priorities[2::13] = float("inf")
        if round_ % 3 == 0:
            info = at(torch.cat([info.env_ids, info.env_ids[:5]]),
                      torch.cat([info.positions, info.positions[:5] - capacity * (round_ % 2)]))
            priorities = torch.cat([priorities, torch.rand(min(5, len(priorities)), generator=gen)])
        buf.update_priorities(info, priorities.double() if round_ % 4 == 0 else priorities)
        if round_ % 7 == 0:
            add(buf)  # leaves left dirty in the state
    return draws, sampler.state_dict(), int(sampler.invalid_priorities), float(sampler._max_priority)


@pytest.mark.parametrize("num_envs, capacity, length, kwargs", [
    (1, 300, 2, {}), (3, 100, 3, {"normalize_by_max": True}),
    (2, 150, 1, {"normalize_by_max": True, "max_over": "buffer"})])
def test_host_and_torch_code_draw_and_store_the_same_bits(tree_shape, num_envs, capacity, length, kwargs):
    host = run_scenario(num_envs, capacity, length, 5, **kwargs)
    with torch_code():
        reference = run_scenario(num_envs, capacity, length, 5, **kwargs)
    assert len(host[0]) == len(reference[0]) > 40
    for a, b in zip(host[0], reference[0]):
        assert all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(a, b))
    assert host[1].keys() == reference[1].keys()
    assert all(torch.equal(host[1][k], reference[1][k]) for k in host[1])
    assert host[2:] == reference[2:]


def test_host_counters_match_the_ring():
    gen = torch.Generator().manual_seed(0)
    for num_envs in (1, 3):
        buf, sampler = make(num_envs, 6, 0, sequence_length=2)
        for i in range(40):
            envs = torch.nonzero(torch.rand(num_envs, generator=gen) < 0.7).squeeze(1)
            if len(envs):
                add(buf, envs)
            if i % 13 == 12:
                buf.clear(keep_last=int(torch.randint(0, 3, (1,), generator=gen)))  # (replaces the ring's floor)
            write_count, oldest = sampler._counters_host(buf.storage)
            assert write_count.tolist() == buf.storage.write_count().tolist()
            assert oldest.tolist() == buf.storage.oldest_index().tolist()
            if num_envs == 1:
                assert sampler._one_env_counters(buf.storage) == (write_count[0], oldest[0])
        # A ring restored from a checkpoint has new counter tensors.
        buf2 = ReplayBuffer(RingBuffer(num_envs, 6), PrioritizedSampler(num_envs, 6, sequence_length=2))
        buf2.sampler._counters_host(buf2.storage)
        buf2.load_state_dict(buf.state_dict(), step(torch.zeros(1), torch.zeros(1)))
        write_count, oldest = buf2.sampler._counters_host(buf2.storage)
        assert write_count.tolist() == buf.storage.write_count().tolist()
        assert oldest.tolist() == buf.storage.oldest_index().tolist()


def test_host_samples_are_fresh_tensors():
    buf, sampler = make(2, 16, 12, sequence_length=2, generator=torch.Generator().manual_seed(0))
    first = sampler.sample(buf.storage, 32, 2)
    kept = [x.clone() for x in first]
    sampler.sample(buf.storage, 32, 2)
    buf.update_priorities(first, torch.rand(32) * 3)
    assert all(torch.equal(x, y) for x, y in zip(first, kept))  # nothing of the first sample was reused
