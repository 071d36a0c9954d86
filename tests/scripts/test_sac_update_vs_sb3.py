"""``tools/bench/sac_update_vs_sb3.py``: one SAC update of alfish and of Stable-Baselines3 from the same weights,
batch and noise gives the same gradients (SB3 in alfish's order), and SB3's own order changes only the actor's.
Skipped without Stable-Baselines3 (a comparison peer, never an alfish dependency)."""
import pathlib
import sys

import pytest

pytest.importorskip("stable_baselines3")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tools" / "bench"))

import sac_update_vs_sb3  # noqa: E402


def test_alfish_and_sb3_take_the_same_sac_gradients_from_the_same_state():
    diffs = sac_update_vs_sb3.compare("Pendulum-v1", batch=64, seed=0, done_fraction=0.2)
    assert diffs["critics"] < 1e-4 and diffs["temperature"] < 1e-4  # float32 rounding
    assert diffs["actor"] < 1e-3  # (SB3 adds 1e-6 inside its tanh correction's log)
    assert diffs["actor_sb3_own_order"] > 10 * diffs["actor"]  # the probe sees a change as small as the order
