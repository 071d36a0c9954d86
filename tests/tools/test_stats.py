"""alfish.tools.stats against values computed by hand: alignment onto the common grid, the bands, the interquartile
mean (scipy.stats.trim_mean(x, 0.25), as rliable computes it) and the percentile bootstrap."""
import numpy as np
import pytest

from alfish.tools.stats import align, bootstrap_ci, common_grid, iqm, mean_band


def test_the_grid_is_the_union_of_the_runs_points_where_all_have_data():
    a = np.array([0.0, 10.0, 20.0, 30.0])
    b = np.array([5.0, 10.0, 25.0])
    np.testing.assert_array_equal(common_grid([a, b]), [5.0, 10.0, 20.0, 25.0])
    with pytest.raises(ValueError, match="do not overlap"):
        common_grid([np.array([0.0, 1.0]), np.array([2.0, 3.0])])


def test_align_interpolates_each_run_linearly_onto_the_grid():
    grid, values = align([np.array([0.0, 10.0]), np.array([0.0, 5.0, 10.0])],
                         [np.array([0.0, 10.0]), np.array([1.0, 2.0, 3.0])])
    np.testing.assert_array_equal(grid, [0.0, 5.0, 10.0])
    np.testing.assert_allclose(values, [[0.0, 5.0, 10.0], [1.0, 2.0, 3.0]])


def test_bands():
    values = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 8.0]])  # 3 runs, 2 points
    mean, low, high = mean_band(values, "minmax")
    np.testing.assert_allclose((mean, low, high), ([2.0, 4.0], [0.0, 1.0], [4.0, 8.0]))
    mean, low, high = mean_band(values, "std")
    std = np.array([np.sqrt(8 / 3), np.sqrt(((1 - 4) ** 2 + (3 - 4) ** 2 + (8 - 4) ** 2) / 3)])  # ddof=0
    np.testing.assert_allclose((low, high), (mean - std, mean + std))


@pytest.mark.parametrize("values, expected", [
    (np.arange(1.0, 9.0), 4.5),  # 8 values: 2 cut from each end, mean of 3, 4, 5, 6
    (np.array([8.0, 1.0, 100.0, 2.0]), 5.0),  # 4 values: the middle two, 2 and 8
    (np.array([1.0, 2.0, 3.0, 4.0, 100.0]), 3.0),  # 5 values: 5 // 4 = 1 cut from each end, mean of 2, 3, 4
    (np.array([1.0, 2.0, 9.0]), 4.0),  # fewer than 4: nothing cut, the plain mean
])
def test_iqm_by_hand(values, expected):
    assert iqm(values) == pytest.approx(expected)


def test_iqm_is_per_column_over_runs():
    values = np.stack([np.arange(1.0, 9.0), -np.arange(1.0, 9.0)], axis=1)  # [8 runs, 2 points]
    np.testing.assert_allclose(iqm(values), [4.5, -4.5])


def test_bootstrap_of_two_runs_by_hand():
    # Resampling 2 runs {0, 1}: the mean is 0 (p 1/4), 0.5 (p 1/2) or 1 (p 1/4), so the 2.5% and 97.5% quantiles are
    # 0 and 1, and the 40% and 60% quantiles (a 20% interval) both 0.5.
    low, high = bootstrap_ci(np.array([[0.0], [1.0]]), np.mean, reps=4000)
    assert (low[0], high[0]) == (0.0, 1.0)
    low, high = bootstrap_ci(np.array([[0.0], [1.0]]), np.mean, reps=4000, confidence=0.2)
    assert (low[0], high[0]) == (0.5, 0.5)


def test_bootstrap_of_equal_runs_is_that_value():
    low, high = bootstrap_ci(np.full((5, 3), 7.0))
    np.testing.assert_array_equal(low, 7.0)
    np.testing.assert_array_equal(high, 7.0)


def test_the_ci_contains_the_iqm_and_narrows_with_more_runs():
    rng = np.random.default_rng(1)
    widths = []
    for runs in (5, 20, 80):
        values = rng.normal(10.0, 3.0, size=(runs, 4))
        low, high = bootstrap_ci(values, iqm, reps=1000)
        assert np.all(low <= iqm(values)) and np.all(iqm(values) <= high)
        widths.append(float(np.mean(high - low)))
    assert widths[0] > widths[1] > widths[2], widths


def test_the_bootstrap_is_reproducible_and_chunking_does_not_change_it(monkeypatch):
    values = np.random.default_rng(0).normal(size=(6, 50))
    first = bootstrap_ci(values, reps=300, seed=3)
    again = bootstrap_ci(values, reps=300, seed=3)
    np.testing.assert_array_equal(first, again)
    import alfish.tools.stats as stats

    monkeypatch.setattr(stats, "_CHUNK_VALUES", 6 * 50 * 7)  # 7 repetitions per chunk instead of all 300
    np.testing.assert_array_equal(stats.bootstrap_ci(values, reps=300, seed=3), first)
