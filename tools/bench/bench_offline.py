"""Offline RL against d3rlpy: IQL and BC on the same Pendulum-v1 dataset, the same number of gradient steps, each
framework at its default settings (256x256 networks, batch 256): gradient steps/s and the final normalized return.

    python tools/bench/bench_offline.py [--gradient_steps 10000] [--algos iql bc] [--repeats 1]
        [--dataset runs/datasets/pendulum_medium.npz] [--d3rlpy_python /work/d3rlpy-venv/bin/python]

alfish trains with its shipped confs (confs/iql_pendulum.gin, confs/bc_pendulum.gin: pure offline, d3rlpy's
hyperparameters; one update per iteration) through ``python -m alfish.bin.train``; its rate is the median of the
TensorBoard ``time/iterations_per_s`` over the 500-iteration summary windows after the first (the whole loop:
sampling, update, summaries; evaluation off), and the return is ``python -m alfish.bin.play``'s average over 10
greedy episodes. d3rlpy runs in its own virtual environment (it pins gymnasium 1.0 and the old gym):
``tools/bench/d3rlpy_side.py``; its rate is the median over 500-step windows stamped in ``fit``'s per-step
callback. Normalized return: 100 * (R - R_random) / (R_expert - R_random) with Pendulum-v1's R_random = -1200,
R_expert = -150 (both sides).
The dataset is made once if missing (``scripts/pendulum_dataset.py``: 20k steps of a noisy scripted controller, ~-280).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts"))
from pendulum_dataset import make_pendulum_dataset  # noqa: E402

R_RANDOM, R_EXPERT = -1200.0, -150.0
CONFS = {"iql": "confs/iql_pendulum.gin", "bc": "confs/bc_pendulum.gin"}


def normalized(ret: float) -> float:
    return 100.0 * (ret - R_RANDOM) / (R_EXPERT - R_RANDOM)


def tb_iteration_rates(root: str) -> list[float]:
    """``time/iterations_per_s`` of each summary window (500 iterations: the confs' summary_interval), in order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(root, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("time/iterations_per_s")]


def alfish_side(algo: str, args, work: str, threads: str, seed: int) -> dict:
    root = os.path.join(work, f"alfish-{algo}-{threads}")
    steps = args.gradient_steps
    cmd = [sys.executable, "-m", "alfish.bin.train", "--conf", CONFS[algo], "--root_dir", root,
           "--conf_param", f"DATASET='{args.dataset}'", "--conf_param", f"NUM_ITERATIONS={steps}",
           "--conf_param", "TrainerConfig.evaluate=False", "--conf_param", f"TrainerConfig.random_seed={seed}",
           "--conf_param", "TrainerConfig.num_checkpoints=1",
           "--conf_param", f"Trainer.num_threads={threads if threads != 'auto' else repr(threads)}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"alfish {algo} failed:\n{proc.stderr[-2000:]}")
    used = re.search(r"Trainer.num_threads=\S+: (\d+) torch thread", proc.stderr)
    windows = tb_iteration_rates(root)[1:]  # (the first window holds the start-up)
    play = subprocess.run([sys.executable, "-m", "alfish.bin.play", "--root_dir", root, "--num_episodes",
                           str(args.eval_episodes), "--seed", str(1000 + seed)],
                          cwd=REPO, capture_output=True, text=True)
    if play.returncode != 0:
        raise RuntimeError(f"alfish play {algo} failed:\n{play.stderr[-2000:]}")
    average = float(re.search(r"average return over \d+ episodes: (-?[\d.]+)", play.stdout).group(1))
    return {"framework": "alfish", "algo": algo, "gradient_steps": steps,
            "grad_steps_per_s": statistics.median(windows),
            "threads": int(used.group(1)) if used else threads, "eval_return_mean": average,
            "normalized_return": normalized(average)}


def d3rlpy_side(algo: str, args, work: str, threads: int, seed: int) -> dict:
    out = os.path.join(work, f"d3rlpy-{algo}-{threads}.json")
    cmd = [args.d3rlpy_python, os.path.join(HERE, "d3rlpy_side.py"), "--dataset", args.dataset, "--algo", algo,
           "--gradient_steps", str(args.gradient_steps), "--env", "Pendulum-v1", "--eval_episodes",
           str(args.eval_episodes), "--seed", str(seed), "--out", out, "--threads", str(threads)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"d3rlpy {algo} failed:\n{proc.stderr[-2000:]}")
    with open(out) as f:
        result = json.load(f)
    # like for like with alfish's figure: the median over 500-step windows
    result["grad_steps_per_s_overall"] = result["grad_steps_per_s"]
    result["grad_steps_per_s"] = result["grad_steps_per_s_median_window"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gradient_steps", type=int, default=10000)
    parser.add_argument("--algos", nargs="+", default=["iql", "bc"], choices=sorted(CONFS))
    parser.add_argument("--repeats", type=int, default=1, help="runs per algorithm, with seeds 0, 1, ...")
    parser.add_argument("--eval_episodes", type=int, default=10)
    parser.add_argument("--dataset", default=os.path.join(REPO, "runs/datasets/pendulum_medium.npz"))
    parser.add_argument("--d3rlpy_python", default="/work/d3rlpy-venv/bin/python")
    parser.add_argument("--equal_threads", type=int, default=0,
                        help="also run both at this many torch threads (0: each at its default only)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.dataset = os.path.abspath(args.dataset)
    if not os.path.exists(args.dataset):
        os.makedirs(os.path.dirname(args.dataset), exist_ok=True)
        print("dataset:", json.dumps(make_pendulum_dataset(args.dataset, 20000, 1.5, 0)), flush=True)
    settings = [("auto", 0)] + ([(str(args.equal_threads), args.equal_threads)] if args.equal_threads else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_offline-") as work:
        for repeat in range(args.repeats):
            for algo in args.algos:
                for alfish_threads, d3_threads in settings:
                    a = alfish_side(algo, args, os.path.join(work, str(repeat)), alfish_threads, repeat)
                    d = d3rlpy_side(algo, args, os.path.join(work, str(repeat)), d3_threads, repeat)
                    rows.append((algo, alfish_threads, a, d))
                    print(f"{algo} (threads alfish {a['threads']}, d3rlpy {d['threads']}): "
                          f"alfish {a['grad_steps_per_s']:.0f} steps/s, return {a['eval_return_mean']:.1f} "
                          f"(normalized {a['normalized_return']:.1f}) | d3rlpy {d['grad_steps_per_s']:.0f} steps/s, "
                          f"return {d['eval_return_mean']:.1f} (normalized {d['normalized_return']:.1f}) | "
                          f"speed ratio {a['grad_steps_per_s'] / d['grad_steps_per_s']:.2f}", flush=True)
    print("\nmedians over repeats:")
    for algo in args.algos:
        for alfish_threads, _ in settings:
            sel = [(a, d) for al, t, a, d in rows if al == algo and t == alfish_threads]
            ratio = statistics.median(a["grad_steps_per_s"] / d["grad_steps_per_s"] for a, d in sel)
            print(f"  {algo} threads={alfish_threads}: alfish "
                  f"{statistics.median(a['grad_steps_per_s'] for a, _ in sel):.0f} vs d3rlpy "
                  f"{statistics.median(d['grad_steps_per_s'] for _, d in sel):.0f} steps/s (ratio {ratio:.2f}); "
                  f"normalized return alfish {_spread([a['normalized_return'] for a, _ in sel])} vs "
                  f"d3rlpy {_spread([d['normalized_return'] for _, d in sel])}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump([{"algo": al, "threads": t, "alfish": a, "d3rlpy": d} for al, t, a, d in rows], f, indent=1)


def _spread(values: list[float]) -> str:
    """'median (mean +- std over N)'."""
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return (f"{statistics.median(values):.1f} (mean {statistics.mean(values):.1f} +- {statistics.stdev(values):.1f} "
            f"over {len(values)} seeds)")


if __name__ == "__main__":
    main()
