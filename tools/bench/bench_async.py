"""Asynchronous against synchronous unroll, same conf otherwise, in the same run.

    python tools/bench/bench_async.py [--conf confs/sac_pendulum_realtime.gin] [--repeats 3] [--learn]
    python tools/bench/bench_async.py --latency_s 0 ...   # the fast-env case: no added latency

Throughput: ``--throughput_steps`` env steps without evaluation, each mode in a fresh process, alternating
sync/async ``--repeats`` times; median env steps/s and the ratio async/sync.
Learning (``--learn``): one run per mode with a 5-episode evaluation every 500 env steps; wall-clock of training to
the first evaluation at or above ``--threshold``, *excluding the time spent evaluating* (the evaluation envs have the
same latency and evaluation is a measurement, not training), plus the policy lag async reported.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(conf: str, async_unroll: bool, steps: int, latency_s: float, evaluate: bool, seed: int,
        threads: int = 0) -> dict:
    root = tempfile.mkdtemp(prefix=f"bench-async-{int(async_unroll)}-")
    params = [f"TrainerConfig.async_unroll={async_unroll}", f"TrainerConfig.num_env_steps={steps}",
              f"TrainerConfig.random_seed={seed}", "TrainerConfig.num_checkpoints=0",
              f"TrainerConfig.evaluate={evaluate}", "TrainerConfig.summary_interval=100",
              f"create_environment.env_kwargs={{'env_name': 'Pendulum-v1', 'latency_s': {latency_s}}}"]
    if threads:
        params.append(f"Trainer.num_threads={threads}")
    cmd = [sys.executable, "-m", "alfish.bin.train", "--conf", conf, "--root_dir", root]
    for p in params:
        cmd += ["--conf_param", p]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600,
                         env=dict(os.environ, OMP_NUM_THREADS=str(threads or 1)))
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return dict(root=root, log=out.stderr)


def scalars(root: str) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(root, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def throughput(root: str) -> float:
    """Median of the logged env steps/s after the first summary (the warm-up and start-up are left out)."""
    rates = scalars(root).get("time/env_steps_per_s", [])
    return statistics.median(rates[1:] or rates)


def learning_curve(root: str) -> list[tuple[int, float, float]]:
    """(env steps, training wall-clock without evaluations, return) per evaluation."""
    out, eval_total = [], 0.0
    for line in open(os.path.join(root, "eval_log.jsonl")):
        rec = json.loads(line)
        eval_total += rec.get("eval_s", 0.0)
        out.append((rec["env_steps"], rec["elapsed_s"] - eval_total, rec["average_return"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default=os.path.join(REPO, "confs", "sac_pendulum_realtime.gin"))
    parser.add_argument("--latency_s", type=float, default=0.005)
    parser.add_argument("--repeats", type=int, default=3, help="throughput runs per mode (0: skip)")
    parser.add_argument("--throughput_steps", type=int, default=2000)
    parser.add_argument("--learn", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="trainer torch threads (0: the conf's)")
    parser.add_argument("--learn_steps", type=int, default=10000)
    parser.add_argument("--threshold", type=float, default=-200.0)
    args = parser.parse_args()
    print(f"conf {args.conf}, extra env-step latency {args.latency_s * 1000:g} ms", flush=True)
    if args.repeats:
        rates = {False: [], True: []}
        for _ in range(args.repeats):
            for mode in (False, True):
                rates[mode].append(throughput(run(args.conf, mode, args.throughput_steps, args.latency_s, False,
                                                  seed=0, threads=args.threads)["root"]))
        med = {m: statistics.median(v) for m, v in rates.items()}
        print(f"env steps/s, median of {args.repeats}: sync {med[False]:.0f}, async {med[True]:.0f}, ratio "
              f"async/sync {med[True] / med[False]:.2f} (all: sync {[round(x) for x in rates[False]]}, async "
              f"{[round(x) for x in rates[True]]})", flush=True)
    if args.learn:
        reached = {}
        for mode in (False, True):
            root = run(args.conf, mode, args.learn_steps, args.latency_s, True, seed=0, threads=args.threads)["root"]
            curve = learning_curve(root)
            first = next(((s, t) for s, t, r in curve if r >= args.threshold), None)
            reached[mode] = first
            name = "async" if mode else "sync"
            print(f"{name}: first eval >= {args.threshold:g} at "
                  f"{'never' if first is None else f'{first[0]} env steps, {first[1]:.0f} s of training'}; "
                  f"final {curve[-1][2]:.1f}; curve {[(s, round(t), round(r)) for s, t, r in curve]}", flush=True)
            if mode:
                tb = scalars(root)
                for tag in ("async/policy_lag_versions", "async/policy_lag_iterations", "async/queue_length",
                            "async/env_step_ms"):
                    values = tb.get(tag, [])
                    if values:
                        print(f"  {tag}: median {statistics.median(values):.2f}, max {max(values):.2f}", flush=True)
        if reached[False] and reached[True]:
            print(f"training wall-clock to {args.threshold:g}, async/sync: {reached[True][1] / reached[False][1]:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
