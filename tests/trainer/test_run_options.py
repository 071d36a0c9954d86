"""``Trainer.*`` run options validate their values when built (also outside gin, where the conf checks do not run)."""
import pytest

from alfish.trainer.options import RunOptions


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "30"])
def test_stop_grace_s_must_be_a_finite_positive_number(bad):
    with pytest.raises(ValueError, match=r"Trainer.stop_grace_s=.* must be a finite number of seconds > 0"):
        RunOptions(stop_grace_s=bad)


@pytest.mark.parametrize("options, message", [
    (dict(num_unroll_processes=0), "Trainer.num_unroll_processes=0 must be an int >= 1"),
    (dict(num_unroll_processes=2.0), "Trainer.num_unroll_processes=2.0 must be an int >= 1"),
    (dict(unroll_min_fraction=0), r"Trainer.unroll_min_fraction=0 must be in \(0, 1\]"),
    (dict(unroll_min_fraction=1.5), r"Trainer.unroll_min_fraction=1.5 must be in \(0, 1\]"),
    (dict(max_policy_lag=-1), r"Trainer.max_policy_lag=-1 must be an int >= 0 \(parameter versions\) or None"),
    (dict(max_policy_lag=True), r"Trainer.max_policy_lag=True must be an int >= 0"),
])
def test_collection_settings_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        RunOptions(**options)


def test_stop_grace_s_defaults_to_30_seconds():
    assert RunOptions().stop_grace_s == 30.0 and RunOptions(stop_grace_s=0.5).stop_grace_s == 0.5
