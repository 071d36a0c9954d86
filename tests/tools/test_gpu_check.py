"""``python -m alfish.tools.gpu_check``: each check in a process of its own, judged PASS / FAIL / TIMEOUT / SKIP; a
failing, crashing, hanging or missing check is reported (with its last lines) while the others still run, and the
exit status is 1; the report has one row per check, the machine and the benchmark's figures beside LeanRL's.

The default tier runs the command with the real checks that take no time on the CPU and one pointed at a missing
file, and the whole CPU pass (every check at its smallest size, ~40 s here: the issue's acceptance is that
``gpu_check --device cpu`` passes in CI)."""
import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch

from alfish.tools import gpu_check
from alfish.tools.gpu_check_checks import NAMES, Check
from alfish.tools.gpu_check_report import FAIL, PASS, SKIP, TIMEOUT, Result, markdown

REPO = pathlib.Path(__file__).resolve().parents[2]


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def read_report(folder: pathlib.Path) -> tuple[str, dict]:
    return (folder / "gpu_check.md").read_text(), json.loads((folder / "gpu_check.json").read_text())


def test_failing_crashing_hanging_and_missing_checks_are_reported_and_the_others_still_run(tmp_path):
    checks = [
        Check("first", "passes", python("print('3 passed in 0.1s')"), 30, expect=r"passed"),
        Check("fails", "exits 3", python("import sys; print('line one'); print('the cause'); sys.exit(3)"), 30),
        Check("crashes", "is killed", python("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"), 30),
        Check("hangs", "sleeps", python("import time; print('waiting', flush=True); time.sleep(60)"), 1),
        Check("missing", "runs a test file that is not there", python("pass"), 30, needs=("tests/gpu/nope.py",)),
        Check("silent", "passes without running a test", python("print('5 skipped')"), 30, expect=r"[1-9] passed"),
        Check("unavailable", "says it cannot run here", python("import sys; sys.exit('no MuJoCo')"), 30,
              unavailable_exit=1),
        Check("last", "still runs", python("print('ok')"), 30, env={"GPU_CHECK_TEST": "1"}),
    ]
    report = tmp_path / "gpu_check.md"
    written = []
    start = time.monotonic()
    results = gpu_check.run_all(checks, REPO, 60.0, lambda results, run: written.append(len(results)))
    assert time.monotonic() - start < 15  # the hang cost its 1 s timeout (+ the kill), not 60 s
    assert [r.status for r in results] == [PASS, FAIL, FAIL, TIMEOUT, FAIL, FAIL, SKIP, PASS]
    by_name = {r.name: r for r in results}
    assert by_name["fails"].detail == "exit 3: the cause" and "line one\nthe cause" in by_name["fails"].tail
    assert by_name["crashes"].detail.startswith("exit -11")
    assert by_name["hangs"].detail.startswith("still running after 1 s") and "waiting" in by_name["hangs"].tail
    assert by_name["missing"].detail == "missing: tests/gpu/nope.py"
    assert "lacks /[1-9] passed/" in by_name["silent"].detail
    assert by_name["unavailable"].detail == "cannot run here: no MuJoCo"
    assert by_name["first"].detail == "3 passed in 0.1s" and by_name["last"].command.startswith("GPU_CHECK_TEST=1 ")
    assert written == list(range(1, len(checks) + 1))  # the report is rewritten after every check

    gpu_check.report_file.write(report, {"GPU": "test"}, results, dict(started="now", wall_s=3.0, finished=True,
                                                                         device="cpu", budget_s=60.0))
    text, doc = read_report(tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "**" in line]
    assert [row.split("|")[2].strip() for row in rows] == [c.name for c in checks]
    assert "| 4 | hangs | **TIMEOUT** |" in text and "```\nline one\nthe cause\n```" in text
    assert [c["status"] for c in doc["checks"]] == [r.status for r in results]


def test_a_check_past_the_budget_is_not_started_and_fails():
    checks = [Check("slow", "uses the budget", python("import time; time.sleep(1)"), 30),
              Check("next", "never starts", python("pass"), 30)]
    results = gpu_check.run_all(checks, REPO, gpu_check.MIN_CHECK_S + 0.5, lambda results, run: None)
    assert [r.status for r in results] == [PASS, FAIL]
    assert results[1].detail == f"not run: the budget of {gpu_check.MIN_CHECK_S + 0.5:.0f} s was spent"


def test_the_bench_figures_stand_beside_leanrls(tmp_path):
    bench = dict(machine=dict(device="NVIDIA H100 (cuda)", device_arg="cuda", torch="2.13", quick=True),
                 complete=False, leanrl_h100={"sac": 725, "td3": 936, "ppo": 1774},
                 results=dict(env_steps=dict(sac=dict(fp32=dict(runs=[1450.0], median=1450.0),
                                                      tf32=dict(runs=[], error="exit 1: boom")),
                                             ppo=dict(fp16=dict(runs=[], skipped="fp16 needs CUDA"))),
                              updates=dict(bf16=dict(runs=[812.5], median=812.5))))
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    results = [Result("bench", "bench_gpu --quick", PASS, 1.0, figures=str(tmp_path / "bench.json"))]
    text = markdown({}, results, dict(started="now", wall_s=1.0, finished=True, device="cuda", budget_s=480),
                    gpu_check.report_file.read_figures(results))
    assert "| sac | fp32 | 1450 | 725 | 2.00x |" in text
    assert "| sac | tf32 | FAILED: exit 1: boom | 725 | - |" in text
    assert "| ppo | fp16 | n/a (fp16 needs CUDA) | 1774 | - |" in text and "| bf16 | 812.5 |" in text
    assert "INCOMPLETE" in text and "NOT GPU figures" not in text


def test_outside_a_checkout_or_with_an_unknown_check_it_says_so_in_one_line(tmp_path, capsys):
    assert gpu_check.main(["--device", "cpu", "--repo", str(tmp_path), "--report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: gpu_check needs the alfish repository checkout, and ") and "\n" not in err
    assert "has no tests/gpu, confs/sac_pendulum.gin, tools/bench/bench_gpu.py" in err
    assert gpu_check.main(["--device", "cpu", "--only", "cuda_test"]) == 2
    assert capsys.readouterr().err.strip() == f"error: no check named cuda_test; the checks are {', '.join(NAMES)}"
    assert not (tmp_path / "gpu_check.md").exists()


def run_tool(report: pathlib.Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "alfish.tools.gpu_check", "--device", "cpu", "--report",
                           str(report), *args], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=timeout)


def test_the_command_writes_one_row_per_check_and_reports_a_failing_one(tmp_path, monkeypatch, capsys):
    """``main`` as the command runs it, on the CPU, with two real checks: fp16 (SKIP on the CPU) and device_replay
    pointed at a test file that does not exist (FAIL, 'missing': the failure is reported and the exit status is 1)."""
    real = gpu_check.all_checks

    def with_a_missing_file(device, work, report_dir):
        return [dataclasses.replace(c, needs=("tests/gpu/test_absent.py",)) if c.name == "device_replay" else c
                for c in real(device, work, report_dir)]

    monkeypatch.setattr(gpu_check, "all_checks", with_a_missing_file)
    assert gpu_check.main(["--device", "cpu", "--report", str(tmp_path), "--only", "device_replay", "amp_fp16"]) == 1
    assert capsys.readouterr().out.endswith(f"report: {tmp_path / 'gpu_check.md'}\n")
    text, doc = read_report(tmp_path)
    assert [(c["name"], c["status"], c["detail"]) for c in doc["checks"]] == [
        ("device_replay", FAIL, "missing: tests/gpu/test_absent.py"),
        ("amp_fp16", SKIP, "fp16 autocast needs CUDA (on the CPU alfish refuses it)")]
    assert "| 1 | device_replay | **FAIL** |" in text and "| 2 | amp_fp16 | **SKIP** |" in text
    assert doc["machine"]["torch"] and doc["machine"]["GPU"] == "none visible" and doc["run"]["finished"]
    assert "1 FAIL, 1 SKIP" in text


# Every check at its smallest size on the CPU: 30-70 s here, so the slow tier. What each check runs is in the default
# run on its own (tests/gpu; SAC on two gloo ranks, tests/trainer/test_distributed.py; SAC under bf16 autocast,
# tests/learn/test_amp.py); the tool's report and its failing, crashing, hanging and missing checks are tested above
# with small commands.
@pytest.mark.slow
@pytest.mark.cli
@pytest.mark.timeout(600)
def test_the_whole_cpu_run_passes_or_skips_every_check(tmp_path):
    proc = run_tool(tmp_path, timeout=560)
    text, doc = read_report(tmp_path)
    assert [c["name"] for c in doc["checks"]] == list(NAMES)
    for check in doc["checks"]:
        assert check["status"] in (PASS, SKIP), f"{check['name']}: {check['detail']}\n{check['tail']}"
    # on the CPU only fp16 (CUDA-only) and the bench (without MuJoCo) may skip: everything else ran and passed
    skipped = {c["name"] for c in doc["checks"] if c["status"] == SKIP}
    assert skipped <= {"amp_fp16", "bench"}, skipped
    assert proc.returncode == 0, proc.stderr


# ----------------------------------------------------------------------------------- tools/bench/bench_gpu.py ---

def bench_gpu(path: pathlib.Path = REPO / "tools" / "bench" / "bench_gpu.py"):
    """tools/bench/bench_gpu.py as a module (a script, not a package: loaded from its file)."""
    spec = importlib.util.spec_from_file_location("bench_gpu", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_bench_synchronizes_the_gpu_it_times_not_the_current_one(monkeypatch):
    bench, synced = bench_gpu(), []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    for device in ("cuda:1", "cuda", "cpu"):
        bench.Stopwatch(device).mark_start(0)
    assert synced == [torch.device("cuda:1"), torch.device("cuda")]  # 'cuda': the current GPU; the CPU: nothing


def test_the_bench_writes_its_figures_as_json_for_the_report(tmp_path):
    bench = bench_gpu()
    args = argparse.Namespace(json=str(tmp_path / "bench.json"), quick=True)
    results = {"env_steps": {"sac": {"tf32": {"runs": [], "skipped": "TF32 needs a CUDA GPU (Ampere or newer)"}}},
               "updates": {}, "ddp": {1: {"runs": [10.0], "median": 10.0}}}
    bench.write_json(args, {"device": "CPU (2 cores)"}, results)
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["complete"] is False and doc["leanrl_h100"] == {"sac": 725, "td3": 936, "ppo": 1774}
    assert doc["results"]["ddp"] == {"1": {"runs": [10.0], "median": 10.0}} and doc["sizes"]["sac"]["steps"] == 300
    assert doc["results"]["env_steps"]["sac"]["tf32"]["skipped"].startswith("TF32 needs")
    assert bench.alfish_conf(dict(device="cuda", seed=0, threads=0, algo="sac", variant="tf32",
                                  sizes=dict(learning_starts=1, warmup=1, steps=1)), 1).endswith(
        "DevicePolicy.matmul_precision = 'high'\n")


def test_on_a_gpu_the_pytest_checks_run_on_xdist_workers_and_the_measured_times_fit(tmp_path):
    """The GPU tests took over 400 s one at a time on an H200 and 128 s on 4 workers (2026-11-28): on a GPU both
    pytest checks run on 4 workers, on the CPU (the tool's own test) in one process. Each check's timeout covers its
    time measured there, and those times (the no-recompile check at its measured ~13 s an algorithm, one at a time;
    the quick bench at ~9 jobs of ~15 s) fit the default budget."""
    from alfish.tools.gpu_check_checks import all_checks

    def workers(check: Check) -> str | None:
        argv = list(check.argv)
        return argv[argv.index("-n") + 1] if "-n" in argv else None

    gpu = {c.name: c for c in all_checks("cuda", tmp_path, tmp_path)}
    cpu = {c.name: c for c in all_checks("cpu", tmp_path, tmp_path)}
    for name in ("cuda_tests", "no_recompile"):
        assert workers(gpu[name]) == "4" and workers(cpu[name]) is None, name
    measured = dict(cuda_tests=128, device_replay=18, torchrun_gloo=23, amp_fp16=14, amp_bf16=15)
    assert all(gpu[name].timeout_s >= seconds for name, seconds in measured.items())
    assert sum(measured.values()) + 9 * 13 + 9 * 15 < gpu_check.DEFAULT_BUDGET_S
