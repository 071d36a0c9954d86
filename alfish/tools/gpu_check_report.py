"""The report of ``alfish.tools.gpu_check``: the machine, one row per check (status, wall time, what it shows), the
last lines of each failing check, and the benchmark's figures beside LeanRL's published H100 figures. Written as
``gpu_check.md`` (for people) and ``gpu_check.json`` (for tools), after every check, so a run stopped part-way still
leaves what it did.

``python -m alfish.tools.gpu_check_report`` prints the machine as JSON (run by the tool in a process of its own: the
tool itself never initializes CUDA, so a broken driver cannot take the report down with it).
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import platform
import subprocess
import sys
from typing import Any, Optional

PASS, FAIL, SKIP, TIMEOUT = "PASS", "FAIL", "SKIP", "TIMEOUT"
FAILED = (FAIL, TIMEOUT)
NO_GPU = "none visible"


@dataclasses.dataclass
class Result:
    """What one check gave: ``status`` (PASS, FAIL, SKIP or TIMEOUT), its wall time (s), a one-line ``detail`` (why
    it failed or skipped), the command, the last lines of its output (kept for a failure) and its figures file."""

    name: str
    what: str
    status: str
    wall_s: float = 0.0
    detail: str = ""
    command: str = ""
    tail: str = ""
    figures: Optional[str] = None


def write(path_md: pathlib.Path, machine: dict, results: list[Result], run: dict) -> None:
    """``path_md`` and the JSON beside it (``.json``), each written whole to a temporary file and renamed."""
    bench = read_figures(results)
    doc = dict(run=run, machine=machine, checks=[dataclasses.asdict(r) for r in results], bench=bench)
    _replace(path_md.with_suffix(".json"), json.dumps(doc, indent=1))
    _replace(path_md, markdown(machine, results, run, bench))


def _replace(path: pathlib.Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_figures(results: list[Result]) -> Optional[dict]:
    """The benchmark's ``--json`` document, if a check wrote one (it is rewritten after each table: a benchmark
    stopped part-way still gives the tables it finished)."""
    for result in results:
        if result.figures and os.path.isfile(result.figures):
            try:
                with open(result.figures) as f:
                    return json.load(f)
            except (OSError, ValueError):  # half-written by a killed run: no figures rather than no report
                return None
    return None


def markdown(machine: dict, results: list[Result], run: dict, bench: Optional[dict]) -> str:
    counts = {s: sum(r.status == s for r in results) for s in (PASS, FAIL, TIMEOUT, SKIP)}
    lines = [f"# alfish gpu_check on {run['device']}", "",
             f"{run['started']}; {run['wall_s']:.0f} s of a {run['budget_s']:.0f} s budget; "
             + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + ("" if run["finished"] else " (running)"), "",
             "## Machine", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {_cell(value)} |" for key, value in machine.items()]
    lines += ["", "## Checks", "", "| # | check | status | wall s | what | detail |", "|---|---|---|---|---|---|"]
    lines += [f"| {i} | {r.name} | **{r.status}** | {r.wall_s:.1f} | {_cell(r.what)} | {_cell(r.detail)} |"
              for i, r in enumerate(results, 1)]
    for r in (r for r in results if r.status in FAILED):
        lines += ["", f"### {r.name}: {r.status}", "", _cell(r.detail), "", f"`{r.command}`"]
        if r.tail.strip():
            lines += ["", "```", r.tail.rstrip(), "```"]
    if bench is not None:
        lines += ["", *bench_markdown(bench)]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    return " ".join(str(value).split()).replace("|", "\\|")


def bench_markdown(bench: dict) -> list[str]:
    """The benchmark's medians: env steps/s per algorithm and variant beside LeanRL's H100 figure, and the
    updates/s of the 3x1024 SAC update."""
    machine = bench.get("machine", {})
    on_gpu = str(machine.get("device_arg", "")).startswith("cuda")
    note = "" if on_gpu else " -- CPU numbers, NOT GPU figures"
    lines = [f"## Benchmark (tools/bench/bench_gpu.py{' --quick' if machine.get('quick') else ''}{note})", "",
             f"{machine.get('device', '?')}; torch {machine.get('torch', '?')}"
             + ("" if bench.get("complete") else "; INCOMPLETE: the benchmark stopped before its last table"), "",
             "| algorithm | variant | env steps/s | LeanRL H100 | vs LeanRL |", "|---|---|---|---|---|"]
    leanrl = bench.get("leanrl_h100", {})
    for algo, table in bench.get("results", {}).get("env_steps", {}).items():
        for variant, entry in table.items():
            median, reference = entry.get("median"), leanrl.get(algo)
            versus = f"{median / reference:.2f}x" if median and reference else "-"
            lines.append(f"| {algo} | {variant} | {_figure(entry)} | {reference or '-'} | {versus} |")
    updates = bench.get("results", {}).get("updates", {})
    if updates:
        lines += ["", "| SAC 3x1024 update | updates/s |", "|---|---|"]
        lines += [f"| {variant} | {_figure(entry, 1)} |" for variant, entry in updates.items()]
    return lines


def _figure(entry: dict, digits: int = 0) -> str:
    if entry.get("median") is not None:
        return f"{entry['median']:.{digits}f}"
    if "skipped" in entry:
        return f"n/a ({_cell(entry['skipped'])})"
    return f"FAILED: {_cell(entry.get('error', 'no result'))}"


# ------------------------------------------------------------------------------------------------ the machine ---

def machine_info(repo: pathlib.Path, timeout_s: float = 60.0) -> dict:
    """The machine, from a process of its own (``python -m alfish.tools.gpu_check_report``) plus the checkout's git
    commit; what cannot be read is said in the value."""
    info: dict[str, Any]
    try:
        out = subprocess.run([sys.executable, "-m", "alfish.tools.gpu_check_report"], cwd=repo, capture_output=True,
                             text=True, timeout=timeout_s, env=dict(os.environ, PYTHONPATH=str(repo)))
        info = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {
            "probe": f"failed (exit {out.returncode}): {_last_line(out.stderr)}"}
    except subprocess.TimeoutExpired:
        info = {"probe": f"hung for {timeout_s:.0f} s (a driver problem?)"}
    info["alfish commit"] = _command(["git", "describe", "--always", "--dirty"], repo)
    return info


def _command(argv: list[str], cwd: Optional[pathlib.Path] = None) -> str:
    """``argv``'s first output line, or why there is none."""
    try:
        out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unknown ({type(err).__name__})"
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def probe() -> dict:
    """This process's view of the machine: GPU(s), driver, torch, CUDA, cuDNN, Python, CPU count."""
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "CUDA (torch build)": torch.version.cuda or "none (CPU build)",
                            "python": platform.python_version(), "platform": platform.platform(),
                            "CPU cores": os.cpu_count()}
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        info["GPU"] = "; ".join(f"{p.name} ({p.total_memory / 2 ** 30:.0f} GiB, sm_{p.major}{p.minor})" for p in gpus)
        info["cuDNN"] = torch.backends.cudnn.version()
        info["driver"] = _command(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    else:
        info["GPU"] = NO_GPU
    return info


if __name__ == "__main__":
    print(json.dumps(probe()))
