"""The d3rlpy side of the offline-RL benchmark: gradient steps/s and evaluation return of d3rlpy's IQL / BC.

    /work/d3rlpy-venv/bin/python tools/bench/d3rlpy_side.py --dataset /tmp/pendulum_medium_20k.npz --algo iql \
        --gradient_steps 2000 --env Pendulum-v1 --eval_episodes 10 --seed 0 --out result.json [--threads 0]
    /work/d3rlpy-venv/bin/python tools/bench/d3rlpy_side.py --make_pendulum_dataset /tmp/pendulum_medium_20k.npz \
        --num_steps 20000 --noise 0.3 --seed 0

Why a separate virtual environment: d3rlpy 2.8.1 pins gymnasium==1.0.0 and pulls the unmaintained ``gym`` 0.26,
which clash with alfish's own environment. So this script runs with the interpreter of its own venv
(``python3.11 -m venv /work/d3rlpy-venv; pip install torch==2.13.0; pip install d3rlpy==2.8.1 torch==2.13.0``)
and never imports alfish; it talks to the alfish side only through the dataset file and the JSON it writes.

What it measures:
  * Throughput: ``--gradient_steps`` gradient steps of d3rlpy's algorithm at its DEFAULT hyperparameters
    (``IQLConfig()`` / ``BCConfig()``: 256x256 networks; batch 256, set explicitly for BC whose default is 100),
    on CPU. ``--loop fit`` (default) times d3rlpy's own ``algo.fit`` (file logging off: ``NoopAdapterFactory``,
    no progress bar), stamping the clock in its per-step callback, so the figure is what a d3rlpy user gets:
    mini-batches sampled by d3rlpy's replay buffer (``sample_transition_batch``, one transition-picker call per
    sample) and ``algo.update``. ``--loop manual`` runs the same two calls in a bare loop and also reports how the
    time splits between sampling and updating. ``grad_steps_per_s`` is over the whole run less the first 100
    steps (warm-up); ``grad_steps_per_s_median_window`` is the median over the full 500-step windows after them.
  * Quality: the greedy policy (``algo.predict``) on ``gymnasium.make(env)`` for ``--eval_episodes`` episodes
    (reset seeds seed+1000+i): mean and std of the undiscounted return, and the normalized return
    100 * (R - R_random) / (R_expert - R_random) with the reference returns of ``REFERENCE_RETURNS``.

Action scaling: d3rlpy's continuous policies end in tanh, so without an action scaler they can only output
[-1, 1] (Pendulum-v1's torque range is [-2, 2]). d3rlpy's documented remedy is ``MinMaxActionScaler``; with
``--action_scaler auto`` (default) it is set to the env's action bounds when those are not [-1, 1], which changes
no hyperparameter of the algorithm. ``--action_scaler none`` gives d3rlpy's bare defaults.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts")
sys.path.insert(0, SCRIPTS)
from pendulum_dataset import make_pendulum_dataset  # noqa: E402  (shared with alfish's side; numpy + gymnasium only)

# (R_random, R_expert) per env id, for the normalized return.
REFERENCE_RETURNS = {
    "Pendulum-v1": (-1200.0, -150.0),
}
WARMUP_STEPS = 100
WINDOW = 500


# ---------------------------------------------------------------------------------------------------------------
# Benchmark
# ---------------------------------------------------------------------------------------------------------------

def load_dataset(path: str):
    import d3rlpy

    with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    return d3rlpy.dataset.MDPDataset(
        observations=arrays["observations"].astype(np.float32),
        actions=arrays["actions"].astype(np.float32),
        rewards=arrays["rewards"].astype(np.float32),
        terminals=arrays["terminals"].astype(np.float32),
        timeouts=arrays["timeouts"].astype(np.float32),
    ), len(arrays["rewards"])


def make_algo(name: str, action_scaler):
    import d3rlpy

    if name == "iql":
        config = d3rlpy.algos.IQLConfig(action_scaler=action_scaler)
    elif name == "bc":
        config = d3rlpy.algos.BCConfig(action_scaler=action_scaler)
    else:
        raise ValueError(f"unknown algo {name!r}")
    if config.batch_size != 256:                             # BCConfig's default is 100
        config.batch_size = 256
    return config.create(device="cpu:0")


def rates(stamps: list[float]) -> tuple[float, float]:
    """stamps[k] = clock after gradient step k+1. Rate after the warm-up, and median over 500-step windows."""
    n = len(stamps)
    w = min(WARMUP_STEPS, n - 1)
    overall = (n - w) / (stamps[-1] - stamps[w - 1]) if w > 0 else n / stamps[-1]
    windows = [WINDOW / (stamps[s + WINDOW - 1] - stamps[s - 1])
               for s in range(max(w, 1), n - WINDOW + 1, WINDOW)]
    return overall, (statistics.median(windows) if windows else overall)


def network_shapes(algo) -> dict:
    """(in, out) of every Linear layer of each of the built algorithm's networks, to show the 256x256 defaults."""
    import torch

    shapes = {}
    for name, module in vars(algo.impl.modules).items():
        if isinstance(module, torch.nn.Module):
            shapes[name] = [[m.in_features, m.out_features] for m in module.modules()
                            if isinstance(m, torch.nn.Linear)]
    return shapes


def evaluate(algo, env_id: str, episodes: int, seed: int) -> list[float]:
    import gymnasium as gym

    env = gym.make(env_id)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 1000 + i)
        done, ret = False, 0.0
        while not done:
            action = algo.predict(np.asarray(obs, dtype=np.float32)[None])[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            ret += float(reward)
            done = terminated or truncated
        returns.append(ret)
    env.close()
    return returns


def benchmark(args) -> dict:
    t_start = time.perf_counter()
    import d3rlpy
    import gymnasium as gym
    import structlog
    import torch

    # d3rlpy logs through structlog to stdout ("dataset info", parameters): keep warnings and errors only.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    d3rlpy.seed(args.seed)

    dataset, n_rows = load_dataset(args.dataset)
    env = gym.make(args.env)
    low, high = np.asarray(env.action_space.low), np.asarray(env.action_space.high)
    env.close()
    action_scaler = None
    if args.action_scaler == "minmax" or (
            args.action_scaler == "auto" and not (np.all(low == -1.0) and np.all(high == 1.0))):
        action_scaler = d3rlpy.preprocessing.MinMaxActionScaler(minimum=low, maximum=high)
    algo = make_algo(args.algo, action_scaler)

    n = args.gradient_steps
    stamps: list[float] = []
    split = {}
    t_train = time.perf_counter()
    if args.loop == "fit":
        with tempfile.TemporaryDirectory() as tmp:          # nothing is written with the Noop adapter; belt and braces
            cwd = os.getcwd()
            os.chdir(tmp)
            try:
                algo.fit(dataset, n_steps=n, n_steps_per_epoch=n, experiment_name="bench", with_timestamp=False,
                         logger_adapter=d3rlpy.logging.NoopAdapterFactory(), show_progress=False,
                         save_interval=n + 1, callback=lambda _algo, _epoch, _step: stamps.append(time.perf_counter()))
            finally:
                os.chdir(cwd)
    else:
        # The body of QLearningAlgoBase.fitter's loop, without the logger's per-step bookkeeping.
        algo.build_with_dataset(dataset)
        batch_size = algo.config.batch_size
        t_sample = t_update = 0.0
        for _ in range(n):
            t0 = time.perf_counter()
            batch = dataset.sample_transition_batch(batch_size)
            t1 = time.perf_counter()
            algo.update(batch)
            t2 = time.perf_counter()
            t_sample += t1 - t0
            t_update += t2 - t1
            stamps.append(t2)
        split = {"seconds_sample_batch": t_sample, "seconds_update": t_update,
                 "sample_fraction": t_sample / (t_sample + t_update)}
    seconds_train = time.perf_counter() - t_train
    overall, median_window = rates(stamps)

    t_eval = time.perf_counter()
    returns = evaluate(algo, args.env, args.eval_episodes, args.seed)
    seconds_eval = time.perf_counter() - t_eval
    mean_ret = float(np.mean(returns))
    r_random, r_expert = REFERENCE_RETURNS.get(args.env, (None, None))
    r_random = args.random_return if args.random_return is not None else r_random
    r_expert = args.expert_return if args.expert_return is not None else r_expert
    normalized = (100.0 * (mean_ret - r_random) / (r_expert - r_random)
                  if r_random is not None and r_expert is not None else None)

    config = algo.config.serialize_to_dict()
    config["network_linear_layers"] = network_shapes(algo)
    return {
        "framework": "d3rlpy",
        "version": d3rlpy.__version__,
        "algo": args.algo,
        "gradient_steps": n,
        "grad_steps_per_s": overall,
        "grad_steps_per_s_median_window": median_window,
        "threads": torch.get_num_threads(),
        "eval_return_mean": mean_ret,
        "eval_return_std": float(np.std(returns)),
        "normalized_return": normalized,
        "config": config,
        "seconds_total": time.perf_counter() - t_start,
        # extras
        "eval_returns": returns,
        "eval_episodes": args.eval_episodes,
        "reference_returns": {"random": r_random, "expert": r_expert},
        "loop": args.loop,
        "warmup_steps_excluded": min(WARMUP_STEPS, n - 1),
        "window_steps": WINDOW,
        "seconds_train": seconds_train,
        "seconds_eval": seconds_eval,
        **split,
        "dataset": os.path.abspath(args.dataset),
        "dataset_rows": n_rows,
        "dataset_transitions": dataset.transition_count,
        "dataset_episodes": len(dataset.episodes),
        "env": args.env,
        "seed": args.seed,
        "action_scaler": args.action_scaler,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "gymnasium": gym.__version__,
        "python": platform.python_version(),
        "device": "cpu:0",
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", help="D4RL-style .npz (observations, actions, rewards, terminals, timeouts)")
    p.add_argument("--algo", choices=["iql", "bc"], default="iql")
    p.add_argument("--gradient_steps", type=int, default=2000)
    p.add_argument("--env", default="Pendulum-v1")
    p.add_argument("--eval_episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="JSON result path (also printed on stdout as a 'RESULT {...}' line)")
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    p.add_argument("--loop", choices=["fit", "manual"], default="fit",
                   help="fit: time d3rlpy's algo.fit; manual: sample_transition_batch + update in a bare loop")
    p.add_argument("--action_scaler", choices=["auto", "minmax", "none"], default="auto",
                   help="auto: MinMaxActionScaler at the env's bounds unless they are [-1, 1]")
    p.add_argument("--random_return", type=float, default=None)
    p.add_argument("--expert_return", type=float, default=None)
    p.add_argument("--make_pendulum_dataset", metavar="OUT", help="write the heuristic Pendulum dataset and exit")
    p.add_argument("--num_steps", type=int, default=20000)
    p.add_argument("--noise", type=float, default=0.3)
    args = p.parse_args(argv)

    if args.make_pendulum_dataset:
        info = make_pendulum_dataset(args.make_pendulum_dataset, args.num_steps, args.noise, args.seed)
        print(json.dumps(info))
        return 0
    if not args.dataset:
        p.error("--dataset is required (or --make_pendulum_dataset OUT)")
    if args.gradient_steps < 2:
        p.error("--gradient_steps must be at least 2")
    result = benchmark(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
