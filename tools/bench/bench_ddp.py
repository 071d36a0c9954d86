"""Data-parallel training on this machine's CPU: 2 torchrun ranks (gloo, 1 thread each) against 1 process (1 and 2
threads), same conf otherwise, in two comparisons:

- fixed per-rank work (how alfish and ALF scale, ``num_parallel_environments`` and ``mini_batch_size`` being per
  rank): each rank runs the 1-process run's envs and mini-batch size, so the job steps twice the envs and each update
  averages the gradients of twice the sequences; ideal scaling doubles the env steps/s at the same iterations/s.
- fixed global batch (the same job totals): each rank runs half the envs and half the mini-batch, so the job does
  the 1-process run's work per iteration; ideal scaling doubles the iterations/s.

    python tools/bench/bench_ddp.py [--algos sac ppo] [--repeats 3] [--scale 1.0]

Every layout runs the same number of iterations (``num_env_steps`` scales with the job's envs; ``--scale`` shortens
or lengthens all runs). Prints the median env steps/s and iterations/s (from the runs' TensorBoard ``time/*``
scalars, start-up excluded) of each layout and the ratios to the 1-process, 1-thread run.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Job:
    """One algorithm's run in a single process: conf, envs, mini-batch size, env steps, extra bindings."""

    conf: str
    envs: int
    mini_batch_size: int
    env_steps: int
    extra: tuple[str, ...] = ()


JOBS = {
    "sac": Job("confs/sac_pendulum.gin", envs=2, mini_batch_size=256, env_steps=3000,
               extra=("TrainerConfig.initial_collect_steps=200",)),
    "ppo": Job("confs/ppo_cartpole.gin", envs=8, mini_batch_size=256, env_steps=40960),
}


@dataclasses.dataclass(frozen=True)
class Layout:
    """``ranks`` processes of ``threads`` threads; ``split``: the 1-process run's envs and mini-batch are divided
    among the ranks (fixed global batch) instead of given to each rank (fixed per-rank work)."""

    name: str
    ranks: int
    threads: int
    split: bool = False

    def bindings(self, job: Job, scale: float) -> list[str]:
        per_rank = self.ranks if self.split else 1
        envs, batch = job.envs // per_rank, job.mini_batch_size // per_rank
        job_envs = envs * self.ranks  # num_env_steps counts over all ranks: the same iterations in every layout
        return list(job.extra) + [f"create_environment.num_parallel_environments={envs}",
                                  f"TrainerConfig.mini_batch_size={batch}",
                                  f"TrainerConfig.num_env_steps={int(job.env_steps * scale * job_envs / job.envs)}",
                                  "TrainerConfig.num_iterations=0", "TrainerConfig.evaluate=False",
                                  "TrainerConfig.num_checkpoints=0", "TrainerConfig.summary_interval=10",
                                  f"Trainer.num_threads={self.threads}"]


LAYOUTS = (Layout("1 process x 1 thread", 1, 1), Layout("1 process x 2 threads", 1, 2),
           Layout("2 ranks x 1 thread, per-rank work fixed", 2, 1),
           Layout("2 ranks x 1 thread, global batch fixed", 2, 1, split=True))


def run(job: Job, layout: Layout, scale: float) -> dict:
    root = tempfile.mkdtemp(prefix=f"bench-ddp-{layout.ranks}-")
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={layout.ranks}"]
                if layout.ranks > 1 else [sys.executable])
    cmd = launcher + ["-m", "alfish.bin.train", "--conf", os.path.join(REPO, job.conf), "--root_dir", root]
    for p in layout.bindings(job, scale):
        cmd += ["--conf_param", p]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600,
                         env=dict(os.environ, OMP_NUM_THREADS=str(layout.threads)))
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
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every run's env steps")
    args = parser.parse_args()
    for algo in args.algos:
        job = JOBS[algo]
        results = {layout: [] for layout in LAYOUTS}
        for _ in range(args.repeats):
            for layout in LAYOUTS:  # interleaved, so a slower spell of the machine hits every layout
                results[layout].append(run(job, layout, args.scale))
        med = {layout: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for layout, rs in results.items()}
        base = med[LAYOUTS[0]]
        for layout, m in med.items():
            print(f"[{algo}] {layout.name}: env steps/s {m['env_steps_per_s']:.0f} "
                  f"({m['env_steps_per_s'] / base['env_steps_per_s']:.2f}x), iterations/s "
                  f"{m['iterations_per_s']:.1f} ({m['iterations_per_s'] / base['iterations_per_s']:.2f}x)",
                  flush=True)


if __name__ == "__main__":
    main()
