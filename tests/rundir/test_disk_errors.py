"""Disk and permission errors: a root_dir that is a file or cannot be written, a disk that fills up during training
(checkpoint and TensorBoard writes), a log file the disk refuses. Each is one error line of at most three lines on
stderr (no traceback, no writer-thread traceback), the exit status says set-up (2) or training (1), the last good
checkpoint still verifies, and the failed save is not retried by the crash handler.

A full disk is real where the platform allows it (a size-limited tmpfs in a private mount namespace, `unshare -rm`);
everywhere else it is an ``OSError(ENOSPC)`` injected into the checkpoint's or TensorBoard's file writes of a run in
this process. Writes to ``/dev/full`` (always ENOSPC) are real.
"""
from __future__ import annotations

import errno
import getpass
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading

import pytest

from alfish.bin import train as train_cli
from alfish.rundir import checkpoint as checkpoint_module
from alfish.rundir.checkpoint import Checkpointer
from alfish.rundir.disk import DiskWriteError, check_root_dir, human_bytes, mount_point, write_failure
from tests.rundir.in_process import logging_and_gin_restored

REPO = pathlib.Path(__file__).resolve().parents[2]

# 2 envs x 4 steps per iteration, 3 iterations, a checkpoint and a summary after each: ~1 s in this process.
TINY = """
create_environment.env_name = 'CartPole-v1'
create_environment.num_parallel_environments = 2
A2cAlgorithm.hidden_sizes = (8,)
TrainerConfig.algorithm_ctor = @A2cAlgorithm
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 3
TrainerConfig.unroll_length = 4
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 3
TrainerConfig.summary_interval = 1
"""
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (INFO|WARNING|ERROR) ")


@pytest.fixture
def cli(tmp_path):
    """Run ``alfish.bin.train.main`` in this process and leave logging and gin as they were."""
    conf = tmp_path / "tiny.gin"
    conf.write_text(TINY)

    def run(root_dir, *extra):
        return train_cli.main(["--conf", str(conf), "--root_dir", str(root_dir), *extra])

    with logging_and_gin_restored():
        yield run


def problem_lines(stderr: str) -> list[str]:
    """stderr without the INFO progress lines a training run logs: what a user reads about the failure."""
    return [line for line in stderr.splitlines() if line.strip() and not line.split(" ", 2)[1:2] == ["INFO"]]


def assert_clean(stderr: str) -> None:
    assert "Traceback" not in stderr and "Exception in thread" not in stderr and "Logging error" not in stderr, \
        stderr


def _permissions_enforced() -> bool:
    """Whether this process is refused writing in a read-only folder (root, with CAP_DAC_OVERRIDE, is not)."""
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o500)
        try:
            with open(os.path.join(folder, "probe"), "w"):
                return False
        except PermissionError:
            return True
        finally:
            os.chmod(folder, 0o700)


PERMISSIONS = pytest.mark.skipif(not _permissions_enforced(), reason="this user ignores directory permissions (root)")


# ------------------------------------------------------------------------------------------------ set-up errors ----
def test_root_dir_that_is_a_file(cli, tmp_path, capfd):
    target = tmp_path / "results"
    target.write_text("not a folder")
    assert cli(target) == 2
    err = capfd.readouterr().err
    assert err.splitlines() == [f"error: --root_dir {target} is a file; give the path of a directory (it is created "
                                "if missing)"]
    assert target.read_text() == "not a folder"


def test_root_dir_under_a_file(cli, tmp_path, capfd):
    blocker = tmp_path / "results"
    blocker.write_text("")
    assert cli(blocker / "sac" / "run1") == 2
    assert capfd.readouterr().err.splitlines() == [
        f"error: cannot create --root_dir {blocker / 'sac' / 'run1'}: {blocker} is a file, not a directory; give a "
        "--root_dir whose parents are directories"]


@PERMISSIONS
def test_unwritable_root_dir(cli, tmp_path, capfd):
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(0o500)
    try:
        assert cli(root) == 2
    finally:
        root.chmod(0o700)
    err = capfd.readouterr().err
    assert err.splitlines() == [f"error: cannot write in --root_dir {root}: Permission denied (EACCES); user "
                                f"{getpass.getuser()} may not write in {root}: make it writable (chmod u+w) or use "
                                "another --root_dir"]
    assert os.listdir(root) == []


@PERMISSIONS
def test_unwritable_parts_of_an_existing_run(tmp_path):
    """Found at start-up: a read-only checkpoints folder or log file; at a save: the checkpoint's folder."""
    root, user = tmp_path / "root", getpass.getuser()
    ckpts = root / "checkpoints"
    ckpts.mkdir(parents=True)
    ckpts.chmod(0o500)
    try:
        with pytest.raises(DiskWriteError) as info:
            check_root_dir(str(root))
        assert str(info.value) == (f"cannot write in {ckpts}: Permission denied (EACCES); user {user} may not write "
                                   f"in {ckpts}: make it writable (chmod u+w) or use another --root_dir")
        with pytest.raises(DiskWriteError) as info:
            Checkpointer(str(ckpts)).save(1, {"model": {}}, {})
        assert str(info.value) == (f"cannot write checkpoint {ckpts / 'ckpt-1'}: Permission denied (EACCES); user "
                                   f"{user} may not write in {ckpts}: make it writable (chmod u+w) or use another "
                                   "--root_dir; no checkpoint was written before")
    finally:
        ckpts.chmod(0o700)
    (root / "log.txt").write_text("")
    (root / "log.txt").chmod(0o400)
    with pytest.raises(DiskWriteError) as info:
        check_root_dir(str(root))
    assert str(info.value) == (f"cannot write {root / 'log.txt'}: Permission denied (EACCES); user {user} may not "
                               f"write {root / 'log.txt'}: make it writable (chmod u+w) or use another --root_dir")


def test_check_root_dir_creates_a_missing_one_and_leaves_no_probe(tmp_path):
    root = tmp_path / "a" / "b"
    check_root_dir(str(root))
    assert root.is_dir() and os.listdir(root) == []
    (root / "log.txt").write_text("kept\n")
    (root / "checkpoints").mkdir()
    check_root_dir(str(root))
    assert sorted(os.listdir(root)) == ["checkpoints", "log.txt"] and os.listdir(root / "checkpoints") == []
    assert (root / "log.txt").read_text() == "kept\n"


def test_write_failure_says_what_to_free_or_change(tmp_path):
    path = str(tmp_path / "x.pt")
    mount = mount_point(path)
    full = write_failure("checkpoint", path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert re.fullmatch(rf"cannot write checkpoint {re.escape(path)}: {os.strerror(errno.ENOSPC)} \(ENOSPC\); "
                        rf"free space on {re.escape(mount)} \(\d+(\.\d)? [KMGT]?B free\) or use another --root_dir",
                        full), full
    read_only = write_failure("", path, OSError(errno.EROFS, os.strerror(errno.EROFS)))
    assert read_only.endswith(f"(EROFS); {mount} is mounted read-only: use a --root_dir on a writable file system")
    assert human_bytes(0) == "0 B" and human_bytes(1536) == "1.5 KB" and human_bytes(30 << 30) == "30 GB"


# ------------------------------------------------------------------------------- a full disk during training ----
def failing_checkpoint_writes(monkeypatch, from_save: int) -> list[int]:
    """Make the file writes of the ``from_save``-th checkpoint save (1-based) and later ones fail with ENOSPC, as a
    full disk does; returns the list of steps ``Checkpointer.save`` was called with."""
    calls: list[int] = []
    real_save, real_write = Checkpointer.save, checkpoint_module._HashingWriter.write

    def save(self, step, tensors, meta):
        calls.append(step)
        return real_save(self, step, tensors, meta)

    def write(self, data):
        if len(calls) >= from_save:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, data)

    monkeypatch.setattr(Checkpointer, "save", save)
    monkeypatch.setattr(checkpoint_module._HashingWriter, "write", write)
    return calls


def test_full_disk_at_a_checkpoint_is_one_line_and_no_retry(cli, tmp_path, monkeypatch, capfd):
    calls = failing_checkpoint_writes(monkeypatch, from_save=2)
    root = tmp_path / "root"
    assert cli(root) == 1
    err = capfd.readouterr().err
    assert_clean(err)
    ckpts = root / "checkpoints"
    assert problem_lines(err) == [line for line in err.splitlines() if " ERROR " in line]
    [line] = problem_lines(err)
    assert re.fullmatch(rf"\d\d:\d\d:\d\d ERROR cannot write checkpoint {re.escape(str(ckpts / 'ckpt-2'))} "
                        rf"\(algorithm\.pt\): {os.strerror(errno.ENOSPC)} \(ENOSPC\); free space on \S+ \(.* free\) "
                        rf"or use another --root_dir; the last checkpoint, {re.escape(str(ckpts / 'ckpt-1'))}, is "
                        "intact", line), line
    assert calls == [1, 2]  # the crash handler did not try to save again
    assert os.listdir(ckpts) == ["ckpt-1"]  # no half-written directory left
    assert Checkpointer(str(ckpts)).load(1).meta["iteration"] == 1  # verifies against its manifest


def tensorboard_fails_after(monkeypatch, events: int) -> None:
    """TensorBoard's writer thread gets ENOSPC from the event file after ``events`` records."""
    from tensorboard.summary.writer import record_writer

    real_write, count = record_writer.RecordWriter.write, [0]

    def write(self, data):
        count[0] += 1
        if count[0] > events:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", write)


def tensorboard_threads() -> list[threading.Thread]:
    from tensorboard.summary.writer import event_file_writer

    return [t for t in threading.enumerate() if isinstance(t, event_file_writer._AsyncWriterThread)]


def test_full_disk_in_tensorboards_writer_thread_is_one_line(cli, tmp_path, monkeypatch, capfd):
    tensorboard_fails_after(monkeypatch, events=3)  # the file header and a few scalars of the first summary
    root = tmp_path / "root"
    before = tensorboard_threads()
    assert cli(root) == 1
    err = capfd.readouterr().err
    assert_clean(err)
    [line] = problem_lines(err)
    assert re.fullmatch(rf"\d\d:\d\d:\d\d ERROR cannot write TensorBoard events in {re.escape(str(root / 'tb'))}: "
                        rf"{os.strerror(errno.ENOSPC)} \(ENOSPC\); free space on \S+ \(.* free\) or use another "
                        r"--root_dir; (the last checkpoint, \S+/ckpt-\d, is intact|no checkpoint was written before)",
                        line), line
    assert "writing a checkpoint" not in err  # the crash handler did not try to save
    assert tensorboard_threads() == before  # the writer's thread was stopped


def test_log_file_on_a_full_disk_warns_once_and_stderr_logging_goes_on(capfd):
    class DevFullHandler(train_cli.LogFileHandler):
        def _open(self):  # /dev/full is a device, which the handler refuses to open inside a root_dir: open it here
            return open(self.baseFilename, "a", encoding="utf-8")

    handler = DevFullHandler("/dev/full")  # every write fails with ENOSPC, for real
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("alfish.test_disk_errors")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for i in range(3):
            logger.warning("record %d", i)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 1 and handler.failed
    assert re.fullmatch(rf"WARNING cannot write log file /dev/full: {os.strerror(errno.ENOSPC)} \(ENOSPC\); free "
                        rf"space on {mount_point('/dev/full')} \([^)]* free\) or use another --root_dir; logging to "
                        "stderr only", lines[0]), lines


# ------------------------------------------------------------------------------------------- a real full disk ----
def _can_mount_tmpfs() -> bool:
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as mnt:
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {mnt}"],
                               capture_output=True, timeout=10)
    return probe.returncode == 0


REAL_TMPFS = pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs `unshare -rm` and tmpfs (a private mount "
                                                                "namespace); the fault-injected tests cover the rest")


def _in_tmpfs(size: str, mnt: pathlib.Path, command: str) -> str:
    return f"mount -t tmpfs -o {size} tmpfs {mnt} && {command}"


@REAL_TMPFS
@pytest.mark.timeout(120)
def test_real_full_disk_during_training(tmp_path):
    """A 400 KB file system holds two checkpoints of this run (~170 KB each) and not the third: one error line,
    exit 1, the second checkpoint intact (copied out of the namespace before the file system goes away)."""
    conf, mnt, out = tmp_path / "tiny.gin", tmp_path / "mnt", tmp_path / "out"
    conf.write_text(TINY.replace("A2cAlgorithm.hidden_sizes = (8,)", "A2cAlgorithm.hidden_sizes = (64, 64)"))
    mnt.mkdir()
    train = (f"{sys.executable} -m alfish.bin.train --conf {conf} --root_dir {mnt}/run; rc=$?; "
             f"cp -a {mnt}/run {out}; exit $rc")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", _in_tmpfs("size=400k", mnt, train)], capture_output=True,
                          text=True, timeout=110, cwd=REPO, env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert_clean(proc.stderr)
    [line] = problem_lines(proc.stderr)
    ckpts = f"{mnt}/run/checkpoints"
    assert re.fullmatch(rf"\d\d:\d\d:\d\d ERROR cannot write checkpoint {ckpts}/ckpt-3 \(\w+\.pt\): "
                        rf"{os.strerror(errno.ENOSPC)} \(ENOSPC\); free space on {mnt} \([^)]* free\) or use "
                        rf"another --root_dir; the last checkpoint, {ckpts}/ckpt-2, is intact", line), line
    assert sorted(os.listdir(out / "checkpoints")) == ["ckpt-1", "ckpt-2"]
    assert Checkpointer(str(out / "checkpoints")).load(2).meta["iteration"] == 2


@REAL_TMPFS
def test_read_only_and_full_file_systems_at_start_up(tmp_path):
    """The start-up check on a read-only file system (EROFS) and on a full one (ENOSPC), for real."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    check = (f"{sys.executable} -c 'import sys; from alfish.rundir.disk import check_root_dir, DiskWriteError\n"
             "try: check_root_dir(sys.argv[1])\nexcept DiskWriteError as e: print(e)' ")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    read_only = _in_tmpfs("size=64k,ro", mnt, check + f"{mnt}/run")
    full = _in_tmpfs("size=64k", mnt, f"mkdir {mnt}/run && (cat /dev/zero > {mnt}/fill 2>/dev/null; true) && "
                     + check + f"{mnt}/run")
    outputs = [subprocess.run(["unshare", "-rm", "sh", "-c", cmd], capture_output=True, text=True, timeout=30,
                              env=env).stdout.splitlines() for cmd in (read_only, full)]
    assert outputs[0] == [f"cannot create --root_dir {mnt}/run: {os.strerror(errno.EROFS)} (EROFS); {mnt} is mounted "
                          "read-only: use a --root_dir on a writable file system"]
    assert outputs[1] == [f"cannot write in --root_dir {mnt}/run: {os.strerror(errno.ENOSPC)} (ENOSPC); free space on "
                          f"{mnt} (0 B free) or use another --root_dir"]
