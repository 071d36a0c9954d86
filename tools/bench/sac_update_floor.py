"""The floor for one SAC update: its matmul FLOPs over this machine's measured matmul rate, and how close alfish's
update gets to it.

    python tools/bench/sac_update_floor.py [--batch 256] [--hidden 256] [--threads T]
"""
from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import torch

from alfish.algorithms.sac import SacAlgorithm
from alfish.data.types import Experience
from alfish.learn.host_memory import keep_freed_host_memory
from alfish.learn.optim import OptimizerConfig
from alfish.trainer.options import RunOptions


def mlp_macs(dims: list[int]) -> int:
    """Multiply-accumulates of one sample through an MLP with layer widths ``dims``."""
    return sum(a * b for a, b in zip(dims[:-1], dims[1:]))


def sac_update_flops(obs_dim: int, act_dim: int, hidden: int, batch: int, num_critics: int = 2) -> float:
    """Matmul FLOPs of one alfish SAC update (2 FLOPs per MAC; backward of a layer costs 2x its forward when both
    weight and input gradients are needed, 1x when only the input gradient is)."""
    actor = mlp_macs([obs_dim, hidden, hidden, 2 * act_dim])
    critic = num_critics * mlp_macs([obs_dim + act_dim, hidden, hidden, 1])
    forward = 2 * actor + 3 * critic          # actor(next), actor(now); target critics, critics, detached critics
    backward = 2 * actor + 2 * critic + critic  # actor (weights+input), critic loss (weights+input), detached (input)
    return 2.0 * batch * (forward + backward)


def matmul_rate(hidden: int, batch: int, seconds: float = 2.0) -> float:
    """Measured FLOP/s of the update's dominant shape: ``[2, batch, hidden] @ [2, hidden, hidden]``."""
    a, b, c = torch.randn(2, batch, hidden), torch.randn(2, hidden, hidden), torch.randn(2, 1, hidden)
    for _ in range(20):
        torch.baddbmm(c, a, b)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            torch.baddbmm(c, a, b)
        n += 50
    return n * 2 * 2 * batch * hidden * hidden / (time.perf_counter() - start)


def update_time(hidden: int, batch: int, n: int = 200) -> float:
    env = gym.make("Pendulum-v1")
    alg = SacAlgorithm(env.observation_space, env.action_space, hidden_sizes=(hidden, hidden))
    opt = OptimizerConfig().build(alg.param_groups())
    L = 2
    exp = Experience(torch.ones(L, batch, dtype=torch.int8), torch.randn(L, batch), torch.ones(L, batch),
                     torch.randn(L, batch, 3), torch.rand(L, batch, 1) * 4 - 2, torch.zeros(L, batch, dtype=torch.long))

    def step() -> None:
        loss = alg.calc_loss(exp, alg.train_step(exp).info).loss.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        alg.after_update()

    for _ in range(20):
        step()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n // 5):
            step()
        times.append((time.perf_counter() - start) / (n // 5))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--host_memory_cache_mb", type=int, default=RunOptions.host_memory_cache_mb,
                        help="as Trainer.host_memory_cache_mb (alfish's default; 0: malloc's defaults)")
    args = parser.parse_args()
    keep_freed_host_memory(args.host_memory_cache_mb)  # as a training run does
    if args.threads:
        torch.set_num_threads(args.threads)
    flops = sac_update_flops(3, 1, args.hidden, args.batch)
    rate = matmul_rate(args.hidden, args.batch)
    measured = update_time(args.hidden, args.batch)
    floor = flops / rate
    result = dict(update_gflop=flops / 1e9, matmul_gflops=rate / 1e9, floor_ms=floor * 1e3,
                  update_ms=measured * 1e3, fraction_of_floor=floor / measured, threads=torch.get_num_threads())
    print(f"SAC update (Pendulum, batch {args.batch}, {args.hidden}x{args.hidden}): {flops / 1e9:.3f} GFLOP; "
          f"matmul rate {rate / 1e9:.1f} GFLOP/s -> floor {floor * 1e3:.2f} ms; measured {measured * 1e3:.2f} ms "
          f"(median), i.e. {100 * floor / measured:.0f}% of the floor; torch threads {torch.get_num_threads()}")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
