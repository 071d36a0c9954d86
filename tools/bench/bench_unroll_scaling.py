"""N asynchronous unroll processes per learner (``Trainer.num_unroll_processes``) on a latency-bound env.

    python tools/bench/bench_unroll_scaling.py [--latencies_ms 5 20] [--processes 1 2 4 8] [--envs_per_process 1]
                                               [--vectorization sync|async] [--seconds 60] [--repeats 1] [--out F]
    python tools/bench/bench_unroll_scaling.py --time_to_threshold [--seeds 1] [--max_env_steps 100000]
    python tools/bench/bench_unroll_scaling.py --latencies_ms 20 --processes 1 2 --seconds 15   # a quick check

Env: ``alfish/Latency-v0`` wrapping CartPole-v1; every env step sleeps ``latency_s`` after stepping (a stand-in for a
robot). Sleeping needs no core, so the scaling shows on a 2-core machine.

Throughput (the default part). For each latency and each N, PPO from ``confs/ppo_cartpole.gin`` (8 -> N x E envs,
32 steps per env per iteration, batch 256, 20 epochs, 64x64 tanh, lr 1e-3, ...) with ``TrainerConfig.async_unroll``,
``PpoAlgorithm.off_policy_correction='vtrace'``, parameters pushed every iteration, ``Trainer.num_unroll_processes=N``
and ``N x E`` envs (E = ``--envs_per_process``), no evaluation, no checkpoints, ``python -m alfish.bin.train`` in a
fresh process. Each run trains ``limit x --seconds`` env steps (rounded to whole iterations of ``N x E x 32``).
  * Limit: every process steps its E envs one after the other with ``--vectorization sync`` (E x latency per
    batched step), so the limit is ``N / latency`` env steps/s; with ``--vectorization async`` (a gymnasium subprocess
    per env) the E envs step together and the limit is ``N x E / latency``.
  * alfish's env steps/s are read from the run's own TensorBoard record: the scalar ``train/env_steps`` is written at
    every summary (every tenth of the run, ``summarize_first_interval`` off; the run is sized so its last iteration
    writes one) with its wall-clock time. The rate is (env steps at the last record - at the first) / (their time
    difference): process start-up (spawn, imports, building the parts) and the first tenth of the run (the children's
    start, the first iterations) are left out.
  * "learner busy" is the median over those records of ``time/train_s / (time/train_s + time/unroll_s)``: the share
    of an iteration the learner spends training rather than waiting on the unroll queue. Near 100%: the learner is
    the bottleneck, and the limit cannot be reached.
  * SB3 peer at the same number of envs: Stable-Baselines3's PPO at the conf's hyperparameters (n_steps 32, batch
    256, 20 epochs, lr 1e-3, gamma 0.98, GAE 0.8, clip 0.2, ent 0, vf 0.5, max grad norm 0.5, Adam eps 1e-5, 64x64
    tanh) on ``SubprocVecEnv`` of ``N x E`` envs, each ``gym.make('alfish/Latency-v0', env_name='CartPole-v1',
    latency_s=...)``, at torch's default threads (``--sb3_threads N``: N; alfish's ``'auto'`` picks 1 for these
    networks, and with two threads any other busy process on a 2-core machine slows SB3's small updates several
    times), in a fresh process (this script with ``--sb3_job``); env steps/s = the env steps / the wall-clock of
    ``learn()`` (building the model and starting the env processes are left out; SB3 collects and trains in turn, so
    its figure includes the updates; the JSON also has its per-rollout stamps). SB3 steps all its envs at once, so
    its limit is ``N x E / latency`` whatever ``--vectorization`` is.
  alfish and SB3 runs alternate; the table prints medians over ``--repeats``; every run is in the JSON (``--out``,
  default ``tools/bench/results/unroll_scaling.json``).

Time to threshold (``--time_to_threshold``): PPO synchronous (``async_unroll=False``, 4 envs with
``create_environment.vectorization='async'`` so they step in parallel) against PPO + V-trace asynchronous with 4 unroll
processes of 1 env each (sync vectorization), on the 20 ms env (``--ttt_latency_ms``), both from
``confs/ppo_cartpole.gin``, up to ``--max_env_steps``, ``--seeds`` seeds (0, 1, ...), the modes alternating. A
5-episode evaluation every ``--eval_interval`` iterations (128 env steps each) runs in alfish's asynchronous
evaluation child (the default, ``TrainerConfig.async_eval``), so training never pauses for it; the run stops at the
first evaluation >= 475 (``Trainer.stop_value``). The time to threshold is that evaluation's ``elapsed_s`` (for an
asynchronous record: the run's clock when its parameters were sent) minus the ``elapsed_s`` of the evaluation at
iteration 0 (``Trainer.evaluate_at_start``, sent just before acting begins): start-up is left out, and so is the
evaluation time (a synchronous record would have the ``eval_s`` of every evaluation so far subtracted, as
``bench_async.py`` does). The evaluation envs have no added latency by default (``--eval_latency_ms``; an evaluation
is a measurement: 5 CartPole episodes of 500 steps at 20 ms each would take 10-50 s and make training wait for it).
The log's "training waited ... for an evaluation" total, if any, is reported. JSON: ``--out``, default
``tools/bench/results/unroll_scaling_ttt.json``.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONF = os.path.join(REPO, "confs", "ppo_cartpole.gin")
RESULTS = os.path.join(REPO, "tools", "bench", "results")
UNROLL_LENGTH = 32  # TrainerConfig.unroll_length in confs/ppo_cartpole.gin
THRESHOLD = 475.0  # CartPole-v1's reward threshold
SUMMARIES_PER_RUN = 10
TTT_PROCESSES = 4


# ------------------------------------------------------------------------------------------------ running alfish ----
def env_params(latency_s: float, num_envs: int, vectorization: str) -> list[str]:
    """The gin bindings of ``num_envs`` Latency-wrapped CartPole envs."""
    return ["create_environment.env_name='alfish/Latency-v0'",
            f"create_environment.env_kwargs={{'env_name': 'CartPole-v1', 'latency_s': {latency_s}}}",
            f"create_environment.num_parallel_environments={num_envs}",
            f"create_environment.vectorization='{vectorization}'"]


def async_params(num_processes: int) -> list[str]:
    """Asynchronous unroll with ``num_processes`` children, V-trace, parameters pushed every iteration."""
    return ["TrainerConfig.async_unroll=True", "PpoAlgorithm.off_policy_correction='vtrace'",
            "TrainerConfig.unroll_parameter_update_period=1", f"Trainer.num_unroll_processes={num_processes}"]


def run_alfish(params: list[str], prefix: str) -> dict:
    """Train ``confs/ppo_cartpole.gin`` with ``params`` in a fresh process; its root_dir and log (stderr)."""
    root = tempfile.mkdtemp(prefix=prefix)
    cmd = [sys.executable, "-m", "alfish.bin.train", "--conf", CONF, "--root_dir", root]
    for p in params:
        cmd += ["--conf_param", p]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return dict(root=root, log=out.stderr)


def tb_scalars(root: str) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar of ``root/tb`` by tag: ``(step, wall_time, value)`` in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(root, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: sorted((e.step, e.wall_time, e.value) for e in acc.Scalars(tag)) for tag in acc.Tags()["scalars"]}


def median_of(scalars: dict, tag: str) -> float | None:
    values = [v for _, _, v in scalars.get(tag, [])]
    return statistics.median(values) if values else None


def alfish_rate(root: str) -> dict:
    """Env steps/s between the first and the last ``train/env_steps`` record, the learner's busy share, the median
    policy lag and queue length (see the module's docstring)."""
    scalars = tb_scalars(root)
    records = scalars.get("train/env_steps", [])
    if len(records) < 2:
        raise RuntimeError(f"{root}: {len(records)} train/env_steps records; need 2 to time a window")
    (_, t0, s0), (_, t1, s1) = records[0], records[-1]
    train = {step: v for step, _, v in scalars.get("time/train_s", [])}
    unroll = {step: v for step, _, v in scalars.get("time/unroll_s", [])}
    busy = [train[k] / (train[k] + unroll[k]) for k in train if k in unroll and train[k] + unroll[k] > 0]
    return dict(steps_per_s=(s1 - s0) / (t1 - t0), window_env_steps=int(s1 - s0), window_s=t1 - t0,
                learner_busy=statistics.median(busy) if busy else None,
                policy_lag_versions=median_of(scalars, "async/policy_lag_versions"),
                queue_length=median_of(scalars, "async/queue_length"))


# --------------------------------------------------------------------------------------------------- the SB3 peer ----
def make_latency_env(latency_s: float):
    """One ``alfish/Latency-v0`` CartPole (a module-level function: SubprocVecEnv pickles it to its env processes,
    which import alfish.envs here to register the id)."""
    import gymnasium as gym

    import alfish.envs  # noqa: F401  (registers alfish/Latency-v0)

    return gym.make("alfish/Latency-v0", env_name="CartPole-v1", latency_s=latency_s)


def sb3_job(job: dict) -> dict:
    """SB3's PPO at the conf's hyperparameters on ``SubprocVecEnv`` of ``job['num_envs']`` Latency envs, trained for
    ``job['steps']`` env steps; the learn() wall-clock (and per-rollout stamps)."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv

    class Stamps(BaseCallback):
        """(env steps, seconds since learn() began) at the end of every rollout."""

        def __init__(self) -> None:
            super().__init__()
            self.stamps: list[tuple[int, float]] = []

        def _on_rollout_end(self) -> None:
            self.stamps.append((int(self.num_timesteps), time.perf_counter() - start))

        def _on_step(self) -> bool:
            return True

    if job["threads"]:
        torch.set_num_threads(job["threads"])
    env = make_vec_env(functools.partial(make_latency_env, job["latency_s"]), n_envs=job["num_envs"],
                       seed=job["seed"], vec_env_cls=SubprocVecEnv)
    model = PPO("MlpPolicy", env, n_steps=UNROLL_LENGTH, batch_size=256, n_epochs=20, learning_rate=1e-3,
                gamma=0.98, gae_lambda=0.8, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
                policy_kwargs=dict(net_arch=[64, 64], activation_fn=torch.nn.Tanh), seed=job["seed"], verbose=0,
                device="cpu")
    callback = Stamps()
    start = time.perf_counter()
    model.learn(total_timesteps=job["steps"], callback=callback)
    learn_s = time.perf_counter() - start
    env.close()
    return dict(steps=int(model.num_timesteps), learn_s=learn_s, torch_threads=torch.get_num_threads(),
                stamps=callback.stamps)


def run_sb3(latency_s: float, num_envs: int, steps: int, seed: int, threads: int) -> dict:
    """``sb3_job`` in a fresh process (this script with ``--sb3_job``) at ``threads`` torch threads (0: torch's
    default); its result, with env steps/s."""
    job = dict(latency_s=latency_s, num_envs=num_envs, steps=steps, seed=seed, threads=threads)
    cmd = [sys.executable, os.path.abspath(__file__), "--sb3_job", json.dumps(job)]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            return dict(result, steps_per_s=result["steps"] / result["learn_s"])
    raise RuntimeError(f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")


# ----------------------------------------------------------------------------------------------------- throughput ----
def limits(num_processes: int, envs_per_process: int, latency_s: float, vectorization: str) -> tuple[float, float]:
    """(alfish's, SB3's) env steps/s if every step took exactly ``latency_s`` and nothing else took time."""
    parallel_envs = envs_per_process if vectorization == "async" else 1  # envs of one process stepping together
    return num_processes * parallel_envs / latency_s, num_processes * envs_per_process / latency_s


def plan_run(limit: float, seconds: float, num_envs: int) -> tuple[int, int]:
    """(env steps, summary interval in iterations): about ``seconds`` at ``limit``, whole iterations, a multiple of
    the interval (so the last iteration writes a summary), at least 2 summaries."""
    per_iteration = num_envs * UNROLL_LENGTH
    iterations = max(2, round(limit * seconds / per_iteration))
    interval = max(1, iterations // SUMMARIES_PER_RUN)
    iterations = max(2 * interval, round(iterations / interval) * interval)
    return iterations * per_iteration, interval


def throughput_params(latency_s: float, num_processes: int, num_envs: int, vectorization: str, steps: int,
                      interval: int, extra: list[str]) -> list[str]:
    """Bindings of one throughput run (module docstring)."""
    return env_params(latency_s, num_envs, vectorization) + async_params(num_processes) + [
        "TrainerConfig.evaluate=False", "TrainerConfig.num_checkpoints=0", "TrainerConfig.num_iterations=0",
        f"TrainerConfig.num_env_steps={steps}", f"TrainerConfig.summary_interval={interval}",
        "TrainerConfig.summarize_first_interval=False", "TrainerConfig.random_seed=0"] + extra


def measure_cell(latency_ms: float, num_processes: int, args: argparse.Namespace) -> dict:
    """Every run of one (latency, N), alternating alfish and SB3 ``args.repeats`` times; the medians and the runs."""
    latency_s, num_envs = latency_ms / 1000.0, num_processes * args.envs_per_process
    limit, sb3_limit = limits(num_processes, args.envs_per_process, latency_s, args.vectorization)
    steps, interval = plan_run(limit, args.seconds, num_envs)
    params = throughput_params(latency_s, num_processes, num_envs, args.vectorization, steps, interval,
                               args.alfish_param)
    runs = dict(alfish=[], sb3=[])
    for _ in range(args.repeats):
        run = run_alfish(params, f"bench-unroll-{num_processes}-")
        runs["alfish"].append(alfish_rate(run["root"]))
        cleanup(run["root"], args.keep_runs)
        if not args.no_sb3:
            runs["sb3"].append(run_sb3(latency_s, num_envs, steps, seed=0, threads=args.sb3_threads))
    cell = dict(latency_ms=latency_ms, processes=num_processes, envs=num_envs, env_steps=steps, limit=limit,
                sb3_limit=sb3_limit, runs=runs,
                alfish=statistics.median(r["steps_per_s"] for r in runs["alfish"]),
                learner_busy=median_or_none([r["learner_busy"] for r in runs["alfish"]]),
                sb3=median_or_none([r["steps_per_s"] for r in runs["sb3"]]))
    print(cell_line(cell), flush=True)
    return cell


def median_or_none(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def cleanup(root: str, keep: bool) -> None:
    """Remove a run's root_dir unless ``--keep_runs``."""
    if keep:
        print(f"  (run kept in {root})", flush=True)
    else:
        shutil.rmtree(root, ignore_errors=True)


def cell_line(cell: dict) -> str:
    """One line per (latency, N) as it finishes, with every run's figure."""
    alfish = [round(r["steps_per_s"], 1) for r in cell["runs"]["alfish"]]
    sb3 = [round(r["steps_per_s"], 1) for r in cell["runs"]["sb3"]]
    return (f"[{cell['latency_ms']:g} ms, N={cell['processes']}, {cell['envs']} envs, {cell['env_steps']} env steps] "
            f"limit {cell['limit']:.0f}: alfish {alfish} env steps/s, SB3 {sb3 or 'skipped'}")


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "" if value is None else f"{value:{spec}}{suffix}"


def throughput_table(cells: list[dict]) -> str:
    """The markdown table of the medians."""
    split_limit = any(c["limit"] != c["sb3_limit"] for c in cells)
    head = ["latency ms", "N", "envs", "limit steps/s", "alfish steps/s", "alfish % of limit", "learner busy",
            "SB3 steps/s", "SB3 % of limit", "alfish/SB3"] + (["SB3 limit steps/s"] if split_limit else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for c in cells:
        sb3 = c["sb3"]
        row = [f"{c['latency_ms']:g}", str(c["processes"]), str(c["envs"]), f"{c['limit']:.0f}",
               f"{c['alfish']:.1f}", f"{100 * c['alfish'] / c['limit']:.0f}%",
               fmt(None if c["learner_busy"] is None else 100 * c["learner_busy"], ".0f", "%"), fmt(sb3, ".1f"),
               fmt(None if sb3 is None else 100 * sb3 / c["sb3_limit"], ".0f", "%"),
               fmt(None if not sb3 else c["alfish"] / sb3, ".2f")] + ([f"{c['sb3_limit']:.0f}"] if split_limit else [])
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def throughput(args: argparse.Namespace) -> dict:
    """The throughput part: every (latency, N) cell, the table, the JSON."""
    print(f"conf {CONF}; {args.envs_per_process} env(s) per process, vectorization '{args.vectorization}'; "
          f"about {args.seconds:g} s per run at the limit; medians of {args.repeats}; SB3 at "
          f"{args.sb3_threads or 'torch default'} thread(s)", flush=True)
    cells = [measure_cell(latency_ms, n, args) for latency_ms in args.latencies_ms for n in args.processes]
    print("\n" + throughput_table(cells), flush=True)
    return dict(part="throughput", envs_per_process=args.envs_per_process, vectorization=args.vectorization,
                sb3_threads=args.sb3_threads,
                seconds=args.seconds, repeats=args.repeats, alfish_params=args.alfish_param, cells=cells)


# ----------------------------------------------------------------------------------------------- time to threshold ----
def ttt_params(mode: str, args: argparse.Namespace, seed: int) -> list[str]:
    """Bindings of one time-to-threshold run: ``mode`` 'sync' (4 envs, async vectorization) or 'async' (4 unroll
    processes, 1 env each)."""
    latency_s, eval_latency_s = args.ttt_latency_ms / 1000.0, args.eval_latency_ms / 1000.0
    if mode == "sync":
        params = env_params(latency_s, TTT_PROCESSES, "async") + ["TrainerConfig.async_unroll=False"]
    else:
        params = env_params(latency_s, TTT_PROCESSES, "sync") + async_params(TTT_PROCESSES)
    params += [f"eval/create_environment.env_kwargs={{'env_name': 'CartPole-v1', 'latency_s': {eval_latency_s}}}",
               f"eval/create_environment.vectorization='{'async' if eval_latency_s else 'sync'}'"]
    return params + [
        "TrainerConfig.evaluate=True", f"TrainerConfig.eval_interval={args.eval_interval}",
        "TrainerConfig.num_eval_episodes=5", "Trainer.evaluate_at_start=True", f"Trainer.stop_value={THRESHOLD}",
        "Trainer.keep_best_checkpoint=False", "TrainerConfig.num_checkpoints=0", "TrainerConfig.num_iterations=0",
        f"TrainerConfig.num_env_steps={args.max_env_steps}", f"TrainerConfig.random_seed={seed}"] + args.alfish_param


def eval_curve(root: str) -> list[tuple[int, float, float]]:
    """(env steps, training seconds since acting began, return) per evaluation (module docstring)."""
    records = [json.loads(line) for line in open(os.path.join(root, "eval_log.jsonl")) if line.strip()]
    out, eval_total, origin = [], 0.0, None
    for rec in records:
        if not rec.get("asynchronous"):
            eval_total += rec.get("eval_s", 0.0)  # a synchronous evaluation paused training: take its time out
        elapsed = rec["elapsed_s"] - eval_total
        origin = elapsed if origin is None else origin  # the evaluation at iteration 0: acting begins
        out.append((rec["env_steps"], elapsed - origin, rec["average_return"]))
    return out


def ttt_result(mode: str, seed: int, run: dict) -> dict:
    """Time to the threshold (or None), the env steps there, the best and last evaluation of one run."""
    curve = eval_curve(run["root"])
    first = next(((s, t) for s, t, r in curve if r >= THRESHOLD), None)
    waited = re.search(r"training waited ([\d.]+) s in all", run["log"])
    return dict(mode=mode, seed=seed, time_s=first[1] if first else None, env_steps=first[0] if first else None,
                best_return=max(r for _, _, r in curve), final_env_steps=curve[-1][0], final_time_s=curve[-1][1],
                eval_wait_s=float(waited.group(1)) if waited else 0.0, curve=curve)


def reached_text(result: dict) -> str:
    return "not reached" if result["time_s"] is None else f"{result['time_s']:.1f} s"


def ttt_table(results: list[dict]) -> str:
    """The markdown table of every time-to-threshold run."""
    names = {"sync": "PPO sync, 4 envs (async vectorization)",
             "async": f"PPO + V-trace async, {TTT_PROCESSES} processes x 1 env"}
    lines = [f"| mode | seed | wall-clock to eval >= {THRESHOLD:g} | env steps then | best eval return | "
             "env steps run | training wall-clock | waited for evals |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        reached = r["time_s"] is not None
        lines.append(f"| {names[r['mode']]} | {r['seed']} | {reached_text(r)} | {r['env_steps'] if reached else ''} | "
                     f"{r['best_return']:.1f} | {r['final_env_steps']} | {r['final_time_s']:.1f} s | "
                     f"{r['eval_wait_s']:.1f} s |")
    return "\n".join(lines)


def time_to_threshold(args: argparse.Namespace) -> dict:
    """The time-to-threshold part: sync and async alternating per seed, the table, the JSON."""
    print(f"time to eval >= {THRESHOLD:g}: {args.ttt_latency_ms:g} ms env, eval every {args.eval_interval} "
          f"iterations ({args.eval_latency_ms:g} ms eval env), at most {args.max_env_steps} env steps, "
          f"{args.seeds} seed(s)", flush=True)
    results = []
    for seed in range(args.seeds):
        for mode in ("sync", "async"):
            run = run_alfish(ttt_params(mode, args, seed), f"bench-unroll-ttt-{mode}-")
            results.append(ttt_result(mode, seed, run))
            r = results[-1]
            at = "" if r["time_s"] is None else f", {r['env_steps']} env steps"
            print(f"[{mode}, seed {seed}] {reached_text(r)}{at}; evals (env steps, s, return) "
                  f"{[(s, round(t, 1), round(v)) for s, t, v in r['curve']]}", flush=True)
            cleanup(run["root"], args.keep_runs)
    print("\n" + ttt_table(results), flush=True)
    return dict(part="time_to_threshold", threshold=THRESHOLD, latency_ms=args.ttt_latency_ms,
                eval_latency_ms=args.eval_latency_ms, eval_interval=args.eval_interval,
                max_env_steps=args.max_env_steps, alfish_params=args.alfish_param, runs=results)


# ------------------------------------------------------------------------------------------------------------ main ----
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latencies_ms", type=float, nargs="+", default=[5.0, 20.0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8], help="values of N")
    parser.add_argument("--envs_per_process", type=int, default=1, help="E: envs per unroll process")
    parser.add_argument("--vectorization", choices=["sync", "async"], default="sync",
                        help="how a process steps its E envs (create_environment.vectorization)")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of a run at the limit")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no_sb3", action="store_true", help="skip the SB3 peer")
    parser.add_argument("--sb3_threads", type=int, default=0,
                        help="SB3's torch threads (0: torch's default, one per core; 1 on a shared machine)")
    parser.add_argument("--time_to_threshold", action="store_true", help="run the time-to-threshold part instead")
    parser.add_argument("--seeds", type=int, default=1, help="time to threshold: seeds 0 .. SEEDS-1")
    parser.add_argument("--max_env_steps", type=int, default=100000, help="time to threshold: the cap")
    parser.add_argument("--ttt_latency_ms", type=float, default=20.0, help="time to threshold: the env's latency")
    parser.add_argument("--eval_latency_ms", type=float, default=0.0, help="time to threshold: the eval env's")
    parser.add_argument("--eval_interval", type=int, default=5, help="time to threshold: iterations between evals")
    parser.add_argument("--alfish_param", action="append", default=[], help="an extra gin binding for alfish")
    parser.add_argument("--keep_runs", action="store_true", help="keep the runs' root_dirs (printed)")
    parser.add_argument("--out", default=None, help="the JSON of all results (default: tools/bench/results/"
                                                    "unroll_scaling.json, or unroll_scaling_ttt.json)")
    parser.add_argument("--sb3_job", default=None, help=argparse.SUPPRESS)  # internal: one SB3 run, as JSON
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.sb3_job:
        print("RESULT " + json.dumps(sb3_job(json.loads(args.sb3_job))), flush=True)
        return
    result = time_to_threshold(args) if args.time_to_threshold else throughput(args)
    out = args.out or os.path.join(RESULTS, "unroll_scaling_ttt.json" if args.time_to_threshold else
                                   "unroll_scaling.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"results written to {out}", flush=True)


if __name__ == "__main__":
    main()
