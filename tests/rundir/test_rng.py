"""RNG capture/restore: the same draws follow from torch, numpy and python's random, also through a checkpoint."""
import json
import random

import numpy as np
import pytest
import torch

from alfish.rundir.checkpoint import Checkpointer, CheckpointError
from alfish.rundir.rng import capture_rng_state, restore_rng_state


def _draws():
    out = {
        "torch": torch.rand(5),
        "torch_normal": torch.randn(3),
        "numpy": np.random.rand(5),
        "numpy_gauss": np.random.randn(3),  # odd count: leaves a cached gaussian behind
        "numpy_int": np.random.randint(0, 1 << 30, size=4),
        "random": [random.random() for _ in range(5)],
        "random_gauss": random.gauss(0.0, 1.0),  # leaves gauss_next cached
        "random_int": random.getrandbits(64),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.rand(5, device="cuda").cpu()
    return out


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        elif isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        else:
            assert a[k] == b[k], k


@pytest.fixture(autouse=True)
def _keep_global_rng():
    """Tests here move the global generators around; put them back afterwards."""
    torch_state, np_state, py_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
    yield
    torch.set_rng_state(torch_state)
    np.random.set_state(np_state)
    random.setstate(py_state)


def test_round_trip_reproduces_draws():
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    _draws()  # leave both gaussian caches filled
    tensors, meta = capture_rng_state()
    assert meta["numpy"]["has_gauss"] == 1 and meta["python_random"]["gauss_next"] is not None
    first = _draws()
    restore_rng_state(tensors, meta)
    second = _draws()
    _assert_same(first, second)
    assert not torch.equal(_draws()["torch"], first["torch"])  # and the generators move on from there


def test_state_is_tensors_and_json():
    tensors, meta = capture_rng_state()
    assert json.loads(json.dumps(meta)) == meta
    assert tensors["torch_cpu"].dtype == torch.uint8
    assert tensors["numpy_keys"].shape == (624,) and tensors["numpy_keys"].dtype == torch.int64
    assert all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tensors.values())


def test_round_trip_through_a_checkpoint(tmp_path):
    ck = Checkpointer(str(tmp_path))
    np.random.seed(7)
    tensors, meta = capture_rng_state()
    ck.save(1, {"rng": tensors}, {"rng": meta})
    first = _draws()
    torch.manual_seed(99), np.random.seed(99), random.seed(99)  # a fresh process would be seeded anew
    loaded = ck.load_latest()
    restore_rng_state(loaded.tensors["rng"], loaded.meta["rng"])
    _assert_same(first, _draws())


def test_malformed_state_is_a_checkpoint_error():
    tensors, meta = capture_rng_state()
    with pytest.raises(CheckpointError, match=r"RNG state in the checkpoint is malformed \(KeyError"):
        restore_rng_state({k: v for k, v in tensors.items() if k != "numpy_keys"}, meta)
    with pytest.raises(CheckpointError, match=r"malformed \(ValueError: format 7, expected 1\)"):
        restore_rng_state(tensors, dict(meta, format=7))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_generators_round_trip():
    torch.cuda.init()
    torch.cuda.manual_seed_all(5)
    tensors, meta = capture_rng_state()
    assert meta["torch_cuda_devices"] == torch.cuda.device_count()
    first = torch.rand(5, device="cuda").cpu()
    restore_rng_state(tensors, meta)
    assert torch.equal(first, torch.rand(5, device="cuda").cpu())
