"""The oldest torch alfish runs on: setup.py requires ``alfish.TORCH_FLOOR``, the newest release among the torch
features alfish relies on (``alfish.TORCH_FEATURES``); each listed feature is present in the installed torch (so the
table cannot rot); an older torch is a one-line error when alfish is imported; and the one newer feature used with a
fallback (DDP's ``forward_sync_buffers``) works both ways: a torch without it must not get a ``TypeError`` from
``wrap_for_ddp`` on every multi-rank run."""
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import alfish
from alfish.learn.distributed import DistContext, LossModule, wrap_for_ddp

REPO = pathlib.Path(__file__).resolve().parents[1]
ALL_FEATURES = alfish.TORCH_FEATURES + alfish.DETECTED_TORCH_FEATURES


def setup_py_floor() -> tuple[int, int]:
    requirement = re.search(r'"torch>=(\d+)\.(\d+)[^"]*"', (REPO / "setup.py").read_text())
    assert requirement, "setup.py states no torch floor"
    return int(requirement.group(1)), int(requirement.group(2))


def test_setup_py_requires_the_newest_release_among_the_features_alfish_relies_on():
    newest = max(feature.since for feature in alfish.TORCH_FEATURES)
    assert setup_py_floor() == alfish.TORCH_FLOOR == newest


@pytest.mark.parametrize("feature", ALL_FEATURES, ids=[f.what.split(" (")[0] for f in ALL_FEATURES])
def test_every_listed_feature_is_in_the_installed_torch_and_used_where_it_says(feature):
    assert feature.present(torch), f"torch {torch.__version__} lacks {feature.what}"
    assert (REPO / feature.where).is_file(), feature.where


@pytest.mark.parametrize("version, lacks", [
    ("2.4.1", ["torch.onnx.export(dynamo=True"]),
    ("2.3.0+cu121", ["fused Adam, AdamW and SGD on the CPU", "torch.onnx.export(dynamo=True"]),
    ("1.13.1", ["torch.func vmap", "fused Adam, AdamW and SGD on the CPU", "torch.onnx.export(dynamo=True"]),
])
def test_an_older_torch_is_a_one_line_error_naming_what_it_lacks(version, lacks):
    with pytest.raises(alfish.TorchTooOldError) as raised:
        alfish.check_torch_version(version)
    message = str(raised.value)
    assert message.startswith(f"alfish needs torch >= 2.5 and this environment has torch {version}, which lacks: ")
    named = message.split(", which lacks: ")[1].split("; ")[:-1]
    assert [next(f for f in alfish.TORCH_FEATURES if f.what in item) for item in named] == [
        f for f in alfish.TORCH_FEATURES if f.since > alfish.release_of(version)]
    assert all(any(item.startswith(expected) for item in named) for expected in lacks), named
    assert message.endswith("upgrade it (pip install --upgrade 'torch>=2.5')") and "\n" not in message


@pytest.mark.parametrize("version", ["2.5.0", "2.5.0a0+git1234", "2.13.0+cpu", "3.0.0.dev20270101", "unknown"])
def test_the_floor_and_newer_releases_pass(version):
    alfish.check_torch_version(version)


def test_importing_alfish_checks_the_installed_torch_without_importing_it(tmp_path):
    """A stand-in ``torch`` package of release 2.4 on the path: importing alfish fails with the one line, and has not
    imported torch to find out."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise SystemExit('torch was imported')\n")
    (tmp_path / "torch" / "version.py").write_text("__version__ = '2.4.1+cu124'\n")
    code = "import alfish"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "alfish.TorchTooOldError: alfish needs torch >= 2.5 and this environment has torch 2.4.1+cu124"), proc.stderr


class WithBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)
        self.register_buffer("statistic", torch.zeros(3))


def recorded_ddp(with_forward_sync_buffers: bool) -> type:
    """A stand-in for DDP with the keyword arguments of torch 2.13 (``forward_sync_buffers``) or of 2.5 to 2.12
    (``broadcast_buffers`` only); it records what it was given."""
    class OlderDDP(torch.nn.Module):
        def __init__(self, module, device_ids=None, broadcast_buffers=True, find_unused_parameters=False):
            super().__init__()
            self.module, self.given = module, dict(broadcast_buffers=broadcast_buffers)

    class CurrentDDP(torch.nn.Module):
        def __init__(self, module, device_ids=None, broadcast_buffers=None, find_unused_parameters=False,
                     forward_sync_buffers=None):
            super().__init__()
            self.module, self.given = module, dict(forward_sync_buffers=forward_sync_buffers)

    return CurrentDDP if with_forward_sync_buffers else OlderDDP


@pytest.mark.parametrize("current", [True, False], ids=["torch>=2.13", "torch<2.13"])
def test_ddp_syncs_buffers_once_at_construction_on_either_torch(monkeypatch, current):
    broadcast = []
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", recorded_ddp(current))
    monkeypatch.setattr(torch.distributed, "broadcast", lambda tensor, src: broadcast.append((tensor, src)))
    algorithm = WithBuffers()
    wrapped = wrap_for_ddp(algorithm, DistContext(rank=1, world_size=2))
    assert isinstance(wrapped.module, LossModule) and wrapped.module.algorithm is algorithm
    if current:  # DDP itself broadcasts the buffers at construction, and never at a forward
        assert wrapped.given == dict(forward_sync_buffers=False) and broadcast == []
    else:  # broadcast_buffers=False leaves them out of DDP's construction: alfish broadcasts them first, once
        assert wrapped.given == dict(broadcast_buffers=False)
        assert [(t is algorithm.statistic, src) for t, src in broadcast] == [(True, 0)]
