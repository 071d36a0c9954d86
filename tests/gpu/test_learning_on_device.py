"""Learning tier on the GPU: SAC (alfish/PointGoal-v0), PPO and DQN (alfish/Chain-v0) reach the CPU learning tests'
thresholds when training on ``DEVICE`` in fp32, fp16 (with the gradient scaler) and bf16; and, over 3 seeds, AMP
returns fall inside the spread of the fp32 returns (``slow``).

The confs and thresholds are the CPU tests' (tests/integration/test_learning.py, test_dqn_learning.py) with
``DevicePolicy.device`` (and AMP) added. The seeds are theirs; a GPU's kernels round differently from the CPU's, so
the curves differ in detail, which is what the thresholds' margins are for.
"""
from __future__ import annotations

import pathlib
import statistics
from typing import Sequence

import pytest

from tests.integration.inprocess import eval_log, run_trainer_from_text
from tests.integration.test_dqn_learning import DQN_CHAIN
from tests.integration.test_learning import PPO_CHAIN, SAC_POINT_GOAL

from .helpers import ON_CUDA, PRECISIONS, cuda_only, device_bindings

pytestmark = [pytest.mark.learning]


def returns(tmp_path: pathlib.Path, conf: str, precision: str, params: Sequence[str] = ()) -> list[float]:
    """The evaluation returns of one run of ``conf`` on the device at ``precision``."""
    root = run_trainer_from_text(tmp_path, conf + device_bindings(precision), params, name=f"run-{precision}")
    return [r["average_return"] for r in eval_log(root)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_sac_reaches_the_optimum_of_point_goal(tmp_path, precision):
    result = returns(tmp_path, SAC_POINT_GOAL, precision)
    assert len(result) == 14  # env steps 200, 300, ..., 1500
    assert all(r >= -6.0 for r in result) and result[0] < -1.5, result  # it started far from the optimum
    assert max(result) >= -1.1, result
    assert sum(result[-3:]) / 3 >= -1.15, result  # and stays there
    assert max(result) <= -0.9 + 1e-6  # nothing beats the optimum


@pytest.mark.timeout(300)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_ppo_reaches_the_optimum_of_chain(tmp_path, precision):
    result = returns(tmp_path, PPO_CHAIN, precision)
    assert len(result) == 10
    assert max(result) >= 0.65, result
    assert result[-1] >= 0.65, result
    assert max(result) <= 0.7 + 1e-6


@pytest.mark.timeout(300)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_dqn_with_prioritized_replay_reaches_the_optimum_of_chain(tmp_path, precision):
    result = returns(tmp_path, DQN_CHAIN, precision,
                     ["TrainerConfig.priority_replay = True", "TrainerConfig.priority_replay_beta = 0.4"])
    assert len(result) == 8
    assert max(result) >= 0.65, result
    assert result[-1] >= 0.65, result
    assert max(result) <= 0.7 + 1e-6


# ------------------------------------------------------------------------------ AMP against fp32, over seeds ---

SEEDS = (0, 1, 2)
CONFS = {"sac": SAC_POINT_GOAL, "ppo": PPO_CHAIN}
#: Return units by which the AMP mean may leave the fp32 range: one eval's worth of noise (PointGoal's optimum is
#: -0.9, Chain's 0.7; the thresholds above allow 0.2 and 0.05 below them).
MARGIN = 0.05
_fp32_scores: dict[str, list[float]] = {}  # per algorithm, shared by the precision parameters (fp32 runs once)


def score(tmp_path: pathlib.Path, algo: str, precision: str, seed: int) -> float:
    """Mean of the last 3 evaluation returns of one run (the end of the run, less one eval's noise)."""
    folder = tmp_path / f"{algo}-{precision}-{seed}"
    folder.mkdir()
    result = returns(folder, CONFS[algo], precision, [f"TrainerConfig.random_seed = {seed}"])
    return statistics.mean(result[-3:])


@pytest.fixture
def fp32_scores(tmp_path_factory: pytest.TempPathFactory):
    def get(algo: str) -> list[float]:
        if algo not in _fp32_scores:
            root = tmp_path_factory.mktemp(f"fp32-{algo}")
            _fp32_scores[algo] = [score(root, algo, "fp32", seed) for seed in SEEDS]
        return _fp32_scores[algo]
    return get


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("precision", [pytest.param("fp16", marks=cuda_only("fp16 autocast")), "bf16"])
@pytest.mark.parametrize("algo", sorted(CONFS))
def test_amp_returns_fall_inside_the_fp32_spread_over_three_seeds(tmp_path, fp32_scores, algo, precision):
    reference = fp32_scores(algo)
    amp = [score(tmp_path, algo, precision, seed) for seed in SEEDS]
    low, high = min(reference) - MARGIN, max(reference) + MARGIN
    assert low <= statistics.mean(amp) <= high, (f"{precision} {algo} scores {amp} (mean "
                                                 f"{statistics.mean(amp):.3f}) against fp32 {reference} "
                                                 f"on {'CUDA' if ON_CUDA else 'the CPU'}")
