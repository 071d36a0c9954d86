"""Statistics over the runs (seeds) of one configuration: their curves aligned on one x grid, the mean with a band,
and the interquartile mean (IQM) with a percentile-bootstrap confidence interval.

The IQM and its interval follow rliable: R. Agarwal, M. Schwarzer, P. S. Castro, A. Courville, M. G. Bellemare,
"Deep Reinforcement Learning at the Edge of the Statistical Precipice", NeurIPS 2021 (https://arxiv.org/abs/2108.13264;
https://github.com/google-research/rliable). With one task, rliable's stratified bootstrap is a plain bootstrap over
runs.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

BANDS = ("minmax", "std")
# Bootstrap resamples are drawn in chunks of at most this many values (reps x seeds x grid points), so memory stays
# at tens of megabytes for long curves and many repetitions.
_CHUNK_VALUES = 1 << 22


def common_grid(xs: Sequence[np.ndarray]) -> np.ndarray:
    """The x values ``[G]`` where every curve has data: the union of the curves' own x values (each ``[N_i]``,
    increasing) inside the range they all cover, from the latest start to the earliest end, so that points the runs
    share (evaluations at the same env steps) are kept exactly instead of resampled.

    Raises:
        ValueError: the ranges do not overlap.
    """
    start, end = max(float(x[0]) for x in xs), min(float(x[-1]) for x in xs)
    if start > end:
        raise ValueError(f"the runs' x ranges do not overlap (the latest starts at {start:g}, the earliest ends at "
                         f"{end:g})")
    grid = np.unique(np.concatenate(xs))
    return grid[(grid >= start) & (grid <= end)]


def align(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The curves ``(xs[i] [N_i], ys[i] [N_i])`` on their common grid: ``(grid [G], values [S, G])``, each curve
    linearly interpolated between its own points (``S = len(xs)`` runs)."""
    grid = common_grid(xs)
    return grid, np.stack([np.interp(grid, x, y) for x, y in zip(xs, ys)])


def mean_band(values: np.ndarray, band: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, low, high)``, each ``[G]``, of ``values [S, G]`` over runs: ``band='minmax'`` the runs' range,
    ``'std'`` the mean ± the runs' standard deviation (``ddof=0``: the spread of these runs)."""
    mean = values.mean(axis=0)
    if band == "minmax":
        return mean, values.min(axis=0), values.max(axis=0)
    if band == "std":
        std = values.std(axis=0)
        return mean, mean - std, mean + std
    raise ValueError(f"band {band!r} must be one of {', '.join(BANDS)}")


def iqm(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """Interquartile mean along ``axis``: the mean of what is left after cutting ``n // 4`` of the ``n`` values from
    each end of their sorted order. This is ``scipy.stats.trim_mean(values, 0.25, axis)``, which rliable's IQM
    computes; with fewer than 4 values nothing is cut (the plain mean)."""
    n = values.shape[axis]
    cut = n // 4
    middle = np.take(np.sort(values, axis=axis), np.arange(cut, n - cut), axis=axis)
    return middle.mean(axis=axis)


def bootstrap_ci(values: np.ndarray, statistic: Callable[..., np.ndarray] = iqm, reps: int = 2000,
                 confidence: float = 0.95, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile-bootstrap confidence interval over runs of ``statistic`` of ``values [S, G]``: ``(low [G],
    high [G])``.

    Each of ``reps`` repetitions draws S runs with replacement (the same runs at every x, since a run's points are
    not independent) and computes ``statistic(resample, axis=0)``; the interval is the ``(1 - confidence) / 2`` and
    ``(1 + confidence) / 2`` quantiles of those ``reps`` values at each x. ``seed`` fixes the draws, so a figure is
    reproducible.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} must be between 0 and 1")
    if reps < 1:
        raise ValueError(f"bootstrap repetitions {reps} must be >= 1")
    runs, points = values.shape
    rng = np.random.default_rng(seed)
    estimates = np.empty((reps, points))
    chunk = max(1, _CHUNK_VALUES // (runs * points))
    for start in range(0, reps, chunk):
        n = min(chunk, reps - start)
        resample = values[rng.integers(0, runs, size=(n, runs))]  # [n, S, G]
        estimates[start:start + n] = statistic(resample, axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(estimates, [tail, 1.0 - tail], axis=0)
    return low, high
