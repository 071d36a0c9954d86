"""Asking for a GPU that is not there is a one-line error naming the devices that are (DESIGN.md §3.12), from the
device policy and from ``alfish.bin.train``."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from alfish.errors import OneLineValueError
from alfish.learn.device import DevicePolicy
from tests.integration.inprocess import CONFS

from .helpers import REPO


def expected_message() -> str:
    """What ``DevicePolicy.device='cuda:99'`` must say on this machine."""
    if not torch.cuda.is_available():  # ALFISH_TEST_DEVICE=cpu on a machine without CUDA
        return "DevicePolicy.device='cuda:99' but this machine has no usable CUDA device"
    n = torch.cuda.device_count()
    return f"DevicePolicy.device='cuda:99' but only {n} CUDA device(s) are visible (cuda:0 to cuda:{n - 1})"


def test_an_absent_gpu_index_is_a_one_line_error_naming_the_visible_devices():
    with pytest.raises(OneLineValueError) as err:
        DevicePolicy(device="cuda:99").training_device()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(expected_message()), message


@pytest.mark.cli
@pytest.mark.timeout(120)
def test_train_reports_an_absent_gpu_in_one_line_before_starting(tmp_path):
    out = subprocess.run([sys.executable, "-m", "alfish.bin.train", "--conf", str(CONFS / "sac_pendulum.gin"),
                          "--root_dir", str(tmp_path / "run"), "--conf_param", "DevicePolicy.device = 'cuda:99'"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if expected_message() in line]
    assert len(errors) == 1, out.stderr[-3000:]
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing was started
