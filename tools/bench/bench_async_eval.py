"""Training wall-clock with asynchronous against synchronous evaluation, same conf and iterations otherwise.

    python tools/bench/bench_async_eval.py --threads 1            # BC on Pendulum: evaluation is ~40% of the time
    python tools/bench/bench_async_eval.py                        # the same with the conf's threads ('auto')
    python tools/bench/bench_async_eval.py --conf confs/sac_pendulum.gin --iterations 2000 --threads 1

Each run is ``python -m alfish.bin.train`` in a fresh process with ``TrainerConfig.async_eval`` True or False,
alternating the modes ``--repeats`` times; printed: the median wall-clock of the whole command per mode, the number
of evaluations (they must be equal: async evaluates every due iteration too) and the time the synchronous runs spent
evaluating (``eval_s`` summed over eval_log.jsonl). The pure offline conf (``confs/bc_pendulum.gin``) needs its
dataset; it is made first if missing (``scripts/pendulum_dataset.py``, 20k steps, noise 1.5).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATASET = os.path.join(REPO, "runs", "datasets", "pendulum_medium.npz")


def run(conf: str, async_eval: bool, iterations: int, eval_interval: int, episodes: int, threads: int,
        extra: list[str]) -> dict:
    root = tempfile.mkdtemp(prefix=f"bench-async-eval-{int(async_eval)}-")
    offline = "bc_pendulum" in conf or "iql_pendulum" in conf
    params = [f"TrainerConfig.async_eval={async_eval}", f"TrainerConfig.eval_interval={eval_interval}",
              f"TrainerConfig.num_eval_episodes={episodes}", "TrainerConfig.num_checkpoints=0",
              "TrainerConfig.summary_interval=1000"]
    if offline:
        params += [f"NUM_ITERATIONS={iterations}"]
    else:
        params += ["TrainerConfig.num_env_steps=0", f"TrainerConfig.num_iterations={iterations}"]
    if threads:
        params.append(f"Trainer.num_threads={threads}")
    cmd = [sys.executable, "-m", "alfish.bin.train", "--conf", conf, "--root_dir", root]
    for p in params + extra:
        cmd += ["--conf_param", p]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads or 1))
    start = time.monotonic()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600, env=env)
    wall = time.monotonic() - start
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    records = [json.loads(line) for line in open(os.path.join(root, "eval_log.jsonl")) if line.strip()]
    return dict(wall=wall, evals=len(records), eval_s=sum(r["eval_s"] for r in records),
                last_return=records[-1]["average_return"], cmd=cmd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default=os.path.join(REPO, "confs", "bc_pendulum.gin"))
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--eval_interval", type=int, default=200)
    parser.add_argument("--episodes", type=int, default=50, help="TrainerConfig.num_eval_episodes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="Trainer.num_threads (0: the conf's)")
    parser.add_argument("--conf_param", action="append", default=[], help="extra gin binding (repeatable)")
    args = parser.parse_args()
    if "bc_pendulum" in args.conf and not os.path.exists(DATASET):
        subprocess.run([sys.executable, os.path.join(REPO, "scripts", "pendulum_dataset.py"), "--out", DATASET,
                        "--num_steps", "20000", "--noise", "1.5"], cwd=REPO, check=True)
    print(f"conf {args.conf}: {args.iterations} iterations, an evaluation of {args.episodes} episodes every "
          f"{args.eval_interval}; {os.cpu_count()} CPUs", flush=True)
    results: dict[bool, list[dict]] = {False: [], True: []}
    for i in range(args.repeats):
        for async_eval in (False, True):
            r = run(args.conf, async_eval, args.iterations, args.eval_interval, args.episodes, args.threads,
                    args.conf_param)
            results[async_eval].append(r)
            print(f"  repeat {i + 1} {'async' if async_eval else 'sync '}: {r['wall']:.1f} s wall, {r['evals']} "
                  f"evaluations ({r['eval_s']:.1f} s evaluating), final return {r['last_return']:.1f}", flush=True)
    print("command:", " ".join(results[True][0]["cmd"]))
    sync_wall = statistics.median(r["wall"] for r in results[False])
    async_wall = statistics.median(r["wall"] for r in results[True])
    sync_eval = statistics.median(r["eval_s"] for r in results[False])
    print(f"median wall-clock: sync {sync_wall:.1f} s (of which evaluating {sync_eval:.1f} s), "
          f"async {async_wall:.1f} s; async/sync {async_wall / sync_wall:.2f}")
    assert {r["evals"] for r in results[True]} == {r["evals"] for r in results[False]}, "evaluation counts differ"


if __name__ == "__main__":
    main()
