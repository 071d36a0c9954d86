"""Checkpointer: round trips, verification against the manifest, atomicity, pruning and real write failures."""
import hashlib
import json
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from alfish.rundir.checkpoint import Checkpointer, CheckpointError, LoadedCheckpoint

REPO = str(pathlib.Path(__file__).resolve().parents[2])
LOGGER = "alfish.rundir.checkpoint"


def _model_and_adam(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt


def _train_step(model, opt, x, y):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()


def _assert_nest_equal(a, b, where="root"):
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), where
        for k in a:
            _assert_nest_equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_nest_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _save_simple(ck, step, value=0.0):
    return ck.save(step, {"model": {"w": torch.full((4,), float(value))}, "optimizer": {"lr": 0.1 * step}},
                   {"step": step, "value": value})


def _entries(root):
    return sorted(os.listdir(root))


def _corrupt(path):
    data = bytearray(pathlib.Path(path).read_bytes())
    mid = len(data) // 2
    for i in range(mid, min(mid + 8, len(data))):
        data[i] ^= 0xFF
    pathlib.Path(path).write_bytes(bytes(data))


def test_round_trip_model_adam_and_meta(tmp_path):
    model, opt = _model_and_adam()
    x, y = torch.randn(16, 3), torch.randn(16, 2)
    _train_step(model, opt, x, y)
    meta = {"progress": {"iter": 10, "env_steps": 1280}, "config": "a = 1\n", "versions": {"torch": torch.__version__},
            "nan": None, "list": [1, 2.5, "x"]}

    ck = Checkpointer(str(tmp_path / "ckpt"))
    path = ck.save(10, {"model": model.state_dict(), "optimizer": opt.state_dict()}, meta)
    assert path == str(tmp_path / "ckpt" / "ckpt-10")
    assert ck.steps() == [10]

    loaded = ck.load_latest()
    assert isinstance(loaded, LoadedCheckpoint)
    assert (loaded.step, loaded.path, loaded.meta) == (10, path, meta)
    assert set(loaded.tensors) == {"model", "optimizer"}
    _assert_nest_equal(model.state_dict(), loaded.tensors["model"])
    _assert_nest_equal(opt.state_dict(), loaded.tensors["optimizer"])

    # A fresh model + Adam restored from the checkpoint takes exactly the same next step as the original.
    model2, opt2 = _model_and_adam(seed=123)
    model2.load_state_dict(loaded.tensors["model"])
    opt2.load_state_dict(loaded.tensors["optimizer"])
    x2, y2 = torch.randn(16, 3), torch.randn(16, 2)
    _train_step(model, opt, x2, y2)
    _train_step(model2, opt2, x2, y2)
    for p1, p2 in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p1, p2)
    _assert_nest_equal(opt.state_dict(), opt2.state_dict())

    assert ck.load(10).meta == meta


def test_layout_and_manifest(tmp_path):
    root = tmp_path / "ckpt"
    ck = Checkpointer(str(root))
    path = pathlib.Path(_save_simple(ck, 7))
    assert _entries(root) == ["ckpt-7"]
    assert sorted(os.listdir(path)) == ["manifest.json", "meta.json", "model.pt", "optimizer.pt"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == 1 and manifest["step"] == 7
    assert sorted(manifest["files"]) == ["meta.json", "model.pt", "optimizer.pt"]
    for name, rec in manifest["files"].items():
        data = (path / name).read_bytes()
        assert rec == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert json.loads((path / "meta.json").read_text()) == {"step": 7, "value": 0.0}


def test_no_checkpoint_at_all(tmp_path, caplog):
    ck = Checkpointer(str(tmp_path / "does-not-exist"))
    assert ck.steps() == []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert ck.load_latest() is None
    assert caplog.records == []
    with pytest.raises(CheckpointError, match=r"no checkpoint at step 5: .*ckpt-5 does not exist"):
        ck.load(5)


def _damage_file(path, name):
    _corrupt(path / name)


def _truncate(path, name):
    p = path / name
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])


def _delete(path, name):
    (path / name).unlink()


@pytest.mark.parametrize("damage, name, reason", [
    (_damage_file, "model.pt", r"does not match its manifest \(sha256 "),
    (_damage_file, "meta.json", r"does not match its manifest \(sha256 "),
    (_truncate, "optimizer.pt", r"does not match its manifest \(size \d+ bytes, manifest says \d+\)"),
    (_delete, "model.pt", r"is missing \(listed in its manifest\)"),
    (_delete, "manifest.json", r"is missing"),
    (_truncate, "manifest.json", r"is not a valid manifest"),
])
def test_damaged_checkpoint_falls_back_to_older(tmp_path, caplog, damage, name, reason):
    ck = Checkpointer(str(tmp_path))
    _save_simple(ck, 10, value=1.0)
    _save_simple(ck, 20, value=2.0)
    damage(tmp_path / "ckpt-20", name)
    bad = os.path.join(str(tmp_path), "ckpt-20", name)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        loaded = ck.load_latest()
    assert loaded.step == 10 and loaded.meta["value"] == 1.0
    assert torch.equal(loaded.tensors["model"]["w"], torch.full((4,), 1.0))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert "\n" not in msg
    assert msg.startswith(f"checkpoint {bad} ")
    assert re.search(reason, msg), msg
    assert msg.endswith("; falling back to an older checkpoint (step 10)")

    with pytest.raises(CheckpointError) as info:
        ck.load(20)
    assert str(info.value).startswith(f"checkpoint {bad} ")
    assert str(info.value).endswith(f"; load another step (available: [10, 20]) or move {tmp_path / 'ckpt-20'} out "
                                    "of the checkpoints folder")
    assert "\n" not in str(info.value) and info.value.file == bad


def test_advice_names_only_paths_that_exist(tmp_path):
    ck = Checkpointer(str(tmp_path))
    _save_simple(ck, 10)
    with pytest.raises(CheckpointError) as info:
        ck.load(5)
    assert str(info.value) == f"no checkpoint at step 5: {tmp_path / 'ckpt-5'} does not exist (available steps: [10])"


def test_only_corrupt_checkpoints(tmp_path, caplog):
    ck = Checkpointer(str(tmp_path))
    _save_simple(ck, 3)
    _save_simple(ck, 4)
    _corrupt(tmp_path / "ckpt-3" / "model.pt")
    _corrupt(tmp_path / "ckpt-4" / "optimizer.pt")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert ck.load_latest() is None
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(msgs) == 2
    assert os.path.join(str(tmp_path), "ckpt-4", "optimizer.pt") in msgs[0]
    assert os.path.join(str(tmp_path), "ckpt-3", "model.pt") in msgs[1]
    assert msgs[1].endswith("no older checkpoint is left to fall back to")
    for step in (3, 4):
        with pytest.raises(CheckpointError, match="does not match its manifest"):
            ck.load(step)


def test_step_must_match_directory(tmp_path):
    ck = Checkpointer(str(tmp_path))
    _save_simple(ck, 20)
    os.rename(tmp_path / "ckpt-20", tmp_path / "ckpt-30")
    with pytest.raises(CheckpointError, match=r"records step 20 but its directory says step 30"):
        ck.load(30)


def test_manifest_cannot_point_outside_the_directory(tmp_path):
    ck = Checkpointer(str(tmp_path))
    _save_simple(ck, 1)
    _save_simple(ck, 2)
    mpath = tmp_path / "ckpt-2" / "manifest.json"
    manifest = json.loads(mpath.read_text())
    manifest["files"]["../ckpt-1/model.pt"] = manifest["files"].pop("model.pt")
    mpath.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"lists an invalid file name '\.\./ckpt-1/model\.pt'"):
        ck.load(2)


class _Evil:
    """Pickles to a call that creates a file: loading it must not run it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_never_unpickles_arbitrary_objects(tmp_path):
    ck = Checkpointer(str(tmp_path / "ckpt"))
    path = pathlib.Path(_save_simple(ck, 1))
    marker = tmp_path / "pwned"
    # Replace model.pt with a pickle that would run code, and make the manifest agree with it.
    torch.save({"w": _Evil(str(marker))}, path / "model.pt")
    data = (path / "model.pt").read_bytes()
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["model.pt"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as info:
        ck.load(1)
    assert not marker.exists()
    # alfish's words, not torch's advice to load it with weights_only=False (which would run the payload)
    message = str(info.value)
    assert message.startswith(f"checkpoint {path / 'model.pt'} contains Python objects other than tensors ("), message
    assert "alfish never unpickles those" in message and "\n" not in message
    assert "weights_only" not in message and "add_safe_globals" not in message


def test_a_file_that_is_not_a_torch_archive_is_named(tmp_path):
    ck = Checkpointer(str(tmp_path / "ckpt"))
    path = pathlib.Path(_save_simple(ck, 1))
    _rewrite_with_manifest(path, "model.pt", b"not a zip file at all")
    with pytest.raises(CheckpointError, match=rf"^checkpoint {re.escape(str(path / 'model.pt'))} is not a torch\.save "
                                              r"zip archive \(it was not written by this alfish\)"):
        ck.load(1)


def _rewrite_with_manifest(path, name, data):
    """Replace ``path/name`` with ``data`` and make the manifest agree (what a deliberate forger would do)."""
    (path / name).write_bytes(data)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_tensors_are_memory_mapped_from_the_checkpoint(tmp_path):
    """torch.load(mmap=True) works with the files _HashingWriter wrote: the data is mapped, not read, and equal."""
    ck = Checkpointer(str(tmp_path / "ckpt"))
    w = torch.arange(1 << 16, dtype=torch.float32)
    path = ck.save(1, {"model": {"w": w, "b": torch.ones(3, dtype=torch.bfloat16), "n": 3}}, {})
    loaded = ck.load(1).tensors["model"]
    assert torch.equal(loaded["w"], w) and torch.equal(loaded["b"], torch.ones(3, dtype=torch.bfloat16))
    assert loaded["n"] == 3
    if os.path.exists("/proc/self/maps"):
        with open("/proc/self/maps") as f:
            assert os.path.join(path, "model.pt") in f.read()
    loaded["w"] += 1  # a private mapping: the file is not changed
    assert torch.equal(ck.load(1).tensors["model"]["w"], w)


def test_what_is_read_into_memory_is_bounded(tmp_path, monkeypatch):
    from alfish.rundir import checkpoint_format as checkpoint_module

    ck = Checkpointer(str(tmp_path / "ckpt"))
    path = pathlib.Path(_save_simple(ck, 1))
    _save_simple(ck, 2)
    monkeypatch.setattr(checkpoint_module, "MAX_META_BYTES", 100)
    with pytest.raises(CheckpointError, match=r"^meta is \d+ bytes as JSON, more than the 100 bytes a checkpoint's "
                                              r"meta\.json may hold; put large data in `tensors`$"):
        ck.save(3, {"model": {}}, {"config": "x" * 200})
    _rewrite_with_manifest(path, "meta.json", json.dumps({"config": "x" * 200}).encode())
    with pytest.raises(CheckpointError, match=r"manifest\.json says meta\.json has 214 bytes, more than the 100 "
                                              r"bytes alfish reads \(it was not written by alfish\); load another"):
        ck.load(1)
    (tmp_path / "ckpt" / "ckpt-2" / "manifest.json").write_bytes(b" " * (checkpoint_module.MAX_MANIFEST_BYTES + 1))
    with pytest.raises(CheckpointError, match=r"manifest\.json is larger than the 1048576 bytes a manifest may have"):
        ck.load(2)


def test_refuses_what_weights_only_cannot_load(tmp_path):
    ck = Checkpointer(str(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match=r"tensors\['model'\]\['w'\]\[1\] is a numpy\.ndarray"):
        ck.save(1, {"model": {"w": [torch.zeros(1), np.zeros(2)]}}, {})
    with pytest.raises(CheckpointError, match=r"meta is not JSON-serializable"):
        ck.save(1, {"model": {}}, {"t": torch.zeros(1)})
    for bad in ("../x", ".hidden", "a/b", "", 3):
        with pytest.raises(CheckpointError, match=r"cannot be a checkpoint file name"):
            ck.save(1, {bad: {}}, {})
    for bad_step in (-1, 1.5, "3", True):
        with pytest.raises(CheckpointError, match=r"step must be an int >= 0"):
            ck.save(bad_step, {}, {})
    assert not (tmp_path / "ckpt").exists() or _entries(tmp_path / "ckpt") == []
    # Scalars, tuples, sizes, dtypes and nested lists are fine.
    ok = {"x": (1, 2.5, None, True, "s", torch.Size([2]), torch.float16, [torch.ones(2, dtype=torch.bfloat16)])}
    ck.save(np.int64(2), {"misc": ok}, {})
    _assert_nest_equal(ck.load(2).tensors["misc"], ok)
    with pytest.raises(ValueError, match="max_to_keep"):
        Checkpointer(str(tmp_path), max_to_keep=0)


def test_resave_at_existing_step_replaces_it(tmp_path):
    ck = Checkpointer(str(tmp_path))
    _save_simple(ck, 5, value=1.0)
    _save_simple(ck, 10, value=1.0)
    _save_simple(ck, 10, value=2.0)
    assert _entries(tmp_path) == ["ckpt-10", "ckpt-5"]
    loaded = ck.load(10)
    assert loaded.meta["value"] == 2.0
    assert torch.equal(loaded.tensors["model"]["w"], torch.full((4,), 2.0))
    assert ck.load_latest().step == 10


def test_max_to_keep(tmp_path):
    ck = Checkpointer(str(tmp_path), max_to_keep=2)
    for step in (1, 2, 3, 4):
        _save_simple(ck, step)
    assert ck.steps() == [3, 4]
    assert _entries(tmp_path) == ["ckpt-3", "ckpt-4"]
    assert ck.load_latest().step == 4
    keep_all = Checkpointer(str(tmp_path))
    for step in (5, 6, 7):
        _save_simple(keep_all, step)
    assert keep_all.steps() == [3, 4, 5, 6, 7]


# One child process plays both crash scenarios (importing torch costs a child ~1.5 s): first real write failures, then
# a save killed by SIGKILL right before its final rename.
CRASHING_SAVER = """
import os, resource, signal, sys, torch
from alfish.rundir.checkpoint import Checkpointer, CheckpointError
failing_root, killed_root = sys.argv[1], sys.argv[2]

# 1. The file size limit (RLIMIT_FSIZE, honoured even for root) makes write() fail with EFBIG, as a full disk makes
#    it fail with ENOSPC.
ck = Checkpointer(failing_root)
ck.save(1, {"model": {"w": torch.ones(10)}}, {"value": 1})
ck.save(2, {"model": {"w": torch.ones(10)}}, {"value": 2})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
big = {"model": {"w": torch.zeros(1 << 20)}}  # 4 MiB
for step in (3, 2):  # a new step, and a re-save over an existing one
    try:
        ck.save(step, big, {"value": -1})
    except CheckpointError as e:
        print(e, flush=True)
    else:
        print("saved?!", flush=True)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

# 2. Killed at the worst moment: everything written, the rename into place not done.
ck = Checkpointer(killed_root)
ck.save(10, {"model": {"w": torch.ones(3)}}, {"value": 10})
os.rename = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
ck.save(20, {"model": {"w": torch.zeros(3)}}, {"value": 20})
print("not killed?!", flush=True)
"""


@pytest.fixture(scope="module")
def crashed_saves(tmp_path_factory):
    """(CompletedProcess, root of the failed writes, root of the killed save)."""
    if not hasattr(signal, "SIGXFSZ"):
        pytest.skip("needs POSIX resource limits")
    base = tmp_path_factory.mktemp("crashes")
    failing_root, killed_root = base / "failing", base / "killed"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", CRASHING_SAVER, str(failing_root), str(killed_root)],
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    return proc, failing_root, killed_root


def test_write_failure_is_one_line_and_keeps_previous_checkpoints(crashed_saves):
    proc, root, _ = crashed_saves
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, (proc.stdout, proc.stderr)
    for line, step in zip(lines, (3, 2)):
        assert line == (f"cannot write checkpoint {root / f'ckpt-{step}'} (model.pt): File too large (EFBIG); a file "
                        "reached the file size limit: raise it (`ulimit -f`) or use a --root_dir on a file system "
                        f"that allows larger files; the last checkpoint, {root / 'ckpt-2'}, is intact"), line

    ck = Checkpointer(str(root))
    assert _entries(root) == ["ckpt-1", "ckpt-2"]  # no temp dir left behind
    assert ck.load(1).meta == {"value": 1}
    latest = ck.load_latest()
    assert latest.step == 2 and latest.meta == {"value": 2}
    assert torch.equal(latest.tensors["model"]["w"], torch.ones(10))


def test_save_killed_before_rename_leaves_only_an_ignored_tmp_dir(crashed_saves, caplog):
    proc, _, root = crashed_saves
    assert proc.returncode == -signal.SIGKILL, (proc.stdout, proc.stderr)
    stray = [n for n in _entries(root) if n.startswith(".tmp-")]
    assert len(stray) == 1 and re.fullmatch(r"\.tmp-ckpt-20-\d+", stray[0]), stray
    assert os.path.isfile(root / stray[0] / "manifest.json")  # complete but never renamed: still not a checkpoint

    ck = Checkpointer(str(root))
    assert ck.steps() == [10]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        loaded = ck.load_latest()
    assert loaded.step == 10 and loaded.meta == {"value": 10}
    assert caplog.records == []

    _save_simple(ck, 30)  # the next save removes the stray directory
    assert _entries(root) == ["ckpt-10", "ckpt-30"]


def test_tmp_dir_of_a_live_saver_is_left_alone(tmp_path):
    # alive until killed below, however long the test takes on a loaded machine
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        live = tmp_path / f".tmp-ckpt-3-{sleeper.pid}"
        dead = tmp_path / ".tmp-ckpt-4-999999999"
        own = tmp_path / f".tmp-old-ckpt-5-{os.getpid()}"
        for d in (live, dead, own):
            d.mkdir()
            (d / "model.pt").write_bytes(b"partial")
        ck = Checkpointer(str(tmp_path))
        assert ck.steps() == []
        _save_simple(ck, 6)
        assert _entries(tmp_path) == [live.name, "ckpt-6"]
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)
