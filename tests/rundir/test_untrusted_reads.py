"""What alfish reads from a results directory is link-safe and bounded, and damage means "try the older checkpoint".

A tiny A2C run (checkpoints at iterations 1, 2, 3; ~1 s in this process) is copied for each test, and its newest
checkpoint is planted with what a copied or damaged directory may hold: a FIFO manifest, links to files outside,
JSON nested 100,000 deep, non-finite or out-of-range counters, a directory name of 31 digits, a tensor file whose
pickle entry is deflated around 1 GiB. ``play``, ``evaluate`` and resuming then use ckpt-2 (one warning naming the
file, no traceback) or refuse in one line; nothing outside the root_dir changes; a FIFO never blocks (an alarm turns
a hang into a failure). The tools read ``eval_log.jsonl`` inside the run, streaming and bounded. Peak memory is
measured where memory was the failure: the child's own ``ru_maxrss``, through a wrapper process.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import weakref
import zipfile
import zlib

import pytest
import torch

from alfish.bin import evaluate as evaluate_cli
from alfish.bin import export as export_cli
from alfish.bin import play as play_cli
from alfish.bin import train as train_cli
from alfish.console.printable import printable
from alfish.rundir.checkpoint import Checkpointer, CheckpointError
from alfish.tools import check_resume
from alfish.tools import compare as compare_cli
from alfish.tools import verify_checkpoint as verify_checkpoint_cli
from tests.rundir.in_process import logging_and_gin_restored

from .test_disk_errors import REPO, TINY, assert_clean

PEAK_RSS_MB = 600  # play of this run peaks near 350 MB; a 1 GiB inflation or read would pass this bound
WRAPPER = ("import json, resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True, "
           "timeout=120); print(json.dumps([p.returncode, p.stdout, p.stderr, "
           "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))")


# ------------------------------------------------------------------------------------------------- fixtures ----


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> pathlib.Path:
    """A finished tiny run: <dir>/root with ckpt-1..3, and <dir>/tiny.gin (its conf)."""
    work = tmp_path_factory.mktemp("trained")
    (work / "tiny.gin").write_text(TINY)
    with logging_and_gin_restored():
        assert train_cli.main(["--conf", str(work / "tiny.gin"), "--root_dir", str(work / "root")]) == 0
    return work


@pytest.fixture
def run(trained, tmp_path) -> pathlib.Path:
    """A copy of the trained run (tmp_path/root) that a test may plant things in; tmp_path/outside is a directory
    outside it that must not change."""
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True, symlinks=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "precious.txt").write_text("not alfish's\n")
    with logging_and_gin_restored(), _alarm(60):
        yield tmp_path / "root"


@contextlib.contextmanager
def _alarm(seconds: int):
    """A command that blocks (on a FIFO) fails the test after ``seconds`` instead of hanging the suite."""
    def hung(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def tree(path: pathlib.Path) -> dict[str, str]:
    """Relative path -> sha256 (or link target) of everything under ``path``."""
    return {str(p.relative_to(path)): (os.readlink(p) if p.is_symlink() else
                                       hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(path.rglob("*"))}


def newest(root: pathlib.Path) -> pathlib.Path:
    return root / "checkpoints" / "ckpt-3"


def reseal(ckpt: pathlib.Path, name: str, data: bytes | None = None) -> None:
    """Write ``data`` to ``ckpt/name`` (when given) and make the manifest agree, as a forger would."""
    if data is not None:
        (ckpt / name).write_bytes(data)
    raw = (ckpt / name).read_bytes()
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def set_meta(ckpt: pathlib.Path, **values) -> None:
    meta = json.loads((ckpt / "meta.json").read_text())
    meta.update(values)
    reseal(ckpt, "meta.json", json.dumps(meta).encode())  # (json writes Infinity for float('inf'))


def deep_json(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def problem_lines(stderr: str) -> list[str]:
    """The lines of ``stderr`` that are not INFO logging."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("INFO ")]


def command(name: str, root: pathlib.Path, *extra: str) -> int:
    """``play`` or ``evaluate`` on ``root``, in this process."""
    if name == "play":
        return play_cli.main(["--root_dir", str(root), *extra])
    return evaluate_cli.main(["--root_dir", str(root), "--num_episodes", "1", *extra])


@dataclasses.dataclass
class Output:
    """What a command printed: stdout, stderr, and its problem lines (stderr without INFO logging, plus the
    warnings it logged, which pytest captures apart from stderr)."""

    out: str
    err: str
    problems: list[str]


@pytest.fixture
def output(capfd, caplog):
    """Call to take what was printed and logged since the last call."""
    def take() -> Output:
        captured = capfd.readouterr()
        logged = [f"{r.levelname} {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]
        caplog.clear()
        return Output(captured.out, captured.err, problem_lines(captured.err) + logged)

    take()
    return take


def assert_used_ckpt2(code: int, captured: Output, warning: str) -> None:
    """The command ran on ckpt-2 after one warning (naming ckpt-3's damage, matching ``warning``), no traceback."""
    assert code == 0, captured
    assert_clean(captured.err)
    assert "ckpt-2" in captured.out and "ckpt-3" not in captured.out, captured.out
    lines = captured.problems
    assert len(lines) == 1 and warning in lines[0] and "ckpt-3" in lines[0], captured


def one_error_line(code: int, captured: Output, expected_code: int = 2) -> str:
    assert code == expected_code, captured
    assert_clean(captured.err)
    lines = captured.problems
    assert len(lines) == 1 and lines[0].startswith("error: "), captured
    return lines[0]


def measured(*argv: str, cwd: pathlib.Path) -> tuple[int, str, str, float]:
    """Run ``python argv...`` in a fresh wrapper; (exit code, stdout, stderr, its peak RSS in MB)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", WRAPPER, sys.executable, *argv], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=180)
    code, stdout, stderr, maxrss_kb = json.loads(out.stdout)
    return code, stdout, stderr, maxrss_kb / 1024


COMMANDS = ["play", "evaluate"]


# ------------------------------------------------------------------------------------------- links and FIFOs ----
@pytest.mark.parametrize("name", COMMANDS)
def test_fifo_manifest_is_damage_not_a_hang(run, name, output):
    os.remove(newest(run) / "manifest.json")
    os.mkfifo(newest(run) / "manifest.json")
    output()
    assert_used_ckpt2(command(name, run), output(), "manifest.json is a FIFO, not a file")


@pytest.mark.parametrize("name", COMMANDS)
def test_symlinked_checkpoint_file_is_not_followed(run, name, output):
    """algorithm.pt replaced by a link to an identical copy outside: it would verify if followed."""
    outside = run.parent / "outside"
    shutil.copy(newest(run) / "algorithm.pt", outside / "algorithm.pt")
    os.remove(newest(run) / "algorithm.pt")
    os.symlink(outside / "algorithm.pt", newest(run) / "algorithm.pt")
    before = tree(outside)
    output()
    assert_used_ckpt2(command(name, run), output(), "algorithm.pt is a symlink")
    assert tree(outside) == before


@pytest.mark.parametrize("name", COMMANDS)
def test_symlinked_checkpoint_directory_is_ignored(run, name, output):
    outside = run.parent / "outside"
    shutil.move(newest(run), outside / "ckpt-3")
    os.symlink(outside / "ckpt-3", newest(run))
    before = tree(outside)
    output()
    code = command(name, run)
    captured = output()
    assert code == 0 and "ckpt-2" in captured.out, captured
    assert captured.problems == [f"WARNING ignored ckpt-3 in {run / 'checkpoints'}: not real directories (alfish "
                                 "never follows a link inside a results directory)"]
    assert tree(outside) == before
    assert command(name, run, "--checkpoint_step", "3") == 2
    line = one_error_line(2, output())
    assert "ckpt-3 is a symlink, not a directory; alfish never follows links" in line


def test_symlinked_checkpoints_folder_is_one_line(run, output):
    outside = run.parent / "outside"
    shutil.move(run / "checkpoints", outside / "checkpoints")
    os.symlink(outside / "checkpoints", run / "checkpoints")
    output()
    line = one_error_line(command("play", run), output())
    assert f"{run / 'checkpoints'} is a symlink; alfish never follows links inside a results directory" in line
    before = tree(outside)
    assert verify_checkpoint_cli.main([str(run)]) == 2  # the results directory typed; its checkpoints/ a link
    assert f"{run / 'checkpoints'} is a symlink" in output().err and tree(outside) == before


# --------------------------------------------------------------------------------------------- bounded JSON ----
@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("file", ["meta.json", "manifest.json"])
def test_json_nested_100k_deep_falls_back_to_the_older(run, name, file, output):
    if file == "meta.json":
        reseal(newest(run), file, deep_json(100_000))
    else:
        (newest(run) / file).write_bytes(deep_json(100_000))
    output()
    assert_used_ckpt2(command(name, run), output(), "nests 100000 levels deep, more than the 64")


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("key,value,why", [
    ("iteration", float("inf"), "iteration is inf, not a whole number in [0, 999999999999999999]"),
    ("iteration", -5, "iteration is -5, not"), ("iteration", 1e30, "iteration is 1e+30, not"),
    ("iteration", 2, "records iteration 2 but its directory says step 3"),
    ("world_size", float("inf"), "world_size is inf, not a whole number in [1, 65536]"),
    ("world_size", 0, "world_size is 0, not"), ("world_size", 1e30, "world_size is 1e+30, not"),
    ("env_steps", -1, "env_steps is -1, not"), ("seed", float("nan"), "seed is nan, not"),
    ("elapsed_s", float("-inf"), "elapsed_s is -inf, not a number in [0, 1e+12]")])
def test_meta_numbers_out_of_range_fall_back_to_the_older(run, name, key, value, why, output):
    set_meta(newest(run), **{key: value})
    output()
    assert_used_ckpt2(command(name, run), output(), f"meta.json {why}")


def test_resume_falls_back_past_deep_meta_and_bad_counters(run, output):
    """Resuming skips ckpt-3 (deep meta) and ckpt-2 (iteration Infinity), resumes at 1, moves both aside."""
    reseal(newest(run), "meta.json", deep_json(100_000))
    set_meta(run / "checkpoints" / "ckpt-2", iteration=float("inf"))
    output()
    assert train_cli.main(["--conf", str(run.parent / "tiny.gin"), "--root_dir", str(run)]) == 0
    got = output()
    err = got.err + "\n".join(got.problems)
    assert_clean(err)
    assert f"resumed from {run / 'checkpoints' / 'ckpt-1'}: iteration 1," in err, err
    assert "nests 100000 levels deep" in err and "meta.json iteration is inf" in err, err
    assert Checkpointer(str(run / "checkpoints")).steps() == [1, 2, 3]


def test_resume_over_a_fifo_manifest_does_not_hang(run, output):
    os.remove(newest(run) / "manifest.json")
    os.mkfifo(newest(run) / "manifest.json")
    output()
    assert train_cli.main(["--conf", str(run.parent / "tiny.gin"), "--root_dir", str(run)]) == 0
    got = output()
    err = got.err + "\n".join(got.problems)
    assert_clean(err)
    assert "manifest.json is a FIFO" in err and f"resumed from {run / 'checkpoints' / 'ckpt-2'}" in err, err


def test_meta_and_manifest_caps(tmp_path):
    """What alfish writes is far below the caps (meta ~20 KB); a meta of more JSON values than 1,000,000 or a
    manifest of more than 100,000 is refused before it is parsed, and the older checkpoint is used."""
    ck = Checkpointer(str(tmp_path))
    ck.save(1, {"model": {"w": torch.zeros(2)}}, {"iteration": 1})
    ck.save(2, {"model": {"w": torch.ones(2)}}, {"iteration": 2})
    reseal(tmp_path / "ckpt-2", "meta.json", json.dumps({"iteration": 2, "x": [0] * 1_000_001}).encode())
    assert ck.load_latest().step == 1
    with pytest.raises(CheckpointError, match=r"meta\.json holds about \d+ JSON values, more than the 1000000"):
        ck.load(2)
    manifest = json.loads((tmp_path / "ckpt-2" / "manifest.json").read_text())
    manifest["padding"] = [0] * 100_001
    (tmp_path / "ckpt-2" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"manifest\.json is not a valid manifest: it holds about \d+ JSON "
                                              r"values, more than the 100000"):
        ck.load(2)


# ------------------------------------------------------------------------------------------------ step names ----
@pytest.mark.parametrize("name", COMMANDS)
def test_a_31_digit_step_name_is_ignored(run, name, output):
    huge = run / "checkpoints" / f"ckpt-1{'0' * 30}"
    shutil.copytree(newest(run), huge)
    assert Checkpointer(str(run / "checkpoints")).steps() == [1, 2, 3]
    output()
    code = command(name, run)
    captured = output()
    assert code == 0 and "ckpt-3" in captured.out and not captured.problems, captured
    line = one_error_line(command(name, run, "--checkpoint_step", f"1{'0' * 30}"), output())
    assert "step must be an int >= 0 (the training iteration, at most 999999999999999999)" in line


# ------------------------------------------------------------------------------------------ compressed archive ----
def plant_deflated_pickle(pt: pathlib.Path, inflated: int) -> None:
    """Rewrite the torch.save archive ``pt`` with its data.pkl entry deflate-compressed and padded with zeros to
    ``inflated`` bytes (the compressed stream is built from one flushed 1 MiB block repeated: ~4.5 KB a MiB)."""
    with zipfile.ZipFile(pt) as archive:
        entries = [(info, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(pt, "w") as out:
        for info, data in entries:
            if not info.filename.endswith("/data.pkl"):
                out.writestr(info, data)
                continue
            deflate = zlib.compressobj(1, zlib.DEFLATED, -15)
            head = deflate.compress(data) + deflate.flush(zlib.Z_FULL_FLUSH)
            block = deflate.compress(bytes(1 << 20)) + deflate.flush(zlib.Z_FULL_FLUSH)
            blocks = (inflated - len(data)) >> 20
            payload = head + block * blocks + deflate.flush()
            entry = zipfile.ZipInfo(info.filename, info.date_time)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.file_size, entry.compress_size, entry.CRC = len(data) + (blocks << 20), len(payload), 0
            entry.header_offset = out.fp.tell()
            out.fp.write(entry.FileHeader())
            out.fp.write(payload)
            out.filelist.append(entry)
            out.NameToInfo[entry.filename] = entry
            out.start_dir = out.fp.tell()


def test_compressed_pickle_entry_is_damage_never_inflated_by_play(run):
    plant_deflated_pickle(newest(run) / "algorithm.pt", 1 << 30)
    reseal(newest(run), "algorithm.pt")
    assert (newest(run) / "algorithm.pt").stat().st_size < 8 << 20
    code, out, err, peak_mb = measured("-m", "alfish.bin.play", "--root_dir", "root", cwd=run.parent)
    assert code == 0 and "ckpt-2" in out, err
    assert_clean(err)
    [warning] = [line for line in err.splitlines() if "WARNING" in line]
    assert "algorithm.pt holds the compressed entry 'archive/data.pkl' (4" in warning, warning
    assert "nothing was inflated" in warning
    assert peak_mb < PEAK_RSS_MB, peak_mb


def test_compressed_pickle_entry_is_damage_for_evaluate(run, output):
    plant_deflated_pickle(newest(run) / "algorithm.pt", 64 << 20)
    reseal(newest(run), "algorithm.pt")
    output()
    assert_used_ckpt2(command("evaluate", run), output(), "holds the compressed entry")


# ---------------------------------------------------------------------------------------- evaluate --all memory ----
def test_evaluate_all_holds_one_checkpoint_at_a_time(run, monkeypatch, output):
    """Each loaded checkpoint (and its tensors) is released before the next is loaded."""
    loaded: list[weakref.ref] = []
    real_load = Checkpointer.load

    def load(self, step):
        alive = [ref() for ref in loaded if ref() is not None]
        assert not alive, f"checkpoint(s) {[c.step for c in alive]} still held while loading {step}"
        ckpt = real_load(self, step)
        loaded.append(weakref.ref(ckpt))
        loaded.append(weakref.ref(ckpt.tensors["algorithm"][next(iter(ckpt.tensors["algorithm"]))]))
        return ckpt

    monkeypatch.setattr(Checkpointer, "load", load)
    assert command("evaluate", run, "--all") == 0, output().err
    assert len(loaded) == 6
    assert len((run / "evaluations" / "eval_log.jsonl").read_text().splitlines()) == 3


def test_evaluate_default_out_dir_is_not_followed_through_a_link(run, output):
    outside = run.parent / "outside"
    os.symlink(outside, run / "evaluations")
    before = tree(outside)
    output()
    line = one_error_line(command("evaluate", run), output())
    assert f"{run / 'evaluations'} is a symlink; alfish never follows links" in line
    assert tree(outside) == before


def test_export_default_out_is_not_followed_through_a_link(run, output):
    outside = run.parent / "outside"
    os.symlink(outside, run / "export")
    before = tree(outside)
    output()
    line = one_error_line(export_cli.main(["--root_dir", str(run), "--format", "pt2"]), output())
    assert f"{run / 'export'} is a symlink; alfish never follows links" in line and "(or give --out)" in line
    assert tree(outside) == before


# ------------------------------------------------------------------------------------------ tools: eval logs ----
def write_log(root: pathlib.Path) -> None:
    record = dict(iteration=1, env_steps=8, elapsed_s=1.0, average_return=10.0)
    (root / "eval_log.jsonl").write_text(json.dumps(record) + "\n")


@pytest.mark.parametrize("plant", ["dev_zero", "fifo", "outside"])
def test_compare_refuses_a_planted_eval_log_in_one_line(run, plant, output):
    log = run / "eval_log.jsonl"
    outside = run.parent / "outside"
    if plant == "dev_zero":
        os.symlink("/dev/zero", log)
    elif plant == "fifo":
        os.mkfifo(log)
    else:
        write_log(outside)
        os.symlink(outside / "eval_log.jsonl", log)
    before = tree(outside)
    output()
    line = one_error_line(compare_cli.main([str(run)]), output())
    assert f"{log} is a {'FIFO, not a file' if plant == 'fifo' else 'symlink'}" in line, line
    assert tree(outside) == before
    with pytest.raises(ValueError, match="eval_log.jsonl is a"):
        check_resume.evaluations(str(run))


def test_a_giant_eval_log_line_is_one_line_in_bounded_memory(run):
    """A 1 GiB eval_log.jsonl without a newline (sparse: zeros) is refused after 64 KiB, not read whole."""
    with open(run / "eval_log.jsonl", "wb") as f:
        f.truncate(1 << 30)
    code, out, err, peak_mb = measured("-m", "alfish.tools.compare", "root", cwd=run.parent)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "eval_log.jsonl has a line longer than the 65536 bytes alfish reads" in err
    assert peak_mb < 300, peak_mb


# ---------------------------------------------------------------------------------------------- escape bytes ----
def test_printable_escapes_control_characters():
    assert printable("a\x1b[2Jb\tc\u200bd\udcff é") == "a\\x1b[2Jb\\tc\\u200bd\\udcff é"
    assert printable("plain text") == "plain text"


def test_escape_bytes_in_a_planted_name_are_printed_escaped(tmp_path, output):
    """``compare 'runs/*'`` over a directory an attacker named with an ESC sequence."""
    (tmp_path / "runs" / "evil\x1b[2J").mkdir(parents=True)
    output()
    line = one_error_line(compare_cli.main([str(tmp_path / "runs" / "*")]), output())
    assert "\x1b" not in line and "evil\\x1b[2J has no eval_log.jsonl" in line, line


def test_escape_bytes_in_stored_content_are_printed_escaped(run, output):
    meta = json.loads((newest(run) / "meta.json").read_text())
    assert "'CartPole-v1'" in meta["operative_config"]
    set_meta(newest(run), operative_config=meta["operative_config"].replace("'CartPole-v1'", "'Evil\x1b[2J-v1'"))
    for ckpt in ("ckpt-1", "ckpt-2"):
        shutil.rmtree(run / "checkpoints" / ckpt)
    output()
    line = one_error_line(command("play", run), output())
    assert "\x1b" not in line and "Evil\\x1b[2J" in line, line


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 1 << 20])
def test_json_bounds_are_scanned_chunk_by_chunk(monkeypatch, chunk):
    """The depth/value scan reads a document a chunk at a time (memory independent of its size): strings with
    brackets, commas and escaped quotes split across chunks count as nothing."""
    from alfish.rundir import bounded

    monkeypatch.setattr(bounded, "_CHUNK", chunk)
    text = json.dumps({"s": 'a[[{"\\,]] \\" \\\\', "t": [[1, 2], {"u": "]]]"}]})
    assert bounded.loads_bounded(text.encode(), "doc", max_values=8, max_depth=3) == json.loads(text)
    with pytest.raises(bounded.RootDirContentError, match=r"^doc nests 3 levels deep, more than the 2"):
        bounded.loads_bounded(text.encode(), "doc", max_values=8, max_depth=2)
    with pytest.raises(bounded.RootDirContentError, match=r"^doc holds about \d+ JSON values, more than the 7"):
        bounded.loads_bounded(text.encode(), "doc", max_values=7, max_depth=3)
