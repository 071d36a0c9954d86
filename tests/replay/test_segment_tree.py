"""SumTree / MinTree against numpy references: batched updates (with duplicates), summaries, prefix-sum search.

The trees keep levels up to ``TOP_LEVEL`` and search ``DESCENT_LEVELS`` levels per step; the ``shape`` fixture also runs
every test with small values of both, so small trees exercise the same code paths as a 1M-leaf one.
"""
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
