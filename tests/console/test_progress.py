"""The progress line: env steps, steps/s and the recent return online; gradient updates, updates/s and the loss for
pure offline training (which has no env steps: it used to print `env_steps 0  steps/s 0  return n/a`)."""
import io
import logging

import pytest

from alfish.console import progress as progress_module
from alfish.console.progress import Progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", fake)
    return fake


def test_an_offline_run_reports_updates_per_second_and_the_loss(clock, caplog):
    reads = []

    def loss():
        reads.append(1)
        return 0.123456

    progress = Progress(100, 0, log_interval_s=10.0, stream=io.StringIO(), offline=True)
    progress.update(1, 0, float("nan"), updates=50, last_loss=loss)  # the first: sets the rate's origin
    clock.now += 2.0
    progress.update(2, 0, float("nan"), updates=250, last_loss=loss)  # 200 updates in 2 s; no log line yet
    assert not caplog.records and not reads  # the loss (a host read) only when a line shows it
    clock.now += 10.0
    with caplog.at_level(logging.INFO):
        progress.update(10, 0, float("nan"), updates=1250, last_loss=loss)  # 1000 updates in 10 s
    # eta: 12 s for the first 10 of 100 iterations -> 108 s for the other 90
    assert caplog.records[-1].getMessage() == "iteration 10/100  updates 1250  updates/s 100  loss 0.1235  eta 108s"
    assert len(reads) == 1


def test_an_online_run_reports_env_steps_and_the_return(clock, caplog):
    progress = Progress(100, 0, log_interval_s=10.0, stream=io.StringIO())
    progress.update(1, 100, float("nan"))
    clock.now += 10.0
    with caplog.at_level(logging.INFO):
        progress.update(5, 4100, -150.25, updates=99, last_loss=lambda: 1.0)
    assert caplog.records[-1].getMessage() == "iteration 5/100  env_steps 4100  steps/s 400  return -150.2  eta 190s"
