"""The checks of ``alfish.tools.gpu_check``, in the order they run: each is one command run from the repository root in
a process of its own, with its own timeout; its size depends on the device (on a GPU: what fits the tool's 8 minutes;
``--device cpu``: the smallest that still runs every code path, which is how the tool's own test runs it).

The GPU sizes were set from the first runs on a GPU (an H200 with torch 2.11, 2026-11-28: the GPU tests took over
400 s one at a time and 128 s on 4 pytest-xdist workers; the no-recompile check ~13 s an algorithm; device replay
18 s; torchrun 23 s; AMP 14-15 s; a quick bench job 11-17 s); each timeout is about 1.5x the measured time.
"""
from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Optional

PYTEST_PASSED = r"\b[1-9]\d* passed"  # a pytest run in which every test skipped proves nothing
RANKS_FINISHED = r"\[rank 1\] INFO training finished"  # torchrun's second rank trained to the end
TRAINED = r"INFO training finished"
SEPARATE_GPU_TESTS = ("tests/gpu/test_no_recompile.py", "tests/gpu/test_device_replay.py")  # checks 2 and 3


@dataclasses.dataclass(frozen=True)
class Check:
    """One check. ``argv`` runs from the repository root with ``env`` added to the environment; it passes when it
    exits 0 within ``timeout_s`` and its output matches ``expect`` (a regex; '' for any). ``needs``: repository files
    it runs (absent: FAIL, 'missing'). ``skip``: why it cannot run on this device (it is not started).
    ``unavailable_exit``: an exit status by which the command says this machine cannot run it (SKIP, with its last
    line). ``figures``: a JSON file the command writes, shown in the report."""

    name: str
    what: str
    argv: tuple[str, ...]
    timeout_s: float
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    expect: str = ""
    needs: tuple[str, ...] = ()
    skip: Optional[str] = None
    unavailable_exit: Optional[int] = None
    figures: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big each check is on one kind of device: the timeouts (s), the tests/gpu selections, the training runs'
    iterations and replay settings, and the benchmark's arguments."""

    timeouts: dict[str, float]
    test_workers: int  # pytest-xdist workers for the two pytest checks (0: one process)
    gpu_tests_selection: tuple[str, ...]
    recompile_selection: tuple[str, ...]
    iterations: int
    initial_collect_steps: int
    mini_batch_size: int
    bench_args: tuple[str, ...]


GPU_SIZES = Sizes(
    timeouts=dict(cuda_tests=190, no_recompile=100, device_replay=30, torchrun_gloo=45, amp_fp16=30, amp_bf16=30,
                  bench=200),
    test_workers=4,  # (16 cores and one GPU: the tests are small; one at a time they do not fit the budget)
    gpu_tests_selection=(),  # all of tests/gpu (the default run's selection: not the slow tier)
    recompile_selection=(),  # every algorithm
    iterations=200, initial_collect_steps=100, mini_batch_size=256,
    # The compiled rows are the ones LeanRL's (torch.compile + CUDA graphs) compare with; SB3 on the same GPU is the
    # issue's ratio. (TF32 is left to the full bench: 1.03-1.13x fp32 on the H200.)
    bench_args=("--quick", "--algos", "sac", "td3", "ppo", "--variants", "fp32", "compiled", "sb3",
                "--skip_updates"))
CPU_SIZES = Sizes(
    timeouts=dict(cuda_tests=90, no_recompile=90, device_replay=90, torchrun_gloo=90, amp_fp16=60, amp_bf16=60,
                  bench=90),
    test_workers=0,
    gpu_tests_selection=("-k", "amp_precision"),  # the GPU tests' plumbing; the whole folder takes ~200 s here
    # TD3 (two graphs: actor due / not due); every algorithm's CPU check is tests/learn/test_compiled_no_recompile.py
    recompile_selection=("-k", "td3"),
    iterations=2, initial_collect_steps=16, mini_batch_size=16,
    bench_args=("--quick", "--algos", "sac", "--variants", "fp32", "--skip_updates"))
NAMES = tuple(GPU_SIZES.timeouts)


def train_params(device: str, sizes: Sizes) -> list[str]:
    """``--conf_param`` bindings that make confs/sac_pendulum.gin a short run on ``device`` (no evaluation)."""
    return [f"TrainerConfig.num_iterations={sizes.iterations}",
            f"TrainerConfig.initial_collect_steps={sizes.initial_collect_steps}",
            f"TrainerConfig.mini_batch_size={sizes.mini_batch_size}",
            "TrainerConfig.evaluate=False", f"DevicePolicy.device='{device}'"]


def sac_train(root_dir: pathlib.Path, params: list[str], launcher: tuple[str, ...] = (sys.executable,)
              ) -> tuple[str, ...]:
    """``alfish.bin.train`` on confs/sac_pendulum.gin into ``root_dir`` with ``params`` (``launcher``: torchrun)."""
    argv = [*launcher, "-m", "alfish.bin.train", "--conf", "confs/sac_pendulum.gin", "--root_dir", str(root_dir)]
    for param in params:
        argv += ["--conf_param", param]
    return tuple(argv)


def pytest(*args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args)


def all_checks(device: str, work: pathlib.Path, report_dir: pathlib.Path) -> list[Check]:
    """Every check for ``device`` ('cuda', 'cuda:N' or 'cpu'), in order; ``work``: a scratch folder for the training
    runs; ``report_dir``: where the benchmark's figures go."""
    on_gpu = device.startswith("cuda")
    sizes = GPU_SIZES if on_gpu else CPU_SIZES
    t = sizes.timeouts
    on_device = {"ALFISH_TEST_DEVICE": device}
    ignored = [f"--ignore={path}" for path in SEPARATE_GPU_TESTS]
    workers = ("-n", str(sizes.test_workers)) if sizes.test_workers else ()
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    amp = {name: [*train_params(device, sizes), "TrainerConfig.enable_amp=True", f"AmpPolicy.dtype='{dtype}'"]
           for name, dtype in (("fp16", "float16"), ("bf16", "bfloat16"))}
    bench_json = report_dir / "gpu_check_bench.json"
    return [
        Check("cuda_tests", f"tests/gpu on {device} (ALFISH_TEST_DEVICE), the default tier"
              + ("" if on_gpu else f", selected: {' '.join(sizes.gpu_tests_selection)}"),
              pytest("tests/gpu", *ignored, *workers, *sizes.gpu_tests_selection), t["cuda_tests"], on_device,
              expect=PYTEST_PASSED, needs=("tests/gpu",)),
        Check("no_recompile", "every algorithm's compiled update ('reduce-overhead') never recompiles after warm-up",
              pytest(SEPARATE_GPU_TESTS[0], *workers, *sizes.recompile_selection), t["no_recompile"], on_device,
              expect=PYTEST_PASSED, needs=(SEPARATE_GPU_TESTS[0],)),
        Check("device_replay", "replay on the device with frame stacking, hindsight relabelling and offline mixing",
              pytest(SEPARATE_GPU_TESTS[1]), t["device_replay"], on_device, expect=PYTEST_PASSED,
              needs=(SEPARATE_GPU_TESTS[1],)),
        Check("torchrun_gloo", f"2 torchrun ranks sharing {device} through gloo train SAC",
              sac_train(work / "torchrun", [*train_params(device, sizes), "init_distributed.backend='gloo'"],
                        torchrun),
              t["torchrun_gloo"], {"OMP_NUM_THREADS": "1"}, expect=RANKS_FINISHED, needs=("confs/sac_pendulum.gin",)),
        Check("amp_fp16", "SAC trains with AMP fp16 (gradient scaler)", sac_train(work / "amp_fp16", amp["fp16"]),
              t["amp_fp16"], expect=TRAINED, needs=("confs/sac_pendulum.gin",),
              skip=None if on_gpu else "fp16 autocast needs CUDA (on the CPU alfish refuses it)"),
        Check("amp_bf16", "SAC trains with AMP bf16", sac_train(work / "amp_bf16", amp["bf16"]), t["amp_bf16"],
              expect=TRAINED, needs=("confs/sac_pendulum.gin",)),
        Check("bench", f"tools/bench/bench_gpu.py {' '.join(sizes.bench_args)}",
              (sys.executable, "tools/bench/bench_gpu.py", "--device", device, *sizes.bench_args, "--json",
               str(bench_json)),
              t["bench"], needs=("tools/bench/bench_gpu.py",), unavailable_exit=2, figures=str(bench_json),
              skip=None if on_gpu else "the bench times a GPU against LeanRL's GPU figures; on the CPU run "
                                       "tools/bench/bench_gpu.py --device cpu --quick by hand (minutes)"),
    ]
