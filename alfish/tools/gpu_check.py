"""Check alfish's GPU path on this machine in one command, within 9 minutes, and write one report.

    python -m alfish.tools.gpu_check [--device cuda] [--report DIR_OR_MD] [--only NAME ...] [--skip NAME ...]
                                     [--budget_s 540]

Runs, in this order, each in a process of its own with its own timeout (a crash or a hang costs that check, never
the report):

  cuda_tests     ALFISH_TEST_DEVICE=<device> python -m pytest -q -n 4 tests/gpu (the default tier, less the two below)
  no_recompile   tests/gpu/test_no_recompile.py: every algorithm's 'reduce-overhead' update never recompiles
  device_replay  tests/gpu/test_device_replay.py: device replay with frame stacking, hindsight and offline mixing
  torchrun_gloo  2 torchrun ranks sharing the device through gloo train confs/sac_pendulum.gin
  amp_fp16       SAC trains with AMP fp16 (SKIP on the CPU: fp16 autocast needs CUDA)
  amp_bf16       SAC trains with AMP bf16
  bench          tools/bench/bench_gpu.py --quick (SKIP where it cannot run here, e.g. without MuJoCo)

and writes ``gpu_check.md`` (a Markdown table: PASS / FAIL / TIMEOUT / SKIP per check, wall times, the last lines
of each failing check, the machine, the benchmark's figures beside LeanRL's published H100 figures) and
``gpu_check.json`` into ``--report`` (a folder, default the working directory, or a ``.md`` path), rewritten after
every check. ``--device cpu`` runs every check at its smallest size on the CPU (the tool's own test).

Needs the repository checkout (tests/, confs/, tools/bench/) that holds this alfish package. Exit status: 0 when no
check failed or timed out; 1 when one did; 2 for bad arguments, no checkout or no CUDA device for ``--device cuda``.
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

from alfish.tools import gpu_check_report as report_file
from alfish.tools.cli import ToolError, report
from alfish.tools.gpu_check_checks import NAMES, Check, all_checks
from alfish.tools.gpu_check_report import FAIL, FAILED, PASS, SKIP, TIMEOUT, Result

DEFAULT_BUDGET_S = 540.0  # 9 minutes, the whole run (a GPU lease here: 15 minutes, a command at most 10)
MIN_CHECK_S = 5.0  # a check left less than this by the budget is not started
TAIL_LINES = 40
KILL_GRACE_S = 5.0
PYTEST_SUMMARY = r"\d+ passed[^\n]*"
CHECKOUT_FILES = ("tests/gpu", "confs/sac_pendulum.gin", "tools/bench/bench_gpu.py")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
            raise ToolError(f"--device {args.device}: use 'cuda', 'cuda:N' or 'cpu'")
        repo = checkout(args.repo)
        names = selected(args.only, args.skip)
        path_md = report_path(args.report)
    except ToolError as err:
        return report(err)
    machine = report_file.machine_info(repo)  # a probe that failed is reported; the checks then say what is wrong
    if args.device.startswith("cuda") and machine.get("GPU") == report_file.NO_GPU:
        return report(ToolError(f"--device {args.device} but no CUDA device is visible (torch "
                                f"{machine.get('torch', '?')}, CUDA build: {machine.get('CUDA (torch build)', '?')}); "
                                "on a machine without one, --device cpu checks the code paths"))

    def write(results: list[Result], run: dict) -> None:
        report_file.write(path_md, machine, results, dict(run, device=args.device, budget_s=args.budget_s))

    with tempfile.TemporaryDirectory(prefix="gpu_check-") as work:
        checks = [c for c in all_checks(args.device, pathlib.Path(work), path_md.parent) if c.name in names]
        results = run_all(checks, repo, args.budget_s, write)
    print(f"report: {path_md}")
    return 1 if any(r.status in FAILED for r in results) else 0


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m alfish.tools.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="'cuda' (default), 'cuda:N' or 'cpu' (smallest sizes)")
    parser.add_argument("--report", default=".", help="folder for gpu_check.md/.json, or the .md path (default: .)")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME", help=f"run these checks only: {NAMES}")
    parser.add_argument("--skip", nargs="+", default=(), metavar="NAME", help="leave these checks out")
    parser.add_argument("--budget_s", type=float, default=DEFAULT_BUDGET_S,
                        help="the whole run's time limit in seconds; each check gets its timeout or what is left")
    parser.add_argument("--repo", default=None, help="the checkout (default: the one holding this alfish package)")
    return parser.parse_args(argv)


def checkout(repo: Optional[str]) -> pathlib.Path:
    """The repository checkout the checks run in (``repo``, or the one this alfish package belongs to)."""
    root = pathlib.Path(repo) if repo else pathlib.Path(__file__).resolve().parents[2]
    missing = [name for name in CHECKOUT_FILES if not (root / name).exists()]
    if missing:
        raise ToolError(f"gpu_check needs the alfish repository checkout, and {root} has no {', '.join(missing)}: "
                        "run it from a git clone installed with pip install -e . (or pass --repo CHECKOUT)")
    return root


def selected(only: Optional[Sequence[str]], skip: Sequence[str]) -> list[str]:
    unknown = [name for name in [*(only or ()), *skip] if name not in NAMES]
    if unknown:
        raise ToolError(f"no check named {', '.join(unknown)}; the checks are {', '.join(NAMES)}")
    return [name for name in NAMES if (only is None or name in only) and name not in skip]


def report_path(report_arg: str) -> pathlib.Path:
    """``gpu_check.md`` in the folder ``report_arg`` (made if needed), or ``report_arg`` itself when it ends in .md."""
    path = pathlib.Path(report_arg)
    if path.suffix != ".md":
        path = path / "gpu_check.md"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ToolError(f"--report {report_arg}: cannot make {path.parent} ({err.strerror})") from None
    return path.resolve()


# ----------------------------------------------------------------------------------------------- the runner ---

def run_all(checks: Sequence[Check], repo: pathlib.Path, budget_s: float,
            write: Callable[[list[Result], dict], None]) -> list[Result]:
    """Run ``checks`` in order within ``budget_s`` seconds; ``write(results, run)`` after each (the report)."""
    start, started = time.monotonic(), datetime.datetime.now().isoformat(timespec="seconds")
    results: list[Result] = []
    for i, check in enumerate(checks, 1):
        left = budget_s - (time.monotonic() - start)
        print(f"[{i}/{len(checks)}] {check.name}: {check.what} ...", flush=True)
        result = run_check(check, repo, min(check.timeout_s, left)) if left >= MIN_CHECK_S else Result(
            check.name, check.what, FAIL, detail=f"not run: the budget of {budget_s:.0f} s was spent")
        results.append(result)
        print(f"    {result.status} ({result.wall_s:.1f} s){': ' + result.detail if result.detail else ''}",
              flush=True)
        write(results, dict(started=started, wall_s=time.monotonic() - start, finished=i == len(checks)))
    return results


def run_check(check: Check, repo: pathlib.Path, timeout_s: float) -> Result:
    """Run one check in a session of its own (so a timeout ends its whole process tree) and judge it."""
    command = shlex.join(f"{k}={v}" for k, v in check.env.items()) + " " * bool(check.env) + shlex.join(check.argv)
    result = Result(check.name, check.what, SKIP, command=command, figures=check.figures)
    if check.skip:
        result.detail = check.skip
        return result
    missing = [path for path in check.needs if not (repo / path).exists()]
    if missing:
        result.status, result.detail = FAIL, f"missing: {', '.join(missing)}"
        return result
    pythonpath = os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONUNBUFFERED="1", **check.env)
    start = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(check.argv, cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: Optional[int] = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        end_session(proc)
        result.wall_s = time.monotonic() - start
        out.seek(0)
        text = out.read().decode(errors="replace")
    result.tail = "\n".join(text.splitlines()[-TAIL_LINES:])
    result.status, result.detail = judge(check, code, text, timeout_s)
    return result


def judge(check: Check, code: Optional[int], text: str, timeout_s: float) -> tuple[str, str]:
    """``(status, detail)`` of a check that exited with ``code`` (None: stopped at ``timeout_s``) printing ``text``."""
    last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "no output")
    if code is None:
        return TIMEOUT, f"still running after {timeout_s:.0f} s (stopped); last line: {last}"
    if code == check.unavailable_exit:
        return SKIP, f"cannot run here: {last}"
    if code != 0:
        return FAIL, f"exit {code}: {last}"
    if check.expect and not re.search(check.expect, text):
        return FAIL, f"exit 0 but its output lacks /{check.expect}/ (nothing ran?): {last}"
    summary = re.findall(PYTEST_SUMMARY, text)
    return PASS, summary[-1] if summary else ""


def end_session(proc: subprocess.Popen) -> None:
    """Stop what is left of the check's session (its process group: all of it after a timeout, stragglers such as
    torchrun's ranks after an exit): SIGTERM, then SIGKILL to whatever is still there after ``KILL_GRACE_S``."""
    if not signal_session(proc, signal.SIGTERM):
        return
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None and not signal_session(proc, 0):  # the leader reaped and nobody left
            return
        time.sleep(0.05)
    signal_session(proc, signal.SIGKILL)
    proc.wait()


def signal_session(proc: subprocess.Popen, sig: int) -> bool:
    """Send ``sig`` to ``proc``'s process group (0: only ask whether it still exists); False when it is gone."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
