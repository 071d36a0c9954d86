"""Nothing a run writes or deletes goes through a symlink planted in its root_dir (DESIGN.md §3.13).

A finished tiny run (A2C on CartPole, an evaluation and a best checkpoint every iteration, the scalars CSV on) is
copied, one of its files or folders is replaced by a symlink to a copy outside the root_dir, and the run is resumed
through ``alfish.bin.train.main`` in this process: at start-up the refusal is one ``error:`` line naming the path
(exit 2); with the start-up check taken away, the writer itself refuses it in one line (exit 1 or 2), the crash
handler writes no checkpoint, and in both cases every file outside is unchanged and nothing new is there.
Checkpoint rotation deletes only what a checkpoint's manifest lists, never through a link.
"""
from __future__ import annotations

import logging
import os
import pathlib
import shutil

import pytest
import torch

from alfish.bin import train as train_cli
from alfish.rundir.checkpoint import Checkpointer, CheckpointWriteError
from alfish.rundir.config_files import write_config_record
from alfish.rundir.eval_log import append_record, recorded_iterations
from alfish.rundir.run_record import write_run_record
from alfish.rundir.safe_paths import UnsafePathError
from alfish.rundir.set_aside import start_over
from alfish.trainer.lifecycle import best_checkpointer
from tests.rundir.in_process import logging_and_gin_restored

from .test_disk_errors import TINY, assert_clean
from .test_safe_paths import tree_digest

TINY_RUN = TINY.replace("TrainerConfig.evaluate = False", """TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 1
TrainerConfig.num_eval_episodes = 1
TrainerConfig.num_eval_environments = 1
TrainerConfig.async_eval = False""") + "Trainer.scalars_csv = True\n"
RESUME_LONGER = ("--conf_param", "TrainerConfig.num_iterations=6")
# What a planted link points to: the run's own item moved outside, or (for the best checkpoint and the videos, which
# a resumed run would not need to replace) a folder alfish did not write.
PLANTED = ["log.txt", "eval_log.jsonl", "scalars.csv", "checkpoints", "checkpoints/best", "tb", "videos", "config",
           "run_record"]




def train(conf: pathlib.Path, root: pathlib.Path, *extra: str) -> int:
    with logging_and_gin_restored():
        return train_cli.main(["--conf", str(conf), "--root_dir", str(root), *extra])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> pathlib.Path:
    """A finished 3-iteration run (checkpoints 1-3, a best checkpoint, eval log, scalars CSV, tb, config)."""
    folder = tmp_path_factory.mktemp("finished")
    (folder / "tiny.gin").write_text(TINY_RUN)
    assert train(folder / "tiny.gin", folder / "run") == 0
    assert (folder / "run" / "checkpoints" / "best").is_dir() and (folder / "run" / "scalars.csv").is_file()
    return folder


def plant(root: pathlib.Path, name: str, outside: pathlib.Path) -> pathlib.Path:
    """Replace ``root/name`` by a symlink to ``outside/<its base name>`` (the item moved there, or a foreign folder
    with a ``ckpt-1/`` in it); returns the link."""
    link, target = root / name, outside / os.path.basename(name)
    if name in ("checkpoints/best", "videos"):
        shutil.rmtree(link, ignore_errors=True)
        (target / "ckpt-1").mkdir(parents=True)
        (target / "ckpt-1" / "model.pt").write_bytes(b"not alfish's")
        (target / "notes.txt").write_text("the user's own\n")
    else:
        shutil.move(link, target)
    link.symlink_to(target)
    return link


@pytest.fixture
def resumable(finished_run, tmp_path):
    """(conf, a copy of the finished run, an empty outside folder)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    shutil.copytree(finished_run / "run", root, symlinks=True)
    outside.mkdir()
    return finished_run / "tiny.gin", root, outside


@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_link_stops_the_run_at_start_up(resumable, name, capfd):
    conf, root, outside = resumable
    link = plant(root, name, outside)
    before = tree_digest(outside)
    capfd.readouterr()
    assert train(conf, root, *RESUME_LONGER) == 2
    err = capfd.readouterr().err
    kind = "file" if name.endswith((".txt", ".jsonl", ".csv")) else "directory"
    assert err.splitlines() == [f"error: {link} is a symlink; alfish never follows links inside a results directory: "
                                f"replace it with a real {kind} or use another --root_dir"]
    assert tree_digest(outside) == before


def _render_available() -> bool:
    try:
        import imageio  # noqa: F401
        import pygame  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", PLANTED)
def test_each_writer_refuses_a_planted_link_itself(resumable, name, capfd, monkeypatch):
    """The start-up check taken away: the writer of ``name`` refuses the link in one line, the crash handler writes
    no checkpoint, nothing outside changes."""
    extra = list(RESUME_LONGER)
    if name == "videos":
        if not _render_available():
            pytest.skip("videos need the 'render' extra (imageio) and pygame")
        extra += ["--conf_param", "Trainer.eval_video_interval=1", "--conf_param", "Trainer.eval_video_format='gif'"]
    conf, root, outside = resumable
    link = plant(root, name, outside)
    before = tree_digest(outside)
    monkeypatch.setattr("alfish.rundir.disk.check_root_dir", lambda root_dir: None)
    capfd.readouterr()
    assert train(conf, root, *extra) in (1, 2)
    err = capfd.readouterr().err
    assert_clean(err)
    errors = [line for line in err.splitlines() if line.startswith("error: ") or " ERROR " in line]
    errors = [line for line in errors if "XDG_RUNTIME_DIR" not in line]  # (SDL's own line when pygame renders)
    assert len(errors) == 1 and f"{link} is a symlink; alfish never follows links" in errors[0], err[-3000:]
    assert "writing a checkpoint" not in err  # the crash handler did not try to save through the link
    assert tree_digest(outside) == before


# ---------------------------------------------------------------------------------------- rotation and set-aside ----
def _save(ck: Checkpointer, step: int) -> str:
    return ck.save(step, {"model": {"w": torch.full((4,), float(step))}}, {"step": step})


def test_a_best_checkpoint_folder_linked_outside_is_neither_written_nor_rotated(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (outside / "ckpt-1").mkdir(parents=True)
    (outside / "ckpt-1" / "model.pt").write_bytes(b"someone else's")
    (root / "checkpoints").mkdir(parents=True)
    (root / "checkpoints" / "best").symlink_to(outside)
    before = tree_digest(outside)
    with pytest.raises(CheckpointWriteError) as caught:
        _save(best_checkpointer(str(root)), 2)
    assert str(caught.value) == (f"{root}/checkpoints/best is a symlink; alfish never follows links inside a "
                                 "results directory: replace it with a real directory or use another --root_dir")
    assert tree_digest(outside) == before


def test_rotation_deletes_only_what_the_manifest_lists_and_never_through_a_link(tmp_path, caplog):
    root, outside = tmp_path / "root", tmp_path / "outside"
    ck = Checkpointer(str(root / "checkpoints"), max_to_keep=1, root_dir=str(root))
    _save(ck, 1)
    (root / "checkpoints" / "ckpt-1" / "notes.txt").write_text("the user's own\n")  # not in the manifest
    shutil.copytree(root / "checkpoints" / "ckpt-1", outside / "ckpt-0")
    (root / "checkpoints" / "ckpt-0").symlink_to(outside / "ckpt-0")  # a checkpoint folder that is a link
    before = tree_digest(outside)
    with caplog.at_level(logging.WARNING, logger="alfish.rundir.checkpoint"):
        _save(ck, 2)
    assert sorted(os.listdir(root / "checkpoints" / "ckpt-1")) == ["notes.txt"]  # the folder stays, with it
    assert os.path.islink(root / "checkpoints" / "ckpt-0") and tree_digest(outside) == before
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.endswith("its manifest does not list: notes.txt") for m in messages), messages
    assert ck.load(2).step == 2 and ck.steps() == [1, 2]  # the linked ckpt-0 is not a checkpoint of this run
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="alfish.rundir.checkpoint"):
        assert ck.scan().latest.step == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"ignored ckpt-0 in {root}/checkpoints: not real directories (alfish never follows a link inside a results "
        "directory)"]


def test_rotation_leaves_a_checkpoint_whose_manifest_cannot_be_read(tmp_path, caplog):
    root = tmp_path / "root"
    ck = Checkpointer(str(root / "checkpoints"), max_to_keep=1, root_dir=str(root))
    _save(ck, 1)
    (root / "checkpoints" / "ckpt-1" / "manifest.json").write_text("[" * 100_000)  # deep: not parsed
    kept = tree_digest(root / "checkpoints" / "ckpt-1")
    with caplog.at_level(logging.WARNING, logger="alfish.rundir.checkpoint"):
        _save(ck, 2)
    assert tree_digest(root / "checkpoints" / "ckpt-1") == kept
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"left the old checkpoint {root}/checkpoints/ckpt-1 in place") and "\n" not in warning


def test_fresh_moves_a_linked_folder_as_the_link_itself(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (outside / "events").mkdir(parents=True)
    (outside / "events" / "e.1").write_text("x")
    root.mkdir()
    (root / "tb").symlink_to(outside / "events")
    before = tree_digest(outside)
    dest = start_over(str(root))
    assert os.readlink(os.path.join(dest, "tb")) == str(outside / "events") and not os.path.lexists(root / "tb")
    assert tree_digest(outside) == before


# ------------------------------------------------------------------------------------------- the other writers ----
def test_eval_log_config_and_run_record_refuse_links(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "eval_log.jsonl").write_text('{"iteration": 1}\n')
    (root / "eval_log.jsonl").symlink_to(outside / "eval_log.jsonl")
    (root / "config").symlink_to(outside)
    (root / "run_record").symlink_to(outside)
    before = tree_digest(outside)
    for call, name in ((lambda: append_record(str(root), {"iteration": 2}), "eval_log.jsonl"),
                       (lambda: recorded_iterations(str(root)), "eval_log.jsonl"),
                       (lambda: write_config_record(str(root)), "config"),
                       (lambda: write_run_record(str(root), None, ["train"]), "run_record")):
        with pytest.raises(UnsafePathError, match=f"^{root}/{name} is a symlink; "):
            call()
    assert tree_digest(outside) == before


def test_eval_log_reads_are_bounded_and_a_fifo_is_refused(tmp_path, caplog):
    (tmp_path / "eval_log.jsonl").write_bytes(b'{"iteration": 1}\n{"iteration": 1e400}\n' + b"x" * (70 << 10))
    with caplog.at_level(logging.WARNING):
        assert recorded_iterations(str(tmp_path)) == {1}  # the over-long line: read up to there, one warning
    assert "has a line longer than" in caplog.text
    (tmp_path / "eval_log.jsonl").unlink()
    os.mkfifo(tmp_path / "eval_log.jsonl")
    with pytest.raises(UnsafePathError, match="is a FIFO"):
        recorded_iterations(str(tmp_path))
