"""``python -m alfish.tools.verify_checkpoint``: a real run's checkpoints verify (exit 0) and are described; a flipped
byte or a deleted file is one line naming the file (exit 1); a path that holds no checkpoint exits 2."""
import pathlib
import shutil
import subprocess
import sys

import pytest

from alfish.tools import verify_checkpoint

REPO = pathlib.Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.timeout(60)]


def run(capsys, argv):
    code = verify_checkpoint.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_real_runs_checkpoints_verify_and_are_described(real_runs, capsys):
    code, out, _ = run(capsys, [str(real_runs[0])])
    assert code == 0, out
    assert "ckpt-100: verified" in out and "ckpt-200: verified" in out
    assert "  iteration 200, env steps 300, world size 1," in out
    assert "  algorithm.pt (" in out and "largest: " in out and "float32" in out
    assert "replay buffer: yes, 300 steps readable over 1 env(s) (300 written)" in out
    keys = [line for line in out.splitlines() if line.startswith("  meta.json keys: ")]
    assert len(keys) == 2 and all(k in keys[1] for k in ("iteration", "env_steps", "world_size", "operative_config"))
    assert out.endswith("2 checkpoints: 2 verified, 0 failed\n")


def test_one_checkpoint_directory_and_every_tensor(real_runs, capsys):
    code, out, _ = run(capsys, [str(real_runs[0] / "checkpoints" / "ckpt-200"), "--tensors"])
    assert code == 0 and out.startswith("ckpt-200: verified") and "ckpt-100" not in out
    assert "    actor.0.weight [16, 1] float32 64 B\n" in out  # PointGoal: 1-d observation, 16 hidden units


@pytest.fixture
def copied(real_runs, tmp_path):
    """A copy of a real run's checkpoints, to damage."""
    return pathlib.Path(shutil.copytree(real_runs[1] / "checkpoints", tmp_path / "checkpoints"))


def test_a_flipped_byte_and_a_deleted_file_are_one_line_each(copied, capsys):
    tensors = copied / "ckpt-200" / "algorithm.pt"
    data = bytearray(tensors.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tensors.write_bytes(bytes(data))
    (copied / "ckpt-100" / "meta.json").unlink()
    code, out, _ = run(capsys, [str(copied)])
    assert code == 1
    failed = [line for line in out.splitlines() if "FAILED" in line]
    assert len(failed) == 2, out
    assert failed[0].startswith(f"ckpt-100: FAILED: checkpoint {copied}/ckpt-100/meta.json is missing")
    assert failed[1].startswith(f"ckpt-200: FAILED: checkpoint {tensors} does not match its manifest (sha256 ")
    assert out.endswith("2 checkpoints: 0 verified, 2 failed\n")


def test_a_damaged_checkpoint_does_not_hide_a_good_one(copied, capsys):
    (copied / "ckpt-200" / "manifest.json").write_text("{not json")
    code, out, _ = run(capsys, [str(copied)])
    assert code == 1 and "ckpt-100: verified" in out
    assert f"ckpt-200: FAILED: checkpoint {copied}/ckpt-200/manifest.json is not a valid manifest" in out


def test_a_file_outside_the_manifest_is_named(copied, capsys):
    (copied / "ckpt-200" / "extra.pt").write_bytes(b"never read")
    code, out, _ = run(capsys, [str(copied / "ckpt-200")])
    assert code == 0 and "  not in the manifest (never read): extra.pt\n" in out


@pytest.mark.parametrize("path, message", [
    ("missing", "missing is not a directory"),
    (".", "holds no ckpt-N checkpoint directory"),
])
def test_a_bad_path_exits_2_with_one_line(tmp_path, capsys, path, message):
    code, out, err = run(capsys, [str(tmp_path / path)])
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_the_wrapper(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "tools" / "verify_checkpoint.py"), str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "holds no ckpt-N checkpoint directory" in done.stderr, done.stderr
