"""The measurements behind ``Trainer.num_threads = 'auto'``: one MLP update (forward, backward, fused Adam) at 1, 2,
... torch threads, for the network and batch sizes of the shipped confs and a few more.

    python tools/bench/bench_threads.py [--threads 1 2] [--repeats 7]

For each (batch, hidden) it prints the median update time per thread count and the speed-up over one thread, next to
the MACs of the update's largest matmul (``batch x hidden x hidden``), the quantity ``alfish.learn.threads`` decides
on. Thread counts are measured alternately in one process (``torch.set_num_threads`` between blocks), so a busy
machine affects all of them alike.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from alfish.networks.mlp import MLP, EnsembleMLP

SHAPES = [(64, 64), (256, 64), (64, 256), (128, 256), (256, 256), (1024, 256), (256, 512)]  # (batch, hidden)


def make_update(batch: int, hidden: int, obs_dim: int = 8):
    """A twin-critic-like update: an ensemble of 2 MLPs and a plain MLP, one loss, one backward, fused Adam."""
    critic = EnsembleMLP(2, obs_dim, 1, (hidden, hidden))
    actor = MLP(obs_dim, 2, (hidden, hidden))
    params = list(critic.parameters()) + list(actor.parameters())
    opt = torch.optim.Adam(params, lr=1e-4, fused=True)
    x = torch.randn(batch, obs_dim)

    def update() -> None:
        loss = critic(x).square().mean() + actor(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return update


def median_ms(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=7, help="alternating blocks per thread count")
    parser.add_argument("--calls", type=int, default=20, help="updates per block")
    args = parser.parse_args()
    results = []
    print("| batch | hidden | largest matmul MACs | " + " | ".join(f"{t} thr ms" for t in args.threads)
          + " | speed-up of the most threads |\n|---:|---:|---:|" + "---:|" * (len(args.threads) + 1))
    for batch, hidden in SHAPES:
        update = make_update(batch, hidden)
        for _ in range(5):
            update()
        blocks: dict[int, list[float]] = {t: [] for t in args.threads}
        for _ in range(args.repeats):
            for t in args.threads:
                torch.set_num_threads(t)
                blocks[t].append(median_ms(update, args.calls))
        med = {t: statistics.median(v) for t, v in blocks.items()}
        macs = batch * hidden * hidden
        speedup = med[args.threads[0]] / med[args.threads[-1]]
        print(f"| {batch} | {hidden} | {macs / 1e6:.1f}M | " + " | ".join(f"{med[t]:.2f}" for t in args.threads)
              + f" | {speedup:.2f} |", flush=True)
        results.append(dict(batch=batch, hidden=hidden, macs=macs, ms=med, speedup=speedup))
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
