"""alfish on one GPU against Stable-Baselines3 on the same GPU, and alfish's own variants, in one run.

    python tools/bench/bench_gpu.py [--repeats 3] [--algos sac td3 ppo] [--ddp N] [--quick] [--device cuda|cpu]
                                    [--json PATH]

Env steps/s on HalfCheetah-v5 (MuJoCo), 1 env, each job in a fresh process, ``--repeats`` times, alternating the
frameworks; the medians and their ratios are printed. A job takes ``learning_starts`` uniformly random env steps
(no updates), then ``warmup`` env steps with training (compilation, CUDA-graph capture, allocator and cuDNN warm-up
happen here), then the timed ``steps``; the device is synchronized at both ends of the timed region. No evaluation,
checkpoints or summaries in any job.
  * SAC: 256x256 ReLU MLPs, batch 256, Adam lr 3e-4 (actor, critics, alpha), gamma 0.99, tau 0.005, automatic
    entropy (target -dim(A)), 1 update per env step, replay 1e6 (SB3's defaults).
    1000 random + 4000 training steps, then 5000 timed.
  * TD3: 256x256, batch 256, lr 3e-4, gamma 0.99, tau 0.005, Gaussian exploration noise 0.1, target policy noise
    0.2 clipped at 0.5, actor and targets every 2nd update, 1 update per env step (CleanRL's td3_continuous_action,
    SB3's TD3 with lr 3e-4). Same step counts as SAC.
  * PPO: 64x64 tanh actor and critic (separate), 2048 steps per rollout, 10 epochs of mini-batches of 64, lr 3e-4,
    gamma 0.99, GAE 0.95, clip 0.2, value coefficient 0.5, no entropy bonus, max grad norm 0.5, Adam eps 1e-5,
    normalized advantages (SB3's PPO defaults = CleanRL's ppo_continuous_action, without its observation/reward
    normalization wrappers and lr annealing). 2 rollouts of warm-up, then 4 timed (8192 env steps).
  alfish variants: eager fp32, eager TF32 (``DevicePolicy.matmul_precision = 'high'``: float32 matmuls on TF32
  tensor cores; SAC and TD3, CUDA only), AMP fp16 (with the gradient scaler), AMP bf16, and compiled updates
  (``Learner.compile_mode = 'reduce-overhead'``: CUDA graphs; ``'default'`` with ``--device cpu``); SB3 at the same
  hyperparameters with device='cuda'.
Updates/s of one SAC update with 3x1024 MLPs (batch 256) on a preallocated device batch: a loop of
``learner.update``, synchronized around the timed loop only, fp32 against TF32, fp16 and bf16 autocast.
DDP (``--ddp N``): alfish SAC eager fp32 with 1 rank and with N torchrun ranks, each rank 1 env and batch 256
(fixed per-rank work), job env steps/s and the scaling efficiency; skipped when fewer than N GPUs are visible.

Reference figures printed alongside: LeanRL's published H100 throughput (torch.compile + CUDA graphs: SAC 725, TD3
936, continuous PPO 1774 env steps/s) and the issue's targets (SAC >= 1000, TD3 >= 1200, PPO >= 2000 env steps/s,
each >= 3x SB3 on the same GPU; AMP >= 1.5x fp32 updates/s on the 3x1024 SAC update).

``--device cpu`` runs every code path on the CPU (the numbers are then not GPU figures and are labelled so), and
``--quick`` shortens every job, for a smoke test: ``python tools/bench/bench_gpu.py --device cpu --quick``.
``--json PATH`` also writes every figure (runs, medians, skips and errors, the machine, the reference figures) to PATH,
rewritten after each table, so a run stopped part-way leaves the tables it finished (``alfish.tools.gpu_check`` reads
it).
Needs ``pip install -e ".[mujoco]" -r tools/bench/requirements-peers.txt`` (MuJoCo and SB3).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ENV = "HalfCheetah-v5"
OBS_DIM, ACT_DIM = 17, 6  # HalfCheetah's observation and action sizes (the updates/s job needs no simulator)

LEANRL_H100 = {"sac": 725, "td3": 936, "ppo": 1774}  # env steps/s, LeanRL's README (compile + CUDA graphs, H100)
TARGETS = {"sac": 1000, "td3": 1200, "ppo": 2000}  # env steps/s on one GPU (the issue's)
TARGET_VS_SB3 = 3.0  # alfish / SB3 env steps/s on the same GPU
TARGET_AMP_SPEEDUP = 1.5  # AMP / fp32 updates/s, 3x1024 SAC update
ALFISH_VARIANTS = ("fp32", "tf32", "fp16", "bf16", "compiled")
VARIANT_NAMES = {"fp32": "alfish eager fp32", "tf32": "alfish eager TF32", "fp16": "alfish AMP fp16",
                 "bf16": "alfish AMP bf16", "compiled": "alfish compiled", "sb3": "SB3"}
TF32_ALGOS = ("sac", "td3")  # PPO's 64x64 networks are far too small for TF32 to show
UPDATE_VARIANTS = ("fp32", "tf32", "fp16", "bf16")  # the 3x1024 SAC update's precisions
WORKER_TIMEOUT_S = 3600


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Env steps of one job (per rank under DDP): random actions without updates, training before the timed
    region, and timed."""

    learning_starts: int
    warmup: int
    steps: int

    @property
    def start_at(self) -> int:
        return self.learning_starts + self.warmup

    @property
    def total(self) -> int:
        return self.start_at + self.steps


SIZES = {"sac": Sizes(1000, 4000, 5000), "td3": Sizes(1000, 4000, 5000), "ppo": Sizes(0, 2 * 2048, 4 * 2048)}
QUICK_SIZES = {"sac": Sizes(100, 200, 300), "td3": Sizes(100, 200, 300), "ppo": Sizes(0, 2048, 2048)}
UPDATES = dict(warmup=50, timed=500)  # SAC 3x1024 updates/s job
QUICK_UPDATES = dict(warmup=3, timed=10)


# ============================================================================================= the parent =====

def main(args: argparse.Namespace) -> int:
    problem = environment_problem(args)
    if problem:
        print(f"bench_gpu: {problem}", file=sys.stderr)
        return 2
    machine = print_header(args)
    results: dict[str, Any] = {"env_steps": {}, "updates": {}, "ddp": {}}
    write_json(args, machine, results)
    for algo in args.algos:
        results["env_steps"][algo] = env_steps_jobs(args, algo)
        print_env_steps_table(args, algo, results["env_steps"][algo])
        write_json(args, machine, results)
    if not args.skip_updates:
        results["updates"] = updates_jobs(args)
        print_updates_table(args, results["updates"])
        write_json(args, machine, results)
    if args.ddp:
        results["ddp"] = ddp_jobs(args)
        print_ddp_table(args, results["ddp"])
    write_json(args, machine, results, complete=True)
    print("SUMMARY " + json.dumps(summary(results)))
    failed = [f"{where}: {r['error']}" for where, r in failures(results)]
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="'cuda' (default), 'cuda:N' or 'cpu' (code paths only)")
    parser.add_argument("--repeats", type=int, default=None, help="jobs per variant (default 3; 1 with --quick)")
    parser.add_argument("--algos", nargs="+", default=["sac", "td3", "ppo"], choices=sorted(SIZES))
    parser.add_argument("--variants", nargs="+", default=list(ALFISH_VARIANTS) + ["sb3"],
                        choices=list(ALFISH_VARIANTS) + ["sb3"], help="which env-steps/s jobs to run")
    parser.add_argument("--ddp", type=int, default=0, metavar="N", help="also run SAC with 1 and N torchrun ranks")
    parser.add_argument("--skip_updates", action="store_true", help="leave out the 3x1024 SAC updates/s job")
    parser.add_argument("--quick", action="store_true", help="short jobs, 1 repeat (a smoke test)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in every job (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="PATH", help="also write every figure to PATH as JSON")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: one job, as JSON
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    return args


def environment_problem(args: argparse.Namespace) -> Optional[str]:
    """Why this machine cannot run the benchmark as asked (None: it can)."""
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return (f"no CUDA device is visible (torch {torch.__version__}, CUDA build {torch.version.cuda}); run it on a "
                "GPU machine, or with --device cpu to check its code paths (CPU numbers are not GPU figures)")
    if not args.device.startswith(("cuda", "cpu")):
        return f"--device {args.device}: use 'cuda', 'cuda:N' or 'cpu'"
    try:
        import mujoco  # noqa: F401  (HalfCheetah-v5's simulator)
    except ImportError:
        return f"{ENV} needs MuJoCo: pip install -e '.[mujoco]' (or 'gymnasium[mujoco]')"
    return None


def print_header(args: argparse.Namespace) -> dict:
    """Print what the figures were measured on; returns it (for ``--json``)."""
    import gymnasium
    import torch

    on_gpu = args.device.startswith("cuda")
    if on_gpu:
        index = torch.device(args.device).index or 0
        device = (f"{torch.cuda.get_device_name(index)} ({args.device}; {torch.cuda.device_count()} visible), "
                  f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    else:
        device = f"CPU ({os.cpu_count()} cores)"
    print(f"bench_gpu on {device}; torch {torch.__version__}, float32 matmul precision "
          f"'{torch.get_float32_matmul_precision()}', gymnasium {gymnasium.__version__}, SB3 {sb3_version()}; "
          f"{'quick, ' if args.quick else ''}medians of {args.repeats}", flush=True)
    if not on_gpu:
        print("NOTE: --device cpu checks the code paths; the numbers below are CPU numbers, NOT GPU figures, and "
              "are not compared with the GPU targets.", flush=True)
    return dict(device=device, device_arg=args.device, torch=torch.__version__, cuda=torch.version.cuda,
                gymnasium=gymnasium.__version__, sb3=sb3_version(), quick=args.quick, repeats=args.repeats)


def write_json(args: argparse.Namespace, machine: dict, results: dict, complete: bool = False) -> None:
    """``--json``: everything measured so far, with the machine and the reference figures (written to a temporary
    file, then renamed: a reader never sees half a file)."""
    if not args.json:
        return
    doc = dict(machine=machine, complete=complete, results=jsonable(results), leanrl_h100=LEANRL_H100,
               targets=TARGETS, sizes={a: dataclasses.asdict(s) for a, s in (QUICK_SIZES if args.quick
                                                                                  else SIZES).items()})
    tmp = f"{args.json}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, args.json)


def jsonable(results: dict) -> dict:
    """``results`` with string keys (the DDP table is keyed by rank counts)."""
    return {k: jsonable(v) if isinstance(v, dict) else v for k, v in ((str(k), v) for k, v in results.items())}


def sb3_version() -> str:
    try:
        import stable_baselines3
    except ImportError:
        return "not installed (pip install -r tools/bench/requirements-peers.txt)"
    return stable_baselines3.__version__


# ------------------------------------------------------------------------------------------------ jobs ----

def run_worker(job: dict, launcher: Optional[list[str]] = None) -> dict:
    """Run one job in a fresh process (``launcher``: e.g. torchrun) and return its RESULT, or ``{'error': ...}``."""
    cmd = (launcher or [sys.executable]) + [os.path.abspath(__file__), "--worker", json.dumps(job)]
    try:
        # The worker's sys.path starts at tools/bench: without REPO on PYTHONPATH it would import whichever alfish is
        # installed, not this checkout's.
        pythonpath = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S,
                             env=dict(os.environ, PYTHONPATH=pythonpath))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {WORKER_TIMEOUT_S} s"}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    return {"error": f"exit {out.returncode}: {lines[-1] if lines else 'no output'}", "stderr": out.stderr[-3000:]}


def job_spec(args: argparse.Namespace, kind: str, **fields: Any) -> dict:
    return dict(kind=kind, device=args.device, threads=args.threads, seed=args.seed, **fields)


def unavailable(args: argparse.Namespace, variant: str) -> Optional[str]:
    """Why ``variant`` cannot run on this device (None: it can)."""
    if variant == "fp16" and not args.device.startswith("cuda"):
        return "fp16 autocast needs CUDA"
    if variant == "tf32" and not args.device.startswith("cuda"):
        return "TF32 needs a CUDA GPU (Ampere or newer)"
    if variant == "sb3" and sb3_version().startswith("not installed"):
        return "stable-baselines3 not installed"
    return None


def repeat_jobs(args: argparse.Namespace, label: str, jobs: dict[Any, dict], key: str,
                launchers: Optional[dict[Any, list[str]]] = None) -> dict[Any, dict]:
    """Run each of ``jobs`` (``{variant: job}``) ``args.repeats`` times, alternating the variants within each repeat
    so a drifting machine affects them alike. Returns ``{variant: {'runs': [result[key], ...], 'median': ...}}``,
    with ``'skipped'`` (the variant cannot run here) or ``'error'`` (a run failed: no more repeats of it)."""
    out: dict[Any, dict] = {v: {"runs": []} for v in jobs}
    for v in jobs:
        reason = unavailable(args, v) if isinstance(v, str) else None
        if reason:
            out[v]["skipped"] = reason
    for _ in range(args.repeats):
        for v, job in jobs.items():
            if "skipped" in out[v] or "error" in out[v]:
                continue
            r = run_worker(job, (launchers or {}).get(v))
            if "error" in r:
                out[v].update(r)
            else:
                out[v]["runs"].append(r[key])
            name = variant_name(v, args.device) if v in VARIANT_NAMES else f"{v}"
            print(f"  [{label}] {name}: {describe(r)}", flush=True)
    for entry in out.values():
        if entry["runs"]:
            entry["median"] = statistics.median(entry["runs"])
    return out


def env_steps_jobs(args: argparse.Namespace, algo: str) -> dict[str, dict]:
    """Env steps/s of ``algo`` for every variant asked for (see ``repeat_jobs``)."""
    sizes = dataclasses.asdict((QUICK_SIZES if args.quick else SIZES)[algo])
    variants = [v for v in args.variants if v != "tf32" or algo in TF32_ALGOS]
    jobs = {v: job_spec(args, "env_steps", framework="sb3" if v == "sb3" else "alfish", algo=algo, variant=v,
                        sizes=sizes) for v in variants}
    return repeat_jobs(args, algo, jobs, "env_steps_per_s")


def updates_jobs(args: argparse.Namespace) -> dict[str, dict]:
    """Updates/s of the 3x1024 SAC update in fp32, TF32, fp16 and bf16 (see ``repeat_jobs``)."""
    counts = QUICK_UPDATES if args.quick else UPDATES
    jobs = {v: job_spec(args, "updates", variant=v, hidden=[1024] * 3, batch=256, **counts)
            for v in UPDATE_VARIANTS}
    return repeat_jobs(args, "sac 3x1024 update", jobs, "updates_per_s")


def ddp_jobs(args: argparse.Namespace) -> dict:
    """SAC eager fp32 with 1 and ``--ddp`` ranks at fixed per-rank work, ``{ranks: {'runs': [...], 'median': ...}}``
    (see ``repeat_jobs``), or ``{'skipped': reason}``. Each rank trains on its own GPU (``cuda:LOCAL_RANK``)."""
    import torch

    n = args.ddp
    on_gpu = args.device.startswith("cuda")
    if on_gpu and torch.cuda.device_count() < n:
        return {"skipped": f"--ddp {n} needs {n} GPUs; {torch.cuda.device_count()} visible"}
    sizes = dataclasses.asdict((QUICK_SIZES if args.quick else SIZES)["sac"])
    job = dict(job_spec(args, "env_steps", framework="alfish", algo="sac", variant="fp32", sizes=sizes),
               device="cuda" if on_gpu else "cpu")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
    return repeat_jobs(args, "ddp ranks", {1: job, n: job}, "env_steps_per_s", {n: torchrun})


def describe(result: dict) -> str:
    if "error" in result:
        return f"FAILED ({result['error']})"
    if "env_steps_per_s" in result:
        compiled = f"; {result['compile']['graphs']} graphs compiled" if "compile" in result else ""
        return (f"{result['env_steps_per_s']:.0f} env steps/s ({result['env_steps']} env steps in "
                f"{result['seconds']:.1f} s; job {result['job_s']:.0f} s{compiled})")
    return f"{result['updates_per_s']:.1f} updates/s ({result['updates']} updates in {result['seconds']:.2f} s)"


# ---------------------------------------------------------------------------------------------- tables ----

def cell(entry: dict, digits: int = 0) -> str:
    """A table cell: the median, or why there is none."""
    if "median" in entry:
        return f"{entry['median']:.{digits}f}"
    if "skipped" in entry:
        return f"n/a ({entry['skipped']})"
    return f"FAILED: {entry.get('error', 'no result')}"


def ratio(a: dict, b: dict) -> Optional[float]:
    return a["median"] / b["median"] if "median" in a and "median" in b else None


def fmt(x: Optional[float], suffix: str = "x") -> str:
    return "-" if x is None else f"{x:.2f}{suffix}"


def print_env_steps_table(args: argparse.Namespace, algo: str, res: dict[str, dict]) -> None:
    sizes = (QUICK_SIZES if args.quick else SIZES)[algo]
    on_gpu = args.device.startswith("cuda")
    title = "GPU" if on_gpu else "CPU -- NOT GPU FIGURES"
    print(f"\n{algo.upper()} on {ENV}, env steps/s ({title}; {sizes.steps} timed env steps after "
          f"{sizes.learning_starts} random and {sizes.warmup} training steps; medians of {args.repeats})")
    print(f"| variant | env steps/s | runs | vs alfish fp32 | vs SB3 | LeanRL H100 | target "
          f">= {TARGETS[algo]} and >= {TARGET_VS_SB3:g}x SB3 |")
    print("|---|---|---|---|---|---|---|")
    base, sb3 = res.get("fp32", {}), res.get("sb3", {})
    for v, entry in res.items():
        vs_sb3 = ratio(entry, sb3) if v != "sb3" else None
        if v == "sb3":
            verdict = "-"
        elif not on_gpu:
            verdict = "n/a (not a GPU)"
        elif "median" in entry and vs_sb3 is not None:
            verdict = "met" if entry["median"] >= TARGETS[algo] and vs_sb3 >= TARGET_VS_SB3 else "not met"
        else:
            verdict = "-"
        runs = ", ".join(f"{x:.0f}" for x in entry["runs"])
        print(f"| {variant_name(v, args.device)} | {cell(entry)} | {runs} | {fmt(ratio(entry, base))} | "
              f"{fmt(vs_sb3)} | {LEANRL_H100[algo]} | {verdict} |")
    sys.stdout.flush()


def print_updates_table(args: argparse.Namespace, res: dict[str, dict]) -> None:
    on_gpu = args.device.startswith("cuda")
    print(f"\nSAC update, 3x1024 MLPs, batch 256, updates/s ({'GPU' if on_gpu else 'CPU -- NOT GPU FIGURES'}; "
          f"medians of {args.repeats})")
    print(f"| precision | updates/s | runs | vs fp32 | AMP target >= {TARGET_AMP_SPEEDUP:g}x fp32 |")
    print("|---|---|---|---|---|")
    for v, entry in res.items():
        speedup = ratio(entry, res["fp32"]) if v != "fp32" else None
        verdict = "-" if v not in ("fp16", "bf16") or speedup is None else (  # the target is AMP's
            "n/a (not a GPU)" if not on_gpu else ("met" if speedup >= TARGET_AMP_SPEEDUP else "not met"))
        runs = ", ".join(f"{x:.1f}" for x in entry["runs"])
        print(f"| {v} | {cell(entry, 1)} | {runs} | {fmt(speedup)} | {verdict} |")
    sys.stdout.flush()


def print_ddp_table(args: argparse.Namespace, res: dict) -> None:
    print(f"\nDDP, SAC eager fp32 on {ENV}, 1 env and batch 256 per rank ({args.device}; medians of {args.repeats})")
    if "skipped" in res:
        print(f"skipped: {res['skipped']}")
        return
    print("| ranks | job env steps/s | per rank | scaling efficiency |")
    print("|---|---|---|---|")
    one = res.get(1, {})
    for ranks, entry in res.items():
        per_rank = entry["median"] / ranks if "median" in entry else None
        efficiency = per_rank / one["median"] if per_rank is not None and "median" in one else None
        per_rank_cell = "-" if per_rank is None else f"{per_rank:.0f}"
        print(f"| {ranks} | {cell(entry)} | {per_rank_cell} | {fmt(efficiency, '')} |")
    sys.stdout.flush()


def summary(results: dict) -> dict:
    """Medians only, JSON-able."""
    def medians(table: dict) -> dict:
        return {str(k): v.get("median") for k, v in table.items() if isinstance(v, dict)}
    return {"env_steps_per_s": {algo: medians(t) for algo, t in results["env_steps"].items()},
            "updates_per_s": medians(results["updates"]), "ddp_env_steps_per_s": medians(results["ddp"])}


def failures(results: dict) -> list[tuple[str, dict]]:
    out = [(f"{algo} {v}", e) for algo, t in results["env_steps"].items() for v, e in t.items() if "error" in e]
    out += [(f"updates {v}", e) for v, e in results["updates"].items() if "error" in e]
    out += [(f"ddp {k} ranks", e) for k, e in results["ddp"].items() if isinstance(e, dict) and "error" in e]
    return out


# ============================================================================================ the workers =====

def worker(job: dict) -> int:
    """Run one job in this process; print ``RESULT {json}`` (rank 0 only under torchrun)."""
    import torch

    if job["threads"]:
        torch.set_num_threads(job["threads"])
    start = time.perf_counter()
    if job["kind"] == "updates":
        result = update_rate(job)
    elif job["framework"] == "sb3":
        result = sb3_env_steps(job)
    else:
        result = alfish_env_steps(job)
    result["job_s"] = time.perf_counter() - start
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps(result), flush=True)
    return 0


def synchronize(device: str) -> None:
    """Wait for the work queued on ``device`` (``'cuda'``: the current GPU; ``'cuda:N'``: GPU N, whichever is
    current: SB3 does not make its device the current one), so a clock read counts it."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


class Stopwatch:
    """Wall-clock and env steps at the start and the end of the timed region; the device is synchronized at each
    mark."""

    def __init__(self, device: str):
        self.device = device
        self.start: Optional[tuple[float, int]] = None
        self.end: Optional[tuple[float, int]] = None

    def mark_start(self, env_steps: int) -> None:
        synchronize(self.device)
        self.start = (time.perf_counter(), env_steps)

    def mark_end(self, env_steps: int) -> None:
        synchronize(self.device)
        self.end = (time.perf_counter(), env_steps)

    def result(self) -> dict:
        if self.start is None or self.end is None:
            raise RuntimeError("the run ended before the timed region was complete")
        (t0, s0), (t1, s1) = self.start, self.end
        return dict(env_steps=s1 - s0, seconds=t1 - t0, env_steps_per_s=(s1 - s0) / (t1 - t0))


# ---------------------------------------------------------------------------------------- alfish jobs ----

COMMON_CONF = """
create_environment.env_name = '{env}'
create_environment.num_parallel_environments = 1
DevicePolicy.device = '{device}'
TrainerConfig.random_seed = {seed}
TrainerConfig.num_iterations = 0
TrainerConfig.num_env_steps = {total}
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 0
TrainerConfig.summary_interval = 100000000
TrainerConfig.summarize_first_interval = False
Trainer.progress_log_interval_s = 1e9
"""
OFF_POLICY_CONF = """
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = {learning_starts}
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.replay_buffer_length = 1000000
TrainerConfig.mini_batch_size = 256
TrainerConfig.mini_batch_length = 2
TrainerConfig.num_updates_per_train_iter = 1
Trainer.random_warm_up_actions = True
"""
ALGORITHM_CONFS = {
    "sac": OFF_POLICY_CONF + """
TrainerConfig.algorithm_ctor = @SacAlgorithm
SacAlgorithm.hidden_sizes = (256, 256)
SacAlgorithm.actor_lr = 3e-4
SacAlgorithm.critic_lr = 3e-4
SacAlgorithm.alpha_lr = 3e-4
SacAlgorithm.gamma = 0.99
SacAlgorithm.target_update_tau = 0.005
""",
    "td3": OFF_POLICY_CONF + """
TrainerConfig.algorithm_ctor = @Td3Algorithm
Td3Algorithm.hidden_sizes = (256, 256)
Td3Algorithm.actor_lr = 3e-4
Td3Algorithm.critic_lr = 3e-4
Td3Algorithm.gamma = 0.99
Td3Algorithm.target_update_tau = 0.005
Td3Algorithm.exploration_noise = 0.1
Td3Algorithm.target_policy_noise = 0.2
Td3Algorithm.target_noise_clip = 0.5
Td3Algorithm.policy_delay = 2
""",
    "ppo": """
TrainerConfig.algorithm_ctor = @PpoAlgorithm
PpoAlgorithm.hidden_sizes = (64, 64)
PpoAlgorithm.activation = 'tanh'
PpoAlgorithm.lr = 3e-4
PpoAlgorithm.gamma = 0.99
PpoAlgorithm.gae_lambda = 0.95
PpoAlgorithm.clip_range = 0.2
PpoAlgorithm.value_loss_coef = 0.5
PpoAlgorithm.entropy_coef = 0.0
PpoAlgorithm.normalize_advantages = True
OptimizerConfig.max_grad_norm = 0.5
OptimizerConfig.eps = 1e-5
TrainerConfig.unroll_length = 2048
TrainerConfig.whole_replay_buffer_training = True
TrainerConfig.clear_replay_buffer = True
TrainerConfig.replay_buffer_length = 2049
TrainerConfig.mini_batch_size = 64
TrainerConfig.mini_batch_length = 1
TrainerConfig.num_updates_per_train_iter = 10
""",
}
VARIANT_CONFS = {
    "fp32": "",
    "tf32": "DevicePolicy.matmul_precision = 'high'\n",
    "fp16": "TrainerConfig.enable_amp = True\nAmpPolicy.dtype = 'float16'\n",
    "bf16": "TrainerConfig.enable_amp = True\nAmpPolicy.dtype = 'bfloat16'\n",
    "compiled": "Learner.compile_mode = '{compile_mode}'\n",
}


def compile_mode(device: str) -> str:
    """CUDA graphs on a GPU; plain inductor on the CPU (which has no graphs to capture)."""
    return "reduce-overhead" if device.startswith("cuda") else "default"


def variant_name(variant: str, device: str) -> str:
    if variant == "compiled":
        return f"{VARIANT_NAMES[variant]} ({compile_mode(device)})"
    return VARIANT_NAMES[variant]


def alfish_conf(job: dict, world_size: int) -> str:
    """The gin text of one alfish job; env-step counts are job totals (all ranks), as alfish counts them."""
    sizes = Sizes(**job["sizes"])
    text = COMMON_CONF.format(env=ENV, device=job["device"], seed=job["seed"], total=sizes.total * world_size)
    text += ALGORITHM_CONFS[job["algo"]].format(learning_starts=sizes.learning_starts * world_size)
    if job["threads"]:
        text += f"Trainer.num_threads = {job['threads']}\n"
    return text + VARIANT_CONFS[job["variant"]].format(compile_mode=compile_mode(job["device"]))


def alfish_env_steps(job: dict) -> dict:
    """Train as ``alfish.bin.train`` does and time the iterations between ``start_at`` and the end."""
    from alfish.config import TrainerConfig, load_conf
    from alfish.trainer.build import build_trainer

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    sizes = Sizes(**job["sizes"])
    root = tempfile.mkdtemp(prefix=f"bench-gpu-{job['algo']}-{job['variant']}-")
    conf = os.path.join(root, "bench.gin")
    with open(conf, "w") as f:
        f.write(alfish_conf(job, world_size))
    load_conf(conf, [])
    trainer = build_trainer(TrainerConfig(root_dir=os.path.join(root, "run")))
    watch = Stopwatch(job["device"])
    time_iterations(trainer, watch, sizes.start_at * world_size, sizes.total * world_size)
    trainer.run()
    result = watch.result()
    stats = trainer.learner.compile_stats()  # None unless compiled
    if stats is not None:  # a "compiled" row must be compiled: no fallback to eager, no recompile limit hit
        result["compile"] = stats
        if not stats["compiled"] or stats["recompile_limit_hit"]:
            result["error"] = f"the updates did not stay compiled: {stats}"
    return result


def time_iterations(trainer: Any, watch: Stopwatch, start_at: int, end_at: int) -> None:
    """Wrap the trainer's training step so ``watch`` marks the first iteration that begins at ``start_at`` env steps
    or later and the end of the iteration that reaches ``end_at`` (env steps over all ranks)."""
    run = trainer.training.run

    def timed(steps_per_env: int) -> int:
        if watch.start is None and trainer.counters.env_steps >= start_at:
            watch.mark_start(trainer.counters.env_steps)
        collected = run(steps_per_env)
        after = trainer.counters.env_steps + collected * trainer.plan.total_envs
        if watch.start is not None and watch.end is None and after >= end_at:
            watch.mark_end(after)
        return collected

    trainer.training.run = timed


def update_rate(job: dict) -> dict:
    """Updates/s of ``learner.update`` on one preallocated device batch ``[2, batch]`` (SAC with ``hidden`` MLPs)."""
    import gymnasium as gym
    import torch

    from alfish.algorithms import SacAlgorithm
    from alfish.data.types import Experience, StepType
    from alfish.learn.amp import AmpPolicy
    from alfish.learn.device import DevicePolicy
    from alfish.learn.learner import Learner
    from alfish.learn.optim import OptimizerConfig

    variant = job["variant"]
    device = DevicePolicy(device=job["device"], matmul_precision="high" if variant == "tf32" else "highest"
                          ).training_device()
    torch.manual_seed(job["seed"])
    obs_space = gym.spaces.Box(-float("inf"), float("inf"), (OBS_DIM,))
    alg = SacAlgorithm(obs_space, gym.spaces.Box(-1.0, 1.0, (ACT_DIM,)), hidden_sizes=tuple(job["hidden"]))
    amp_dtype = {"fp16": "float16", "bf16": "bfloat16"}.get(variant)
    amp = AmpPolicy(amp_dtype is not None, device.type, amp_dtype)
    learner = Learner(alg, OptimizerConfig(), amp, device=device)
    n, length = job["batch"], 2
    batch = Experience(step_type=torch.full((length, n), StepType.MID, dtype=torch.int8, device=device),
                       reward=torch.randn(length, n, device=device), discount=torch.ones(length, n, device=device),
                       observation=torch.randn(length, n, OBS_DIM, device=device),
                       action=torch.rand(length, n, ACT_DIM, device=device) * 2 - 1,
                       env_id=torch.zeros(length, n, dtype=torch.int64, device=device))
    for _ in range(job["warmup"]):
        learner.update(batch)
    synchronize(job["device"])
    start = time.perf_counter()
    for _ in range(job["timed"]):
        learner.update(batch)
    synchronize(job["device"])
    seconds = time.perf_counter() - start
    learner.check_finite()
    return dict(updates=job["timed"], seconds=seconds, updates_per_s=job["timed"] / seconds)


# ------------------------------------------------------------------------------------------- SB3 jobs ----

def sb3_model(job: dict) -> Any:
    """SB3's SAC / TD3 / PPO at the hyperparameters of ``ALGORITHM_CONFS`` (the module docstring lists them)."""
    import numpy as np
    from stable_baselines3 import PPO, SAC, TD3
    from stable_baselines3.common.noise import NormalActionNoise

    common = dict(seed=job["seed"], verbose=0, device=job["device"])
    sizes = Sizes(**job["sizes"])
    off_policy = dict(learning_rate=3e-4, buffer_size=1_000_000, learning_starts=sizes.learning_starts,
                      batch_size=256, tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1,
                      policy_kwargs=dict(net_arch=[256, 256]), **common)
    if job["algo"] == "sac":
        return SAC("MlpPolicy", ENV, ent_coef="auto", **off_policy)
    if job["algo"] == "td3":
        noise = NormalActionNoise(mean=np.zeros(ACT_DIM), sigma=0.1 * np.ones(ACT_DIM))
        return TD3("MlpPolicy", ENV, action_noise=noise, policy_delay=2, target_policy_noise=0.2,
                   target_noise_clip=0.5, **off_policy)
    return PPO("MlpPolicy", ENV, n_steps=2048, batch_size=64, n_epochs=10, learning_rate=3e-4, gamma=0.99,
               gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
               normalize_advantage=True, policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64])), **common)


def sb3_env_steps(job: dict) -> dict:
    """``model.learn`` with a callback that marks the first rollout starting at ``start_at`` env steps or later
    (SB3's off-policy loop starts a 1-step rollout per env step) and the end of training."""
    from stable_baselines3.common.callbacks import BaseCallback

    sizes = Sizes(**job["sizes"])
    watch = Stopwatch(job["device"])

    class Marks(BaseCallback):
        def _on_rollout_start(self) -> None:
            if watch.start is None and self.num_timesteps >= sizes.start_at:
                watch.mark_start(self.num_timesteps)

        def _on_step(self) -> bool:
            return True

        def _on_training_end(self) -> None:
            watch.mark_end(self.num_timesteps)

    model = sb3_model(job)
    model.learn(total_timesteps=sizes.total, callback=Marks())
    return watch.result()


if __name__ == "__main__":
    _args = parse_args()
    sys.exit(worker(json.loads(_args.worker)) if _args.worker else main(_args))
