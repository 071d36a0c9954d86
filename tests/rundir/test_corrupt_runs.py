"""Runs whose checkpoints do not verify: no run ever overwrites or deletes a checkpoint it could not read.

All damaged: the run refuses to start (exit 2, one error line naming the files and the choices). ``--fresh`` moves the
previous checkpoints (damaged or not), TensorBoard events and eval log to ``before-fresh-<time>/`` and trains from
iteration 0. Newest damaged, an older one intact: the run resumes from the older one and moves the damaged ones to
``checkpoints.damaged-<time>/`` first, so its own saves at those steps replace nothing. Runs go through
``alfish.bin.train.main`` in this process (a tiny A2C conf, ~1 s each).
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import re

import pytest

from alfish.learn.distributed import DistContext
from alfish.rundir.checkpoint import Checkpointer, CheckpointError
from alfish.trainer.resume import choose_resume_point

from .test_disk_errors import assert_clean, cli, problem_lines  # noqa: F401  (cli: the fixture)


def tree(path: pathlib.Path) -> dict[str, str]:
    """Relative file path -> sha256 of every file under ``path``."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def damage(path: pathlib.Path) -> None:
    """Flip a byte in the middle of ``path`` (same size, different content)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def trained(cli, tmp_path):  # noqa: F811  (the imported fixture)
    """A root_dir with checkpoints at iterations 1, 2, 3 (a finished tiny run)."""
    root = tmp_path / "root"
    assert cli(root) == 0
    assert Checkpointer(str(root / "checkpoints")).steps() == [1, 2, 3]
    return root


def only(pattern: str, folder: pathlib.Path) -> pathlib.Path:
    [found] = [p for p in folder.iterdir() if re.fullmatch(pattern, p.name)]
    return found


def test_all_damaged_refuses_then_fresh_moves_them_aside_and_starts_over(cli, trained, capfd):  # noqa: F811
    ckpts = trained / "checkpoints"
    for step, name in ((1, "algorithm.pt"), (2, "meta.json"), (3, "learner.pt")):
        damage(ckpts / f"ckpt-{step}" / name)
    damaged = tree(ckpts)
    capfd.readouterr()

    assert cli(trained) == 2
    err = capfd.readouterr().err
    assert_clean(err)
    lines = problem_lines(err)
    assert len(lines) == 4 and all(" WARNING checkpoint " in line for line in lines[:3]), lines
    files = ", ".join(str(ckpts / f"ckpt-{s}" / n) for s, n in ((3, "learner.pt"), (2, "meta.json"),
                                                                 (1, "algorithm.pt")))
    assert lines[3].split(" ", 1)[1] == (
        f"ERROR none of the 3 checkpoint(s) in {ckpts} verifies (damaged: {files}; the warnings above say why); to "
        f"start from iteration 0 rerun with --fresh (moves them to {trained / 'before-fresh-<time>'}, deletes "
        "nothing), or put intact copies back to resume")
    assert tree(ckpts) == damaged  # refused: nothing written, moved or deleted

    assert cli(trained, "--fresh") == 0
    err = capfd.readouterr().err
    aside = only(r"before-fresh-\d{8}-\d{6}", trained)
    assert tree(aside / "checkpoints") == damaged  # every damaged byte kept
    assert os.listdir(aside / "tb")  # the old events, away from the new run's
    assert re.search(rf"WARNING --fresh: moved checkpoints, tb to {re.escape(str(aside))} \(nothing was deleted\); "
                     "training starts from iteration 0", err), err
    assert "resumed from" not in err
    fresh = Checkpointer(str(ckpts))
    assert fresh.steps() == [1, 2, 3] and fresh.load(1).meta["iteration"] == 1  # trained again from iteration 0


def test_newest_damaged_resumes_from_the_older_and_keeps_the_damaged_ones(cli, trained, capfd):  # noqa: F811
    ckpts = trained / "checkpoints"
    damage(ckpts / "ckpt-3" / "algorithm.pt")
    damage(ckpts / "ckpt-2" / "rng.pt")
    damaged = {k: v for k, v in tree(ckpts).items() if not k.startswith("ckpt-1")}
    capfd.readouterr()

    assert cli(trained) == 0  # resumes at iteration 1, trains to 3
    err = capfd.readouterr().err
    aside = only(r"checkpoints\.damaged-\d{8}-\d{6}", trained)
    assert tree(aside) == damaged
    assert re.search(rf"WARNING moved 2 checkpoint\(s\) that do not verify \(newer than step 1\) to "
                     rf"{re.escape(str(aside))}; nothing was deleted", err), err
    assert f"resumed from {ckpts / 'ckpt-1'}: iteration 1," in err
    ck = Checkpointer(str(ckpts))
    assert ck.steps() == [1, 2, 3] and ck.load(3).meta["iteration"] == 3  # written again, verifying


def test_fresh_also_moves_intact_checkpoints(cli, trained, capfd):  # noqa: F811
    before = tree(trained / "checkpoints")
    capfd.readouterr()
    assert cli(trained, "--fresh") == 0
    err = capfd.readouterr().err
    aside = only(r"before-fresh-\d{8}-\d{6}", trained)
    assert tree(aside / "checkpoints") == before
    assert "resumed from" not in err
    assert Checkpointer(str(trained / "checkpoints")).steps() == [1, 2, 3]


def test_fresh_twice_in_a_second_keeps_both(tmp_path):
    """Two set-asides with the same timestamp get distinct folders; nothing to move is no folder at all."""
    from alfish.rundir.set_aside import start_over

    assert start_over(str(tmp_path)) is None and os.listdir(tmp_path) == []
    (tmp_path / "eval_log.jsonl").write_text("{}\n")
    first = start_over(str(tmp_path))
    (tmp_path / "eval_log.jsonl").write_text("{}\n")
    second = start_over(str(tmp_path))
    assert first != second and os.path.isfile(os.path.join(first, "eval_log.jsonl"))
    assert os.path.isfile(os.path.join(second, "eval_log.jsonl"))


def test_choose_resume_point_without_checkpoints_and_with_foreign_damage(tmp_path):
    """No checkpoint: start at 0. A ckpt-N folder that is not a checkpoint at all counts as damaged (refused)."""
    ck = Checkpointer(str(tmp_path / "checkpoints"))
    assert choose_resume_point(str(tmp_path), ck, DistContext()) is None
    (tmp_path / "checkpoints" / "ckpt-7").mkdir(parents=True)
    manifest = re.escape(str(tmp_path / "checkpoints" / "ckpt-7" / "manifest.json"))
    with pytest.raises(CheckpointError, match=rf"^none of the 1 checkpoint\(s\) in .* verifies \(damaged: {manifest};"):
        choose_resume_point(str(tmp_path), ck, DistContext())
    assert os.listdir(tmp_path / "checkpoints") == ["ckpt-7"]
