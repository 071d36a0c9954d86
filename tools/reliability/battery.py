"""The reliability battery: each scenario drives real ``python -m alfish.bin.train`` / ``play`` / ``torchrun``
subprocesses on tiny confs, checks what a user would see, and returns one row of a markdown table
``| scenario | trials | result | figure |``. Exit status 1 if any row fails.

    python tools/reliability/battery.py [--only NAME ...] [--kills 200] [--soak_s 600] [--quick]

``--quick`` (3 kills, a 30 s soak, 2 damages, each malicious case met by one command, no 2-rank jobs) is sized for
5 minutes on 2 idle cores (the measured figures are in tools/reliability/README.md); the full battery about an hour.

Each scenario catches its own exceptions (a crash is a FAIL row), every wait has a timeout, each subprocess runs in
its own session and is killed with its group when the scenario ends, and temporary directories are removed.
"""
from __future__ import annotations

import argparse
import pathlib
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from typing import Callable

# Importable as a script and from tests (where `tools` may name tests/tools): its siblings by folder, alfish by repo.
sys.path[:0] = [str(pathlib.Path(__file__).resolve().parent), str(pathlib.Path(__file__).resolve().parents[2])]

import children as children_scenarios  # noqa: E402
import malicious  # noqa: E402
from harness import (  # noqa: E402
    A2C_CHAIN,
    A2C_SLOW,
    Row,
    problem_lines,
    run,
    train,
    train_to_end,
    wait_for,
)

from alfish.rundir.checkpoint import Checkpointer  # noqa: E402


def _newest(root: pathlib.Path) -> int:
    steps = Checkpointer(str(root / "checkpoints")).steps()
    return steps[-1] if steps else 0


# ------------------------------------------------------------------------------------------- 1. kill -9 ----
KILL_RULE = ("pass rule: each restart resumes from the newest checkpoint whose manifest was complete when the run was "
             "killed (the newest ckpt-N listed: a checkpoint is renamed into place only after its manifest), and that "
             "checkpoint loads; an unloadable one, a resume from another checkpoint, or a failed start fails the test")


def _newest_complete(root: pathlib.Path) -> int:
    """The newest checkpoint with a manifest (0: none): what the next start must resume from."""
    steps = [s for s in Checkpointer(str(root / "checkpoints")).steps()
             if (root / "checkpoints" / f"ckpt-{s}" / "manifest.json").is_file()]
    return steps[-1] if steps else 0


def kill_during_checkpoints(work: pathlib.Path, args) -> Row:
    """One run, checkpointing every iteration, SIGKILLed ``--kills`` times at a seeded random moment after it wrote
    a checkpoint; after each kill the newest complete checkpoint must load, and the next start must resume from it
    (``KILL_RULE``)."""
    conf = work / "kill.gin"
    conf.write_text(A2C_SLOW.replace("TrainerConfig.num_checkpoints = 0", "TrainerConfig.num_checkpoints = 100000"))
    root, rng = work / "root", random.Random(0)
    unloadable = other = 0
    expected = 0  # the checkpoint the next start must resume from (0: a fresh start)
    failures: list[str] = []  # one per failed start or wrong resume: which kill, why, and the run's last log line
    for i in range(args.kills):
        before = _newest(root)
        proc = train(conf, root, work / f"kill-{i}.log")
        why = ""
        try:
            if not wait_for(lambda b=before, p=proc: _newest(root) > b or p.popen.poll() is not None, 90):
                why = "no new checkpoint within 90 s"
            elif proc.popen.poll() is not None:
                why = f"exited {proc.popen.returncode} before a new checkpoint"
            else:
                time.sleep(rng.uniform(0.0, 0.6))
        finally:
            proc.kill_group()
        text = proc.text()
        resumed = re.search(r"resumed from \S+/ckpt-(\d+)", text)
        if not why and expected and not resumed:
            why = f"did not resume (expected ckpt-{expected})"
        elif not why and resumed and int(resumed.group(1)) != expected:
            other += 1
            why = f"resumed from ckpt-{resumed.group(1)}, the newest complete was ckpt-{expected}"
        if why:
            last = next((line for line in reversed(text.splitlines()) if line.strip()), "")
            failures.append(f"kill {i}: {why} ({last[-160:]!r})")
        expected = _newest_complete(root)
        try:
            if expected:
                Checkpointer(str(root / "checkpoints")).load(expected)
        except Exception:  # noqa: BLE001  (any failure to load is what we count)
            unloadable += 1
            failures.append(f"kill {i}: ckpt-{expected} (newest complete) does not load")
    return Row("kill -9 during checkpoint writes", args.kills, not failures,
               f"{args.kills} kills, {unloadable} unloadable newest checkpoints, {other} resumes from another "
               f"checkpoint, {len(failures)} failures{': first ' + failures[0] if failures else ''}; newest "
               f"checkpoint step {_newest(root)}; {KILL_RULE}")


# ------------------------------------------------------------------------------------ 2. damaged files ----
def _flip(path: pathlib.Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGES: dict[str, Callable[[pathlib.Path], None]] = {
    "flipped byte": lambda c: _flip(c / "algorithm.pt"),
    "truncated .pt": lambda c: (c / "learner.pt").write_bytes((c / "learner.pt").read_bytes()[:100]),
    "deleted .pt": lambda c: (c / "algorithm.pt").unlink(),
    "deleted manifest": lambda c: (c / "manifest.json").unlink(),
}


def _base_run(work: pathlib.Path) -> pathlib.Path:
    """A finished 3-iteration run (checkpoints 1, 2, 3) that scenarios copy and damage."""
    conf = work / "a2c.gin"
    conf.write_text(A2C_CHAIN)
    proc = train_to_end(conf, work / "base")
    if proc.returncode != 0 or Checkpointer(str(work / "base" / "checkpoints")).steps() != [1, 2, 3]:
        raise RuntimeError(f"the base run failed (exit {proc.returncode}): {proc.stderr[-500:]}")
    return conf


QUICK_DAMAGES = ("flipped byte", "deleted manifest")  # --quick: one damaged tensor file, one missing manifest


def damaged_checkpoints(work: pathlib.Path, args) -> Row:
    conf, failures, trials = _base_run(work), [], 0
    damages = {k: v for k, v in DAMAGES.items() if not getattr(args, "quick", False) or k in QUICK_DAMAGES}
    for name, damage in damages.items():
        trials += 1
        root = work / name.replace(" ", "_")
        shutil.copytree(work / "base", root)
        damage(root / "checkpoints" / "ckpt-3")
        proc = train_to_end(conf, root)
        aside = list(root.glob("checkpoints.damaged-*"))
        if proc.returncode != 0 or "resumed from" not in proc.stderr or "/ckpt-2: iteration 2" not in proc.stderr \
                or len(aside) != 1 or not (aside[0] / "ckpt-3").is_dir():
            failures.append(f"{name}: exit {proc.returncode}, moved aside {[p.name for p in aside]}")
    trials += 2
    root = work / "all_damaged"
    shutil.copytree(work / "base", root)
    for step in (1, 2, 3):
        _flip(root / "checkpoints" / f"ckpt-{step}" / "algorithm.pt")
    refused = train_to_end(conf, root)
    errors = [line for line in problem_lines(refused.stderr) if " WARNING " not in line]
    if refused.returncode != 2 or len(errors) != 1 or "--fresh" not in errors[0]:
        failures.append(f"all damaged: exit {refused.returncode}, error lines {errors[:3]}")
    fresh = train_to_end(conf, root, "--fresh")
    aside = list(root.glob("before-fresh-*"))
    if fresh.returncode != 0 or len(aside) != 1 or len(list((aside[0] / "checkpoints").iterdir())) != 3 \
            or _newest(root) != 3:
        failures.append(f"--fresh: exit {fresh.returncode}, set aside {[p.name for p in aside]}")
    figure = (f"{len(damages)} damages of the newest ({', '.join(damages)}): resumed from ckpt-2, damaged moved "
              f"aside; all damaged: exit {refused.returncode}, {len(errors)} error line; --fresh: exit "
              f"{fresh.returncode}, 3 moved aside")
    return Row("corrupt / truncated / deleted checkpoint files", trials, not failures,
               "; ".join(failures) if failures else figure)


# ------------------------------------------------------------------------------------------------ 4. NaN ----
def non_finite_loss(work: pathlib.Path, args) -> Row:
    import torch

    conf = work / "nan.gin"
    conf.write_text(A2C_CHAIN.replace("TrainerConfig.num_iterations = 3", "TrainerConfig.num_iterations = 50")
                    .replace("TrainerConfig.num_checkpoints = 3", "TrainerConfig.num_checkpoints = 50")
                    + "A2cAlgorithm.lr = 1e30\n")
    proc = train_to_end(conf, work / "root")
    match = re.search(r"NonFiniteLossError: loss is (nan|inf) at update (\d+); non-finite loss terms: ([^;]+);",
                      proc.stderr)
    ck = Checkpointer(str(work / "root" / "checkpoints"))
    finite = True
    for step in ck.steps():
        tensors = ck.load(step).tensors
        stack = [tensors]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, (list, tuple)):
                stack.extend(item)
            elif isinstance(item, torch.Tensor) and item.is_floating_point() and not torch.isfinite(item).all():
                finite = False
    after = [s for s in ck.steps() if match and s > int(match.group(2))]
    error_lines = [line for line in proc.stderr.splitlines() if " ERROR " in line or line.startswith("Traceback")]
    ok = proc.returncode == 1 and bool(match) and finite and not after and "Traceback" not in proc.stderr
    figure = (f"exit {proc.returncode}; '{match.group(0)[:-1]}'" if match else f"exit {proc.returncode}, no "
              f"NonFiniteLossError line: {proc.stderr[-200:]!r}")
    return Row("NaN / inf loss (A2C lr=1e30)", 1, ok,
               f"{figure}; checkpoints {ck.steps()} all finite={finite}, none after the bad update; "
               f"{len(error_lines)} error line(s), no traceback={'Traceback' not in proc.stderr}")


# ---------------------------------------------------------------------------------------------- 6. disk full ----
def disk_full(work: pathlib.Path, args) -> Row:
    if shutil.which("unshare") is None or run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs "
                                               f"{work}"], 10).returncode != 0:
        return Row("disk full (real tmpfs)", 0, None, "skipped (no tmpfs: `unshare -rm` + mount not permitted)")
    conf, mnt, out = work / "disk.gin", work / "mnt", work / "out"
    conf.write_text(A2C_CHAIN.replace("(8,)", "(64, 64)").replace("alfish/Chain-v0", "CartPole-v1"))
    mnt.mkdir()
    cmd = (f"mount -t tmpfs -o size=400k tmpfs {mnt} && {sys.executable} -m alfish.bin.train --conf {conf} "
           f"--root_dir {mnt}/run; rc=$?; cp -a {mnt}/run {out}; exit $rc")
    proc = run(["unshare", "-rm", "sh", "-c", cmd], 120)
    lines = problem_lines(proc.stderr)
    steps = Checkpointer(str(out / "checkpoints")).steps() if out.exists() else []
    intact = bool(steps) and Checkpointer(str(out / "checkpoints")).load(steps[-1]).meta["iteration"] == steps[-1]
    ok = proc.returncode == 1 and 1 <= len(lines) <= 3 and "ENOSPC" in proc.stderr and intact \
        and "Traceback" not in proc.stderr
    return Row("disk full (real 400 KB tmpfs)", 1, ok,
               f"exit {proc.returncode}, {len(lines)} stderr line(s) "
               f"({'ENOSPC named' if 'ENOSPC' in proc.stderr else 'no ENOSPC'}), last checkpoint "
               f"ckpt-{steps[-1] if steps else None} "
               f"{'intact' if intact else 'NOT intact'}")


# ----------------------------------------------------------------------------------------------- 7. signals ----
def signals(work: pathlib.Path, args) -> Row:
    conf, root = work / "sig.gin", work / "root"
    conf.write_text(A2C_SLOW)
    proc = train(conf, root, work / "sig.log")
    problems = []
    try:
        if not wait_for(lambda: "iteration" in proc.text() and (root / "tb").exists(), 90):
            raise RuntimeError(f"the run did not start: {proc.text()[-300:]}")
        time.sleep(1.0)
        proc.popen.send_signal(signal.SIGUSR2)
        if not wait_for(lambda: _newest(root) > 0, 30):
            problems.append("SIGUSR2 wrote no checkpoint")
        usr2_step = _newest(root)
        time.sleep(1.0)
        if proc.popen.poll() is not None:
            problems.append(f"SIGUSR2 stopped the run (exit {proc.popen.returncode})")
        proc.popen.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        term_step = _newest(root)
        if rc != 128 + signal.SIGTERM or term_step <= usr2_step:
            problems.append(f"SIGTERM: exit {rc}, checkpoint {term_step} (after SIGUSR2's {usr2_step})")
    finally:
        proc.kill_group()
    resumed = train(conf, root, work / "resume.log")
    try:
        ok_resume = wait_for(lambda: f"ckpt-{term_step}: iteration {term_step}," in resumed.text(), 90)
    finally:
        resumed.kill_group()
    if not ok_resume:
        problems.append(f"the resume did not continue from iteration {term_step}: {resumed.text()[-300:]}")
    return Row("signals (SIGUSR2, SIGTERM, resume)", 3, not problems, "; ".join(problems) or
               f"SIGUSR2: checkpoint at iteration {usr2_step}, run went on; SIGTERM: checkpoint at iteration "
               f"{term_step}, exit 143; resume continued from iteration {term_step}")


SCENARIOS: dict[str, Callable] = {
    "kill9": kill_during_checkpoints,
    "damaged": damaged_checkpoints,
    "malicious": malicious.malicious_inputs,
    "nan": non_finite_loss,
    "async_child": children_scenarios.async_unroll_child,
    "env_worker": children_scenarios.env_workers,
    "ranks": children_scenarios.ranks,
    "disk_full": disk_full,
    "signals": signals,
    "soak": children_scenarios.soak,
}
SLOW = {"ranks"}  # --quick skips these


def run_scenario(name: str, args) -> Row:
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"battery-{name}-"))
    start = time.monotonic()
    try:
        row = SCENARIOS[name](work, args)
    except Exception as e:  # noqa: BLE001  (one scenario's crash is its FAIL row, the battery goes on)
        traceback.print_exc()
        row = Row(name, 0, False, f"the scenario crashed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"[battery] {name}: {row.result} in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return row


def table(rows: list[Row]) -> str:
    lines = ["| scenario | trials | result | figure |", "|---|---|---|---|"]
    lines += [f"| {r.scenario} | {r.trials} | {r.result} | {r.figure.replace('|', '/')} |" for r in rows]
    return "\n".join(lines)


# (full, --quick): --quick finishes within 5 minutes on 2 idle cores (measured figures in README.md)
KILLS, SOAK_S = (200, 3), (600.0, 30.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), default=None)
    parser.add_argument("--kills", type=int, default=None, help=f"default {KILLS[0]}, --quick {KILLS[1]}")
    parser.add_argument("--soak_s", type=float, default=None, help=f"default {SOAK_S[0]:.0f}, --quick {SOAK_S[1]:.0f}")
    parser.add_argument("--quick", action="store_true",
                        help=f"{KILLS[1]} kills, a {SOAK_S[1]:.0f} s soak, 2 of the damages, each malicious case met "
                             "by one command; skips the 2-rank jobs (~1 min each)")
    args = parser.parse_args(argv)
    args.kills = KILLS[args.quick] if args.kills is None else args.kills
    args.soak_s = SOAK_S[args.quick] if args.soak_s is None else args.soak_s
    names = args.only or [n for n in SCENARIOS if not (args.quick and n in SLOW)]
    rows = [run_scenario(name, args) for name in names]
    print(table(rows))
    for row in rows:
        if row.details:
            print(f"\n{row.scenario}:\n{row.details}")
    return 0 if all(r.ok is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
