"""The battery's malicious scenario: results directories someone else prepared, met by every command that reads one.

Two parts. The known payloads (a pickle in ``algorithm.pt``, gin that reaches ``os.system``, a ``module:EnvId`` that
imports a planted module) are played: a marker file must never be written. Then every class of planted content
(DESIGN.md §3.13) is put into a copy of a finished run and every command that reads a root_dir is run on its own copy:
``train`` (resume), ``play``, ``evaluate``, ``export``, ``collect``, ``tools.compare`` and ``tools.verify_checkpoint``.

Each (case, command) records its exit status, whether stderr is one error line without a traceback, its wall time, its
peak RSS (each of its processes' high-water mark, polled), and whether a directory outside the results directory
(where planted links point) changed or was opened. Pass rule, all of:
  - it ends within the case timeout (a hang is a failure);
  - it exits 0 (the planted content was skipped, or an older checkpoint used), or 1 or 2 (a refusal) with exactly one
    stderr line that is not an INFO/WARNING log line; no ``Traceback`` anywhere in stderr;
  - its peak RSS stays under the bound (1 GB; the commands need about 0.3-0.6 GB);
  - nothing in the outside directory changed (its tree's sha256, links not followed) and nothing there was opened
    (inotify), so a read through a planted link fails too;
  - where the case damages the newest checkpoint (``Case.unusable``), the command did not use it: exit 0 only after
    falling back to an older one (what each command prints about the checkpoint it used: ``USED_NEWEST``).
``--quick`` runs each case with the one command most exposed to it (``Case.quick``), two runs at a time, with a 30 s
timeout; the full battery runs every case with every command, one at a time (60 s each).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import io
import json
import os
import pathlib
import re
import shutil
import sys
import zipfile
from typing import Callable, Optional

from harness import A2C_CHAIN, ENV, Row, reseal, run
from watch import Finished, OpenWatch, digest_changes, run_measured, tree_digest

PY = sys.executable
MAX_RSS_MB = 1024
KILL_RSS_MB = 3 * MAX_RSS_MB  # a child past this is killed at once (a bomb must not exhaust the shared machine)
TIMEOUT_S, QUICK_TIMEOUT_S = 60.0, 30.0
QUICK_JOBS = 2  # --quick measures two runs at a time
BOMB_BYTES = 1536 << 20  # what the compressed entry inflates to: past the RSS bound
DEEP = 100_000  # nesting of the deep JSON documents
FORGED_ACTIONS = 10_000_000  # 50 times EpisodeLog.MAX_LOGGED_ACTIONS: replaying it takes minutes

# A2C on the 2-env toy chain with everything a run directory can hold: evaluation (eval_log.jsonl, checkpoints/best),
# scalars.csv, tb/, log.txt, 3 checkpoints (kept: 3, so a resume deletes the oldest).
BASE_CONF = A2C_CHAIN.replace("TrainerConfig.evaluate = False", "TrainerConfig.evaluate = True") + """
TrainerConfig.async_eval = False
TrainerConfig.eval_interval = 1
TrainerConfig.num_eval_episodes = 1
Trainer.scalars_csv = True
Trainer.max_checkpoints_to_keep = 3
"""
RESUME_CONF = BASE_CONF.replace("num_iterations = 3", "num_iterations = 5").replace("num_checkpoints = 3",
                                                                                    "num_checkpoints = 5")


# ------------------------------------------------------------------------------------------------ commands ----
def _module(name: str) -> list[str]:
    return [PY, "-m", name]


# name -> argv for (results directory, this run's own folder, extra flags of the case)
COMMANDS: dict[str, Callable[[pathlib.Path, pathlib.Path, list[str]], list[str]]] = {
    "train resume": lambda root, here, flags: _module("alfish.bin.train") + [
        "--conf", str(here.parent.parent / "resume.gin"), "--root_dir", str(root)],
    "play": lambda root, here, flags: _module("alfish.bin.play") + ["--root_dir", str(root), "--num_episodes", "1",
                                                                     *flags],
    "evaluate": lambda root, here, flags: _module("alfish.bin.evaluate") + ["--root_dir", str(root),
                                                                             "--num_episodes", "1", *flags],
    "export": lambda root, here, flags: _module("alfish.bin.export") + ["--root_dir", str(root), "--format", "pt2",
                                                                         *flags],
    "collect": lambda root, here, flags: _module("alfish.bin.collect") + [
        "--root_dir", str(root), "--num_steps", "20", "--out", str(here / "dataset")],
    "compare": lambda root, here, flags: _module("alfish.tools.compare") + [str(root)],
    "verify_checkpoint": lambda root, here, flags: _module("alfish.tools.verify_checkpoint") + [str(root)],
}
READ_CHECKPOINTS = ("train resume", "play", "evaluate", "export", "collect", "verify_checkpoint")
NEWEST = "checkpoints/ckpt-3"
# What each command prints when it used the newest checkpoint (verify_checkpoint: exit 0, every checkpoint verified).
USED_NEWEST = {"train resume": r"resumed from \S+/ckpt-3:", "play": r"\(checkpoint \S+/ckpt-3\)",
               "evaluate": r"(?m)^\S+/ckpt-3: average return", "export": r"exported \S+/ckpt-3 \(",
               "collect": r"the policy of \S+/ckpt-3 \("}


# --------------------------------------------------------------------------------------------------- cases ----
@dataclasses.dataclass(frozen=True)
class Case:
    """Planted content: ``plant(root, outside)`` puts it into a copy of the finished run (``outside``: a folder
    beside it, where planted links point). ``quick``: the command most exposed to it, the one ``--quick`` runs (the
    full battery runs every command). ``flags``: extra flags per command (``--best`` where the case is about the
    best checkpoint). ``unusable``: the newest checkpoint cannot be used as it is (a file that cannot be opened or
    parsed within bounds, tensors that are not what was saved), so a command that says it used that checkpoint fails
    (it must refuse it or fall back to ckpt-2). An out-of-range counter is not such a case: a command that never reads
    it may use the checkpoint; one that does must not crash, hang or blow up."""
    name: str
    plant: Callable[[pathlib.Path, pathlib.Path], None]
    quick: str = "train resume"
    flags: dict = dataclasses.field(default_factory=dict)
    unusable: bool = False


def _link_outside(rel: str) -> Callable[[pathlib.Path, pathlib.Path], None]:
    """``root/rel`` moved to ``outside`` and replaced by a link to it: following the link would work, and would
    read, write or delete outside."""
    def plant(root: pathlib.Path, outside: pathlib.Path) -> None:
        target = outside / pathlib.Path(rel).name
        shutil.move(root / rel, target)
        (root / rel).symlink_to(target, target_is_directory=target.is_dir())
    return plant


def _fifo(rel: str) -> Callable[[pathlib.Path, pathlib.Path], None]:
    def plant(root: pathlib.Path, outside: pathlib.Path) -> None:
        (root / rel).unlink()
        os.mkfifo(root / rel)  # an open() for reading blocks until a writer comes: none will
    return plant


def _write(rel: str, text: Callable[[pathlib.Path], str], sealed: bool = True) -> Callable:
    """``root/rel`` replaced by ``text(old path)``; ``sealed``: its manifest entry recomputed, as someone who
    controls the directory would, so the checkpoint verifies and the content reaches the parser."""
    def plant(root: pathlib.Path, outside: pathlib.Path) -> None:
        path = root / rel
        path.write_text(text(path))
        if sealed:
            reseal(path.parent, path.name)
    return plant


def _meta_with(**changes) -> Callable[[pathlib.Path], str]:
    def text(path: pathlib.Path) -> str:
        return json.dumps({**json.loads(path.read_text()), **changes})  # (inf is written as Infinity)
    return text


def _huge_meta(path: pathlib.Path) -> str:
    """meta.json just under the reader's byte cap, as a list of empty objects: ~5.6 million values, 0.4 GB of Python
    objects if parsed without a value count."""
    return _huge_meta_of(path.read_text())


@functools.lru_cache(maxsize=1)  # (every copy of the run gets the same 16 MiB)
def _huge_meta_of(old: str) -> str:
    from alfish.rundir.checkpoint_format import MAX_META_BYTES

    head = json.dumps(json.loads(old))[:-1] + ', "pad": ['
    count = (MAX_META_BYTES - 1024 - len(head)) // 3
    return head + "{}," * count + "{}]}"


def _compressed_pt(root: pathlib.Path, outside: pathlib.Path) -> None:
    """algorithm.pt rewritten with its first tensor record deflated from 1.5 GB of zeros (7 MB on disk): a zip bomb
    if inflated (and, memory-mapped, a record whose bytes are not the tensor's); the manifest resealed."""
    path = root / NEWEST / "algorithm.pt"
    path.write_bytes(_bombed(path.read_bytes()))
    reseal(path.parent, path.name)


@functools.lru_cache(maxsize=1)  # (deflating 1.5 GB takes seconds: once per battery)
def _bombed(archive: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(archive)) as old:
        entries = [(info, old.read(info)) for info in old.infolist()]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compresslevel=1) as new:
        bombed = False
        for info, data in entries:
            if not bombed and "/data/" in info.filename and not info.filename.endswith("/data/version"):
                bombed = True
                bomb = zipfile.ZipInfo(info.filename)
                bomb.compress_type = zipfile.ZIP_DEFLATED
                with new.open(bomb, "w", force_zip64=True) as out:
                    zeros = bytes(64 << 20)
                    for _ in range(BOMB_BYTES // len(zeros)):
                        out.write(zeros)
            else:
                new.writestr(info, data)
    return buffer.getvalue()


def _forged_actions(actions: Callable) -> Callable[[pathlib.Path, pathlib.Path], None]:
    """collector.pt's action log of env 0 replaced by ``actions(old)``, resealed: a resume replays it."""
    def plant(root: pathlib.Path, outside: pathlib.Path) -> None:
        import torch

        path = root / NEWEST / "collector.pt"
        state = torch.load(path, weights_only=True)
        state["envs"][0]["actions"] = actions(state["envs"][0]["actions"])
        torch.save(state, path)
        reseal(path.parent, path.name)
    return plant


def _dev_zero(rel: str) -> Callable[[pathlib.Path, pathlib.Path], None]:
    def plant(root: pathlib.Path, outside: pathlib.Path) -> None:
        (root / rel).unlink(missing_ok=True)
        (root / rel).symlink_to("/dev/zero")  # a file that never ends (and a device)
    return plant


def _best_flags() -> dict:
    return {"play": ["--best"], "evaluate": ["--best"], "export": ["--best"]}


_NEWEST_META, _NEWEST_MANIFEST = f"{NEWEST}/meta.json", f"{NEWEST}/manifest.json"
_DEEP_JSON = "[" * DEEP + "]" * DEEP
CASES = [
    Case("symlinked log.txt", _link_outside("log.txt")),
    Case("symlinked eval_log.jsonl", _link_outside("eval_log.jsonl")),
    Case("symlinked scalars.csv", _link_outside("scalars.csv")),
    Case("symlinked checkpoints/", _link_outside("checkpoints"), "collect"),
    Case("symlinked checkpoints/best", _link_outside("checkpoints/best"), "export", _best_flags()),
    Case("symlinked tb/", _link_outside("tb")),
    Case("FIFO manifest.json", _fifo(_NEWEST_MANIFEST), "play", unusable=True),
    Case("meta.json 100k deep", _write(_NEWEST_META, lambda p: _DEEP_JSON), "evaluate", unusable=True),
    Case("manifest.json 100k deep", _write(_NEWEST_MANIFEST, lambda p: _DEEP_JSON, sealed=False), "verify_checkpoint",
         unusable=True),
    Case("meta.json just under the cap", _write(_NEWEST_META, _huge_meta), "collect", unusable=True),
    Case("meta.json iteration Infinity", _write(_NEWEST_META, _meta_with(iteration=float("inf")))),
    Case("meta.json iteration -5", _write(_NEWEST_META, _meta_with(iteration=-5)), "play"),
    Case("meta.json iteration 1e30", _write(_NEWEST_META, _meta_with(iteration=1e30)), "export"),
    Case("compressed entry in algorithm.pt", _compressed_pt, "play", unusable=True),
    Case(f"forged action log ({FORGED_ACTIONS:,} actions)",
         _forged_actions(lambda old: old.new_zeros((FORGED_ACTIONS,) + tuple(old.shape[1:])))),
    Case("forged action log (action 99 of 2)",
         _forged_actions(lambda old: old.new_full((3,) + tuple(old.shape[1:]), 99))),
    Case("eval_log.jsonl -> /dev/zero", _dev_zero("eval_log.jsonl"), "compare"),
]


# ---------------------------------------------------------------------------------------------- measuring ----
@dataclasses.dataclass
class Outcome:
    """One (case, command): what was measured, and why it failed ('' when it passed)."""
    case: str
    command: str
    rc: Optional[int]  # None: killed at the timeout
    one_line: bool  # exit 0, or a refusal in one stderr line (INFO/WARNING log lines aside); no traceback anywhere
    wall_s: float
    max_rss_mb: float
    outside: list[str]  # what changed or was opened outside
    last_line: str  # the last line of stderr (a refusal, a warning) or else of stdout: what the user read
    why: str

    @property
    def ok(self) -> bool:
        return not self.why

    def row(self) -> str:
        cells = [self.case, self.command, "PASS" if self.ok else "FAIL", "hang" if self.rc is None else str(self.rc),
                 "yes" if self.one_line else "no", f"{self.wall_s:.1f}", f"{self.max_rss_mb:.0f}",
                 "; ".join(self.outside[:3]) or "untouched", self.why, self.last_line[:160]]
        return "| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |"


DETAIL_HEADER = ["| case | command | result | exit | one line, no traceback | wall s | peak RSS MB | outside | why | "
                 "last line |", "|---|---|---|---|---|---|---|---|---|---|"]
_LOG_LEVELS = {"INFO", "WARNING", "DEBUG"}


def error_lines(stderr: str) -> list[str]:
    """stderr's lines that are not log lines at INFO/WARNING/DEBUG (``12:00:00 INFO ...``, ``INFO ...``)."""
    return [line for line in stderr.splitlines()
            if line.strip() and not _LOG_LEVELS.intersection(line.split(" ", 3)[:3])]


def judge(case: Case, command: str, finished: Finished, timeout_s: float, outside: list[str]) -> Outcome:
    """The pass rule (module docstring) applied to one finished command."""
    errors = error_lines(finished.stderr)
    traceback = "Traceback" in finished.stderr
    rc = finished.returncode
    # verify_checkpoint's exit 1 is its report that a checkpoint failed (one stdout line per checkpoint), not a refusal
    reported = command == "verify_checkpoint" and rc == 1 and " failed" in finished.stdout
    why = []
    if rc is None:
        why.append(f"hang: killed after {timeout_s:.0f} s")
    elif rc not in (0, 1, 2):
        why.append(f"exit {rc}" + (f" (killed by the battery past {KILL_RSS_MB} MB)"
                                   if finished.max_rss_mb > KILL_RSS_MB else ""))
    if traceback:
        why.append("a traceback on stderr: " + (errors[-1][:160] if errors else ""))
    elif rc in (1, 2) and len(errors) != 1 and not reported:
        why.append(f"{len(errors)} error lines: {' / '.join(e[:80] for e in errors[:3])}")
    if finished.max_rss_mb > MAX_RSS_MB:
        why.append(f"peak RSS {finished.max_rss_mb:.0f} MB > {MAX_RSS_MB} MB")
    if outside:
        why.append(f"outside touched: {', '.join(outside[:3])}")
    if case.unusable and rc == 0 and _used_newest(command, finished):
        why.append("used the damaged newest checkpoint (ckpt-3) instead of refusing it")
    text = finished.stderr.strip() or finished.stdout.strip()
    return Outcome(case.name, command, rc, not traceback and (rc == 0 or reported or len(errors) == 1),
                   finished.wall_s,
                   finished.max_rss_mb, outside, text.splitlines()[-1] if text else "", "; ".join(why))


def _used_newest(command: str, finished: Finished) -> bool:
    if command == "verify_checkpoint":
        return True  # (exit 0: every checkpoint verified, the damaged one too)
    pattern = USED_NEWEST.get(command)
    return bool(pattern and re.search(pattern, finished.stdout + finished.stderr))


def measure(case: Case, command: str, work: pathlib.Path, timeout_s: float) -> Outcome:
    """One planted copy of the run met by one command (its folder is kept when it fails, for a look)."""
    here = work / "runs" / f"{CASES.index(case):02d}-{list(COMMANDS).index(command)}"
    root, outside, cwd = here / "root", here / "outside", here / "cwd"
    shutil.copytree(work / "base", root, symlinks=True)
    outside.mkdir()
    cwd.mkdir()
    (outside / "untouched.txt").write_text("a file beside the results directory\n")
    case.plant(root, outside)
    before = tree_digest(outside)
    watch = OpenWatch(outside)
    watch.start()
    try:
        argv = COMMANDS[command](root, here, case.flags.get(command, []))
        finished = run_measured(argv, cwd, ENV, timeout_s, here / "logs", KILL_RSS_MB)
        opened = watch.touched()
    finally:
        watch.close()
    changed = digest_changes(before, tree_digest(outside))
    outcome = judge(case, command, finished, timeout_s, changed + [f"{t} (inotify)" for t in opened])
    if outcome.ok:
        shutil.rmtree(here, ignore_errors=True)  # (the bombs and huge files go as soon as they are measured)
    return outcome


def planted_content(work: pathlib.Path, quick: bool) -> list[Outcome]:
    """Every case met by every command (``quick``: by its ``Case.quick`` command, two runs at a time), each on its own
    copy of a finished run; the outcomes in case order."""
    base = work / "base"
    (work / "base.gin").write_text(BASE_CONF)
    (work / "resume.gin").write_text(RESUME_CONF)
    proc = run(_module("alfish.bin.train") + ["--conf", str(work / "base.gin"), "--root_dir", str(base)], 180)
    if proc.returncode != 0 or not (base / NEWEST / "collector.pt").is_file() or not (base / "scalars.csv").is_file():
        raise RuntimeError(f"the base run failed (exit {proc.returncode}): {proc.stderr[-500:]}")
    pairs = [(case, command) for case in CASES for command in ([case.quick] if quick else COMMANDS)]

    def one(pair: tuple[Case, str]) -> Outcome:
        outcome = measure(*pair, work, QUICK_TIMEOUT_S if quick else TIMEOUT_S)
        print(f"[battery] malicious: {outcome.case} / {outcome.command}: {'PASS' if outcome.ok else 'FAIL'} "
              f"{outcome.why}", file=sys.stderr, flush=True)
        return outcome

    # (each run has its own folders, inotify watch and child to wait for; the full battery runs one at a time, so
    # that its wall times are not shared with another command)
    with concurrent.futures.ThreadPoolExecutor(QUICK_JOBS if quick else 1) as pool:
        return list(pool.map(one, pairs))


# ------------------------------------------------------------------------------------ the known payloads ----
class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


GIN_PAYLOADS = {
    "gin dynamic_registration -> os.system": (
        "from __gin__ import dynamic_registration\nimport alfish.rundir.checkpoint\n"
        "alfish.rundir.checkpoint.os.system.command = 'touch {marker}'\n"
        "alfish.config.trainer_config.TrainerConfig.random_seed = @alfish.rundir.checkpoint.os.system()\n"),
    "attribute chain to os.system": "alfish.rundir.checkpoint.os.system.command = 'touch {marker}'\n",
    "module:EnvId": "create_environment.env_name = 'evil_marker_module:Evil-v0'\n",
}


def play_payloads(work: pathlib.Path) -> list[str]:
    """The known code payloads played from copies of ``work/base``; returns the failures (empty: all refused)."""
    import torch

    failures = []
    marker = work / "pwned"
    (work / "evil_marker_module.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    for trial, (name, payload) in enumerate({"pickle payload in algorithm.pt": None, **GIN_PAYLOADS}.items()):
        root = work / f"payload{trial}"
        shutil.copytree(work / "base", root)
        ckpt = root / NEWEST
        if payload is None:
            torch.save({"model": _Payload(str(marker))}, ckpt / "algorithm.pt")
            reseal(ckpt, "algorithm.pt")
        else:
            meta = json.loads((ckpt / "meta.json").read_text())
            meta["operative_config"] = payload.format(marker=marker) + meta["operative_config"]
            (ckpt / "meta.json").write_text(json.dumps(meta))
            reseal(ckpt, "meta.json")
        proc = run(_module("alfish.bin.play") + ["--root_dir", str(root), "--num_episodes", "1"], cwd=work)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        # A payload in the newest checkpoint only: play may warn that it never unpickles it and play the older one.
        fell_back = payload is None and proc.returncode == 0 and "never unpickles those" in proc.stderr
        if not (fell_back or (proc.returncode == 2 and len(lines) == 1)) or marker.exists():
            failures.append(f"{name}: exit {proc.returncode}, {len(lines)} stderr lines, marker "
                            f"{'WRITTEN' if marker.exists() else 'absent'}: {lines[-1][:200] if lines else ''}")
            marker.unlink(missing_ok=True)
    return failures


def malicious_inputs(work: pathlib.Path, args) -> Row:
    """The scenario: the planted-content matrix, then the known payloads; one row, and the per-case table."""
    quick = bool(getattr(args, "quick", False))
    outcomes = planted_content(work, quick)
    payload_failures = play_payloads(work)
    failed = [o for o in outcomes if not o.ok]
    figure = (f"{len(outcomes)} planted-content runs ({len(CASES)} cases x {'the first' if quick else 'every'} "
              f"command): {len(outcomes) - len(failed)} PASS, {len(failed)} FAIL"
              + (f" (first: {failed[0].case} / {failed[0].command}: {failed[0].why})" if failed else "")
              + "; 4 code payloads (play): "
              + ("; ".join(payload_failures) if payload_failures else "refused, marker never written")
              + f"; pass rule: no hang ({QUICK_TIMEOUT_S if quick else TIMEOUT_S:.0f} s), exit 0 or a one-line "
              f"refusal (exit 1/2, no traceback), peak RSS <= {MAX_RSS_MB} MB, nothing outside changed or opened")
    details = "\n".join(DETAIL_HEADER + [o.row() for o in outcomes])
    return Row("malicious results directories (every reader)", len(outcomes) + 4, not failed and not payload_failures,
               figure, details)
