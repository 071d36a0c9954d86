"""SumTree / MinTree against numpy references: batched updates (with duplicates), summaries, prefix-sum search.

The trees keep levels up to ``TOP_LEVEL`` and search ``DESCENT_LEVELS`` levels per step; the ``shape`` fixture also runs
every test with small values of both, so small trees exercise the same code paths as a 1M-leaf one.
"""
import contextlib

import numpy as np
import pytest
import torch

from alfish.replay import segment_tree
from alfish.replay.segment_tree import MinTree, SumTree, last_write_wins


@pytest.fixture(autouse=True, params=[(12, 5), (2, 3), (0, 1)], ids=["top12-step5", "top2-step3", "top0-step1"])
def shape(request, monkeypatch):
    top, step = request.param
    monkeypatch.setattr(segment_tree, "TOP_LEVEL", top)
    monkeypatch.setattr(segment_tree, "DESCENT_LEVELS", step)


def check_internal_nodes(tree, reduce):
    """Every maintained internal node equals op(its two children)."""
    values = tree._values
    for i in range(1 << tree.top, tree.num_leaves):
        assert values[i] == reduce(values[2 * i], values[2 * i + 1]), f"node {i}"


def reference_update(ref, indices, values):
    for i, v in zip(indices.tolist(), values.tolist()):  # sequential: the last write of a duplicate wins
        ref[i] = v


@pytest.mark.parametrize("capacity", [1, 2, 5, 13, 100, 1000])
def test_sum_and_min_trees_follow_numpy_under_random_batched_updates(capacity):
    gen = torch.Generator().manual_seed(capacity)
    s, m = SumTree(capacity), MinTree(capacity, dtype=torch.float64)
    ref = np.zeros(capacity)
    ref_min = np.full(capacity, np.inf)
    assert s.total() == 0 and m.min() == float("inf")
    for round_ in range(12):
        n = int(torch.randint(1, 2 * capacity + 1, (1,), generator=gen)) if round_ % 4 == 0 else 3
        idx = torch.randint(0, capacity, (n,), generator=gen)  # with replacement: duplicates in one call
        vals = torch.rand(n, generator=gen, dtype=torch.float64) * 10
        s.update(idx, vals)
        m.update(idx, vals)
        reference_update(ref, idx, vals)
        reference_update(ref_min, idx, vals)
        assert np.array_equal(s.get(torch.arange(capacity)).numpy(), ref)
        assert np.array_equal(m.get(torch.arange(capacity)).numpy(), ref_min)
        assert float(s.total()) == pytest.approx(ref.sum(), rel=1e-12)
        assert float(m.min()) == ref_min.min()
    check_internal_nodes(s, lambda a, b: a + b)
    check_internal_nodes(m, torch.minimum)
    # Leaves beyond capacity stay neutral.
    assert bool((s._values[s.num_leaves + capacity:] == 0).all())
    assert bool((m._values[m.num_leaves + capacity:] == float("inf")).all())


def test_duplicate_indices_last_write_wins_on_both_update_paths():
    for capacity in (64, 4):  # 3 leaves x 6 levels < 64: per-path update; 3 x 2 > 4: full rebuild
        s = SumTree(capacity)
        s.update(torch.tensor([3, 1, 3]), torch.tensor([5.0, 2.0, 7.0]))
        assert s.get(torch.tensor([1, 3])).tolist() == [2.0, 7.0]
        assert float(s.total()) == 9.0
    idx, vals = last_write_wins(torch.tensor([4, 2, 4, 4, 2, 0]), torch.tensor([1, 2, 3, 4, 5, 6]))
    assert idx.tolist() == [0, 2, 2, 4, 4, 4] and vals.tolist() == [6, 5, 5, 4, 4, 4]


def test_path_update_and_full_rebuild_agree():
    gen = torch.Generator().manual_seed(0)
    a, b = SumTree(1000), SumTree(1000)
    vals = torch.rand(1000, generator=gen, dtype=torch.float64)
    a.update(torch.arange(1000), vals)  # bulk: rebuild
    for chunk in torch.arange(1000).split(7):  # small batches: per-path update
        b.update(chunk, vals[chunk])
    assert torch.equal(a._values, b._values)


@pytest.mark.parametrize("capacity", [1, 5, 16, 300, 5000])
def test_find_prefix_sum_matches_numpy_searchsorted(capacity):
    gen = torch.Generator().manual_seed(capacity)
    # Integer leaves (exact in float64) with many zeros, so boundaries are exact and comparable.
    vals = torch.randint(0, 4, (capacity,), generator=gen).double()
    vals[0] = 0
    vals[-1] = max(float(vals[-1]), 1.0) if capacity == 1 else 0
    if vals.sum() == 0:
        vals[capacity // 2] = 2
    s = SumTree(capacity)
    s.update(torch.arange(capacity), vals)
    cum = np.cumsum(vals.numpy())
    total = float(s.total())
    assert total == cum[-1]
    targets = np.concatenate([[0.0, np.nextafter(total, 0), total - 1e-9], cum[:-1][cum[:-1] < total],  # boundaries
                              np.random.default_rng(capacity).uniform(0, total, 200)])
    got = s.find_prefix_sum(torch.from_numpy(targets)).numpy()
    expected = np.searchsorted(cum, targets, side="right")  # smallest i with cum[i] > target
    assert np.array_equal(got, expected)
    assert bool((vals[got] > 0).all())  # a zero leaf is never returned


def test_find_prefix_sum_with_float_leaves_and_out_of_range_targets():
    gen = torch.Generator().manual_seed(1)
    vals = torch.rand(777, generator=gen, dtype=torch.float64)
    vals[::3] = 0
    s = SumTree(777)
    s.update(torch.arange(777), vals)
    cum = np.cumsum(vals.numpy())
    targets = torch.rand(1000, generator=gen, dtype=torch.float64) * s.total()
    got = s.find_prefix_sum(targets).numpy()
    t = targets.numpy()
    lower = np.where(got > 0, cum[got - 1], 0.0)
    assert np.all(lower <= t + 1e-9) and np.all(t < cum[got] + 1e-9)
    assert bool((vals[got] > 0).all())
    last_positive = int(np.nonzero(vals.numpy())[0][-1])
    first_positive = int(np.nonzero(vals.numpy())[0][0])
    edge = s.find_prefix_sum(torch.tensor([float(s.total()), 1e9, -1.0]))
    assert edge.tolist() == [last_positive, last_positive, first_positive]
    assert s.find_prefix_sum(torch.zeros(2, 3)).shape == (2, 3)  # shaped like the targets


def test_sum_tree_stays_exact_over_many_leaves_and_updates():
    n = 1 << 18
    gen = torch.Generator().manual_seed(2)
    s = SumTree(n)
    vals = torch.rand(n, generator=gen, dtype=torch.float64)
    s.update(torch.arange(n), vals)
    for _ in range(50):
        idx = torch.randint(0, n, (256,), generator=gen)
        new = torch.rand(256, generator=gen, dtype=torch.float64)
        s.update(idx, new)
        vals[idx] = new  # no duplicates matter here: last write wins on both sides
    assert float(s.total()) == pytest.approx(float(vals.sum()), rel=1e-13)


def test_errors_and_state_dict_round_trip():
    s = SumTree(10)
    with pytest.raises(IndexError, match=r"leaf indices must lie in \[0, 10\)"):
        s.update(torch.tensor([10]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="same number of elements"):
        s.update(torch.tensor([1, 2]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="capacity >= 1"):
        SumTree(0)
    s.update(torch.tensor([2, 7]), torch.tensor([1.5, 2.5]))
    total = s.total()
    s2 = SumTree(10)
    s2.load_state_dict(s.state_dict())
    assert torch.equal(s2._values, s._values)
    s.update(torch.tensor([2]), torch.tensor([0.0]))
    assert float(total) == 4.0  # total() is a copy, not a view of the tree
    with pytest.raises(ValueError, match="capacity 3"):
        SumTree(3).load_state_dict(s2.state_dict())
    m = MinTree(3)
    m.update(torch.tensor([0, 2]), torch.tensor([3.0, -1.0]))
    m2 = MinTree(3)
    m2.load_state_dict(m.state_dict())
    assert float(m2.min()) == -1.0 and m2.dtype == torch.float32


# ------------------------------------------------------------------------------------------------ the host path --
# Trees on the CPU run numpy code (segment_tree's module docstring). The tests above go through it (the torch-facing
# methods convert and call it); these check it against brute-force references on bigger trees (several descent steps
# at every ``shape``), and against the torch code run on the same CPU data (``NUMPY_ON_CPU = False``).
@contextlib.contextmanager
def torch_code():
    """Trees built inside run the torch code even on the CPU."""
    segment_tree.NUMPY_ON_CPU = False
    try:
        yield
    finally:
        segment_tree.NUMPY_ON_CPU = True


def reference_search(leaves, targets):
    """Brute force: targets clamped to [0, total); the smallest i with leaves[0] + ... + leaves[i] > target, and for a
    target >= total the last positive leaf (exact for integer leaves)."""
    cum = np.cumsum(leaves)
    last_positive = int(np.nonzero(leaves)[0][-1])
    t = np.maximum(targets, 0.0)
    return np.where(t >= cum[-1], last_positive, np.searchsorted(cum, t, side="right"))


@pytest.mark.parametrize("capacity", [1, 7, 4096, 5000, 70000])
def test_host_find_prefix_sum_matches_a_cumsum_reference_and_the_torch_code(capacity):
    rng = np.random.default_rng(capacity)
    # Integer leaves (sums exact in float64) with many zeros, zero runs at both ends.
    vals = rng.integers(0, 4, capacity).astype(np.float64) * (rng.random(capacity) < 0.6)
    vals[: capacity // 10] = 0
    vals[capacity - capacity // 10:] = 0
    vals[capacity // 2] = 3.0
    s = SumTree(capacity)
    s.update_host(np.arange(capacity), vals)
    with torch_code():
        ref = SumTree(capacity)
    ref.update(torch.arange(capacity), torch.from_numpy(vals))
    cum = np.cumsum(vals)
    total = cum[-1]
    assert s.total_host() == total == float(ref.total())
    boundaries = np.unique(cum)
    boundaries = rng.choice(boundaries, min(boundaries.size, 2000), replace=False)
    # (Exact boundaries and half-integers: a target within a few ulps of a boundary may go either way, by the
    # rounding of ``t - cum[j] + sums[j]``, in the torch code as here; those are compared with it in the next test.)
    targets = np.concatenate([[0.0, -1.0, np.nextafter(total, 0), total, 2 * total, np.nextafter(0.0, 1.0)],
                              boundaries, boundaries - 0.5, rng.uniform(0, total, 500)])
    got = s.find_prefix_sum_host(targets)
    assert got.dtype == np.int64
    assert np.array_equal(got, reference_search(vals, targets))
    assert np.all(vals[got] > 0)  # a zero leaf is never returned
    assert torch.equal(s.find_prefix_sum(torch.from_numpy(targets)), ref.find_prefix_sum(torch.from_numpy(targets)))
    ascending = np.sort(rng.uniform(0, total * 1.01, 256))  # the sampler's case (ascending=True)
    assert np.array_equal(s.find_prefix_sum_host(ascending, ascending=True), reference_search(vals, ascending))


def test_host_find_prefix_sum_with_float_leaves_matches_the_torch_code():
    rng = np.random.default_rng(3)
    for capacity in (100, 3000, 40000):
        vals = rng.random(capacity) * (rng.random(capacity) < 0.7)
        s = SumTree(capacity)
        with torch_code():
            ref = SumTree(capacity)
        for tree in (s, ref):
            tree.update(torch.arange(capacity), torch.from_numpy(vals))
        total = float(ref.total())
        # Targets on and around every rounding-prone spot: each prefix sum, and the stratified draws of a sampler.
        cum = np.cumsum(vals)
        targets = np.concatenate([cum, np.nextafter(cum, 0), np.nextafter(cum, np.inf), [total],
                                  (np.arange(256) + rng.random(256)) * (total / 256)])
        got = s.find_prefix_sum(torch.from_numpy(targets))
        assert torch.equal(got, ref.find_prefix_sum(torch.from_numpy(targets)))
        lower = np.where(got > 0, cum[got.numpy() - 1], 0.0)
        t = np.minimum(targets, total)
        assert np.all(lower <= t + 1e-9 * total) and np.all(t < cum[got.numpy()] + 1e-9 * total)
        assert np.all(vals[got.numpy()] > 0)


@pytest.mark.parametrize("tree_cls, dtype", [(SumTree, torch.float64), (MinTree, torch.float32)])
def test_host_updates_match_a_reference_dict_a_full_rebuild_and_the_torch_code(tree_cls, dtype):
    capacity = 3000
    rng = np.random.default_rng(7)
    host = tree_cls(capacity, dtype=dtype)
    with torch_code():
        ref = tree_cls(capacity, dtype=dtype)
    expected = np.full(capacity, host.neutral)
    for round_ in range(30):
        n = 4000 if round_ == 5 else int(rng.integers(1, 400))  # one bulk write (a rebuild), else path updates
        idx = rng.integers(0, capacity, n)  # with replacement: duplicates in one call
        if round_ % 3 == 0:
            idx = np.concatenate([idx, idx ^ 1])  # siblings updated together: parents shared within the batch
            idx = idx[idx < capacity]
        vals = rng.random(idx.size) * 10
        for i, v in zip(idx.tolist(), vals.tolist()):  # sequential: the last write of a duplicate wins
            expected[i] = v
        host.update_host(idx, vals)
        ref.update(torch.from_numpy(idx), torch.from_numpy(vals))
        leaves = host.get_host(np.arange(capacity))
        assert np.array_equal(leaves, expected.astype(leaves.dtype))
        assert torch.equal(host._values, ref._values)  # every node, bit for bit
    rebuilt = tree_cls(capacity, dtype=dtype)
    rebuilt.update_host(np.arange(capacity), expected)  # a bulk write: every level recomputed
    assert torch.equal(host._values, rebuilt._values)
    assert host.summary_host() == float(ref.summary())
    if tree_cls is MinTree:
        assert host.summary_host() == expected.astype(np.float32).min()
    else:  # (torch's vectorized sum may round unlike a sequential one)
        assert host.summary_host() == pytest.approx(expected.sum(), rel=1e-12)


def test_update_host_without_validation_takes_equal_duplicates_and_keeps_the_dtype():
    s = SumTree(16)
    s.update_host(np.array([5, 4, 5, 9, 8]), np.array([2.0, 1.0, 2.0, 0.5, 0.25], dtype=np.float32), validate=False)
    assert s.get_host(np.array([4, 5, 8, 9])).tolist() == [1.0, 2.0, 0.25, 0.5]
    assert s.total_host() == 3.75
    check_internal_nodes(s, lambda a, b: a + b)
    with pytest.raises(IndexError, match=r"leaf indices must lie in \[0, 16\), got \[-1, 3\]"):
        s.update_host(np.array([3, -1]), np.array([1.0, 1.0]))


def test_host_view_shares_memory_refuses_other_devices_and_is_not_counted_as_a_sync():
    from alfish.learn.sync_debug import SyncCounter
    from alfish.replay.segment_tree import host_array, host_view

    t = torch.zeros(4)
    with SyncCounter() as counter:
        a = host_view(t)
        b = host_array(torch.arange(3, dtype=torch.int32), torch.int64)  # converted by torch: a copy
    assert counter.calls == []
    a[1] = 5.0
    assert t.tolist() == [0.0, 5.0, 0.0, 0.0]
    assert b.dtype == np.int64 and b.tolist() == [0, 1, 2]
    assert host_array(torch.ones(2, 3), torch.float32).shape == (6,)
    assert host_view(torch.ones(2, requires_grad=True)).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="needs a CPU tensor, got one on meta"):
        host_view(torch.zeros(2, device="meta"))
    with SyncCounter() as counter:
        t.numpy()
    assert counter.calls == ["numpy"]  # (the counter itself still sees a plain read)
