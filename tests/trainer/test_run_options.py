"""``Trainer.*`` run options validate their values when built (also outside gin, where the conf checks do not run)."""
import pytest

from alfish.trainer.options import RunOptions


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "30"])
def test_stop_grace_s_must_be_a_finite_positive_number(bad):
    with pytest.raises(ValueError, match=r"Trainer.stop_grace_s=.* must be a finite number of seconds > 0"):
        RunOptions(stop_grace_s=bad)


def test_stop_grace_s_defaults_to_30_seconds():
    assert RunOptions().stop_grace_s == 30.0 and RunOptions(stop_grace_s=0.5).stop_grace_s == 0.5
