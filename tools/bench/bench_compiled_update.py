"""One Learner update, eager against compiled (``Learner.compile_scope`` 'update' and 'loss'), at the sizes of
bench_vs_sb3.py's SAC and DQN, in one process with the three alternating.

    python tools/bench/bench_compiled_update.py [--algos sac dqn] [--threads 1 2] [--blocks 7] [--updates 100]

Each Learner trains on one fixed batch (SAC: Pendulum-sized, batch 256, 256x256; DQN: CartPole-sized, batch 64,
256x256, double Q, Huber, gradient-norm clip 10, importance weights), after 12 warm-up updates (where the compiled
ones compile: the time is printed). Then ``--blocks`` rounds of ``--updates`` updates per Learner, alternating, and
the median microseconds per update with the ratio eager / compiled. Inductor is the backend (``compile_mode=
'default'``); a second run of this script compiles from inductor's on-disk cache. For SAC the update's FLOP floor
(``sac_update_floor.py``: its matmul FLOPs at the measured rate of its dominant matmul) is measured in the same run,
right after, and each update's fraction of it printed; for DQN likewise (``dqn_floor_us``).
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import gymnasium as gym
import torch

from alfish.algorithms import DqnAlgorithm, SacAlgorithm
from alfish.data.types import BatchInfo, Experience, StepType
from alfish.learn.learner import Learner
from alfish.learn.optim import OptimizerConfig


def job(algo: str) -> tuple[Experience, BatchInfo, dict[str, Learner]]:
    """The batch, its info and the three Learners (same initial parameters) of ``algo``."""
    torch.manual_seed(0)
    if algo == "dqn":
        obs, action_space, batch_size, clip = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), 64, 10.0
        algorithm = DqnAlgorithm(obs, action_space, hidden_sizes=(256, 256), lr=2.3e-3, double_q=True,
                                 huber_loss=True, target_update_period=128)
    else:
        obs, action_space, batch_size, clip = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (1,)), 256, None
        algorithm = SacAlgorithm(obs, action_space, hidden_sizes=(256, 256), actor_lr=1e-3, critic_lr=1e-3,
                                 alpha_lr=1e-3)
    g = torch.Generator().manual_seed(0)
    shape = (2, batch_size)
    action = (torch.randint(2, shape, generator=g) if algo == "dqn"
              else torch.rand(shape + (1,), generator=g) * 4 - 2)
    batch = Experience(step_type=torch.full(shape, int(StepType.MID), dtype=torch.int8),
                       reward=torch.randn(shape, generator=g), discount=torch.ones(shape),
                       observation=torch.rand(shape + obs.shape, generator=g), action=action,
                       env_id=torch.zeros(shape, dtype=torch.int64))
    info = BatchInfo(env_ids=torch.zeros(batch_size, dtype=torch.int64),
                     positions=torch.zeros(batch_size, dtype=torch.int64),
                     importance_weights=torch.rand(batch_size, generator=g) if algo == "dqn" else None)
    learners = {"eager": Learner(copy.deepcopy(algorithm), OptimizerConfig(max_grad_norm=clip)),
                "update": Learner(copy.deepcopy(algorithm), OptimizerConfig(max_grad_norm=clip),
                                  compile_mode="default", compile_scope="update"),
                "loss": Learner(copy.deepcopy(algorithm), OptimizerConfig(max_grad_norm=clip),
                                compile_mode="default", compile_scope="loss")}
    return batch, info, learners


def sac_floor_us(threads: int, batch: int = 256, hidden: int = 256) -> float:
    """The SAC update's FLOP floor in microseconds at ``threads`` (``sac_update_floor.py``: Pendulum's sizes)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sac_update_floor

    torch.set_num_threads(threads)
    flops = sac_update_floor.sac_update_flops(3, 1, hidden, batch)
    return flops / sac_update_floor.matmul_rate(hidden, batch) * 1e6


def dqn_floor_us(threads: int, batch: int = 64, hidden: int = 256, obs_dim: int = 4, num_actions: int = 2) -> float:
    """The DQN update's FLOP floor in microseconds at ``threads``: its matmul FLOPs (three forward passes: the Q
    network on the sampled step and on the next one (double Q), the target network on the next one; the backward of
    the first: weight and input gradients, but only the weight gradient of the first layer) over the measured rate of
    its dominant matmul, ``[batch, hidden] @ [hidden, hidden]``."""
    torch.set_num_threads(threads)
    layers = [(obs_dim, hidden), (hidden, hidden), (hidden, num_actions)]
    forward = sum(a * b for a, b in layers)
    backward = layers[0][0] * layers[0][1] + 2 * sum(a * b for a, b in layers[1:])
    flops = 2.0 * batch * (3 * forward + backward)
    a, b = torch.randn(batch, hidden), torch.randn(hidden, hidden)
    for _ in range(50):
        torch.mm(a, b)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 2.0:
        for _ in range(100):
            torch.mm(a, b)
        n += 100
    rate = n * 2.0 * batch * hidden * hidden / (time.perf_counter() - start)
    return flops / rate * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=["sac", "dqn"], choices=["sac", "dqn"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--updates", type=int, default=100)
    args = parser.parse_args()
    for algo in args.algos:
        for threads in args.threads:
            torch.set_num_threads(threads)
            batch, info, learners = job(algo)
            for name, learner in learners.items():
                start = time.perf_counter()
                for _ in range(12):
                    learner.update(batch, info)
                print(f"[{algo}, {threads} thread(s)] {name}: 12 warm-up updates in "
                      f"{time.perf_counter() - start:.1f} s", flush=True)
            times: dict[str, list[float]] = {name: [] for name in learners}
            for _ in range(args.blocks):
                for name, learner in learners.items():
                    start = time.perf_counter()
                    for _ in range(args.updates):
                        learner.update(batch, info)
                    times[name].append((time.perf_counter() - start) / args.updates * 1e6)
            med = {name: statistics.median(v) for name, v in times.items()}
            print(f"[{algo}, {threads} thread(s)] us per update, median of {args.blocks}: eager {med['eager']:.0f}, "
                  f"whole update {med['update']:.0f} ({med['eager'] / med['update']:.2f}x), loss only "
                  f"{med['loss']:.0f} ({med['eager'] / med['loss']:.2f}x)", flush=True)
            floor_us = sac_floor_us(threads) if algo == "sac" else dqn_floor_us(threads)
            print(f"[{algo}, {threads} thread(s)] FLOP floor {floor_us:.0f} us: eager at "
                  f"{floor_us / med['eager']:.0%}, whole update at {floor_us / med['update']:.0%}", flush=True)


if __name__ == "__main__":
    main()
