"""Data-parallel training on this machine's CPU: 2 torchrun ranks (gloo, 1 thread each) against 1 process (1 and 2
threads), same job totals (envs, mini-batch size), same conf otherwise.

    python tools/bench/bench_ddp.py [--algos sac ppo] [--repeats 3]

Prints the median env steps/s and updates/s (from the runs' TensorBoard `time/*` scalars, start-up excluded) of each
layout and the ratios to the 1-process runs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOBS = {
    # conf, extra bindings, env steps, updates per iteration
    "sac": ("confs/sac_pendulum.gin", ["create_environment.num_parallel_environments=2",
                                       "TrainerConfig.initial_collect_steps=200"], 3000, 1),
    "ppo": ("confs/ppo_cartpole.gin", [], 40960, None),
}


def run(algo: str, ranks: int, threads: int) -> dict:
    conf, extra, steps, _ = JOBS[algo]
    root = tempfile.mkdtemp(prefix=f"bench-ddp-{algo}-{ranks}-")
    params = extra + [f"TrainerConfig.num_env_steps={steps}", "TrainerConfig.evaluate=False",
                      "TrainerConfig.num_checkpoints=0", "TrainerConfig.summary_interval=10",
                      f"Trainer.num_threads={threads}"]
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
                if ranks > 1 else [sys.executable])
    cmd = launcher + ["-m", "alfish.bin.train", "--conf", os.path.join(REPO, conf), "--root_dir", root]
    for p in params:
        cmd += ["--conf_param", p]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600,
                         env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(root, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    rates = {tag: statistics.median([e.value for e in acc.Scalars(tag)][1:] or [0.0])
             for tag in ("time/env_steps_per_s", "time/iterations_per_s")}
    return dict(env_steps_per_s=rates["time/env_steps_per_s"], iterations_per_s=rates["time/iterations_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=["sac", "ppo"], choices=sorted(JOBS))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    layouts = [(1, 1), (1, 2), (2, 1)]  # (ranks, threads per rank)
    for algo in args.algos:
        results = {layout: [] for layout in layouts}
        for _ in range(args.repeats):
            for layout in layouts:
                results[layout].append(run(algo, *layout))
        med = {layout: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for layout, rs in results.items()}
        base = med[(1, 1)]
        for (ranks, threads), m in med.items():
            print(f"[{algo}] {ranks} rank(s) x {threads} thread(s): env steps/s {m['env_steps_per_s']:.0f} "
                  f"({m['env_steps_per_s'] / base['env_steps_per_s']:.2f}x), iterations/s "
                  f"{m['iterations_per_s']:.1f} ({m['iterations_per_s'] / base['iterations_per_s']:.2f}x)",
                  flush=True)


if __name__ == "__main__":
    main()
