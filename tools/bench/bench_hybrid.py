"""Hybrid vs online: env steps SAC needs to reach an evaluation return threshold on Pendulum-v1, with and without a
logged dataset mixed into its batches (confs/sac_pendulum_hybrid.gin, RLPD's 50/50) - same seeds, same budget.

    python tools/bench/bench_hybrid.py [--seeds 0 1 2] [--threshold -200] [--num_env_steps 10000]
                                       [--dataset runs/datasets/pendulum_medium_10k.npz] [--out result.json]

Each run is ``python -m alfish.bin.train`` in its own process (one at a time: the machine's cores are shared);
evaluations every ``--eval_interval`` env steps (5 episodes). The dataset is made once if missing
(``scripts/pendulum_dataset.py``: 10k steps of a noisy scripted controller). Prints a table and medians.
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
sys.path.insert(0, os.path.join(REPO, "scripts"))
from pendulum_dataset import make_pendulum_dataset  # noqa: E402

CONFS = {"online": "confs/sac_pendulum.gin", "hybrid": "confs/sac_pendulum_hybrid.gin"}


def first_reaching(root: str, threshold: float) -> tuple[int | None, list]:
    with open(os.path.join(root, "eval_log.jsonl")) as f:
        evals = [json.loads(line) for line in f if line.strip()]
    for e in evals:
        if e["average_return"] >= threshold:
            return int(e["env_steps"]), evals
    return None, evals


def run(mode: str, seed: int, args, work: str) -> dict:
    root = os.path.join(work, f"{mode}-{seed}")
    cmd = [sys.executable, "-m", "alfish.bin.train", "--conf", CONFS[mode], "--root_dir", root,
           "--conf_param", f"TrainerConfig.random_seed={seed}",
           "--conf_param", f"TrainerConfig.num_env_steps={args.num_env_steps}",
           "--conf_param", f"TrainerConfig.eval_interval={args.eval_interval}",
           "--conf_param", "TrainerConfig.num_checkpoints=0"]
    if mode == "hybrid":
        cmd += ["--conf_param", f"DATASET='{args.dataset}'"]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} seed {seed} failed:\n{proc.stderr[-2000:]}")
    reached, evals = first_reaching(root, args.threshold)
    return {"mode": mode, "seed": seed, "env_steps_to_threshold": reached, "final_return": evals[-1]["average_return"],
            "wall_s": round(time.monotonic() - start, 1), "returns": [(e["env_steps"], e["average_return"])
                                                                       for e in evals]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threshold", type=float, default=-200.0)
    parser.add_argument("--num_env_steps", type=int, default=10000)
    parser.add_argument("--eval_interval", type=int, default=500, help="iterations (= env steps) between evaluations")
    parser.add_argument("--dataset", default=os.path.join(REPO, "runs/datasets/pendulum_medium_10k.npz"))
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    if not os.path.exists(args.dataset):
        os.makedirs(os.path.dirname(args.dataset), exist_ok=True)
        print("dataset:", json.dumps(make_pendulum_dataset(args.dataset, 10000, 1.5, 0)), flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_hybrid-") as work:
        for seed in args.seeds:
            for mode in CONFS:
                r = run(mode, seed, args, work)
                results.append(r)
                print(f"{mode:7s} seed {seed}: threshold {args.threshold} at {r['env_steps_to_threshold']} env steps; "
                      f"final {r['final_return']:.1f}; {r['wall_s']} s", flush=True)
    print(f"\nenv steps to reach {args.threshold} (budget {args.num_env_steps}; not reached counts as the budget):")
    medians = {}
    for mode in CONFS:
        steps = [r["env_steps_to_threshold"] or args.num_env_steps for r in results if r["mode"] == mode]
        medians[mode] = statistics.median(steps)
        print(f"  {mode:7s} median {medians[mode]:>7.0f}   per seed {steps}")
    print(f"  hybrid / online: {medians['hybrid'] / medians['online']:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results, "medians": medians}, f, indent=1)


if __name__ == "__main__":
    main()
