"""Prioritized replay over 1M transitions: alfish's segment-tree sampler against a straightforward numpy version.

    python tools/bench/bench_prioritized.py [--layouts 1x1000000 8x125000] [--batch 256] [--length 2] [--calls 400]

For each layout (envs x steps per env, a full ring), times in the same run:
  * sample: ``PrioritizedSampler.sample`` of ``batch`` sequences of ``length`` steps (stratified draw, leaf -> absolute
    position, importance weights; not the gather of the steps, which ``ReplayBuffer.sample`` adds) vs numpy:
    ``np.cumsum`` over the priority array + ``np.searchsorted`` for the same stratified targets, the same position
    mapping and weights.
  * update: ``ReplayBuffer.update_priorities`` of ``batch`` sampled starts vs numpy direct assignment
    ``p[leaves] = (priority + eps) ** alpha``.
  * update, written back: ``--write_back`` mini-batches drawn in one call, their priorities written back in one
    (``Trainer.presample_mini_batches``), per mini-batch; the numpy peer assigns the same entries directly.
  * add + sample: one ``ReplayBuffer.add`` to every env (storage add + the sampler's ``on_add``), then a sample (the
    sampler refreshes the leaves an add dirtied in one batch at the next sample): the cost per iteration of a loop that
    adds one step per env and samples once (SAC's). The numpy peer's add is two direct assignments.
Calls alternate between the two in blocks; the median time per call is printed with the ratio numpy / alfish, and
the sum of the sample and update medians (one training step's replay cost). torch runs on 1 thread (``--threads``),
numpy's cumsum/searchsorted are single-threaded.

Where alfish's time goes: at these sizes every call, torch or numpy, costs about the same fixed overhead whatever its
size, so the number of calls is what counts. The sampler's trees live on the host here, so its hot paths run on numpy
(``alfish/replay/segment_tree.py``, ``prioritized/host.py``): about 40 numpy calls per sample and 50 per update (one per
tree level and per step of the bookkeeping), each printed as ``minimal numpy call`` (``np.negative`` of 256 floats)
plus its own work. The torch calls left are those kept for bit-identical results with the torch code (the generator's
draws, the level-``top`` sum and the cumulative sums of the search, the powers); they are counted (aten operators
dispatched) and priced at the ``minimal torch call`` (``neg`` of 256 floats). The rest is Python and memory: the
random rows a search fetches from a 16 MB tree miss the caches. Calls in a long sequence of different operations cost
more than the same call repeated (the minimal calls are the repeated kind).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from alfish.data.types import Experience
from alfish.replay.prioritized import PrioritizedSampler
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.segment_tree import SumTree

ALPHA, EPS, BETA = 0.7, 1e-6, 0.4


def full_ring(num_envs: int, capacity: int) -> RingBuffer:
    """A ring holding ``capacity`` steps per env (small Pendulum-like steps), filled through its state dict."""
    n = (num_envs, capacity)
    example = Experience(step_type=torch.ones(1, dtype=torch.int8), reward=torch.zeros(1), discount=torch.ones(1),
                         observation=torch.zeros(1, 3), action=torch.zeros(1, 1),
                         env_id=torch.zeros(1, dtype=torch.long))
    # (env_id is not stored: it is the ring's own index)
    leaves = [torch.ones(n, dtype=torch.int8), torch.randn(n), torch.ones(n), torch.randn(n + (3,)),
              torch.randn(n + (1,))]
    ring = RingBuffer(num_envs, capacity)
    count = torch.full((num_envs,), capacity, dtype=torch.int64)
    ring.load_state_dict({"write_count": count, "oldest": torch.zeros(num_envs, dtype=torch.int64), "leaves": leaves},
                         example)
    return ring


def sampler_state(num_envs: int, capacity: int, length: int, stored: np.ndarray) -> dict:
    """The state of a sampler whose ring is full, with ``stored`` priorities (0 on the newest ``length - 1`` steps);
    the write counts are the ring's."""
    tree = SumTree(num_envs * capacity)
    tree.update(torch.arange(num_envs * capacity), torch.from_numpy(stored))
    return {"sum_tree": tree.state_dict()["values"], "assigned": torch.from_numpy(stored).float(),
            "max_priority": torch.tensor(float(stored.max()), dtype=torch.float32),
            "dirty": torch.zeros(0, dtype=torch.int64)}


class NumpyPrioritized:
    """The straightforward version: one priority array, cumsum + searchsorted per draw, direct assignment per update."""

    def __init__(self, num_envs: int, capacity: int, length: int, stored: np.ndarray, rng: np.random.Generator):
        self.num_envs, self.capacity, self.length = num_envs, capacity, length
        self.p = stored.astype(np.float32)  # 0 where a start is not drawable
        self.assigned = self.p.copy()
        self.max_p = float(self.p.max())
        self.write_count = np.full(num_envs, capacity, dtype=np.int64)
        self.rng = rng

    def sample(self, batch_size: int):
        cum = np.cumsum(self.p, dtype=np.float64)
        total = cum[-1]
        targets = (np.arange(batch_size) + self.rng.random(batch_size)) * (total / batch_size)
        leaves = np.minimum(np.searchsorted(cum, targets, side="right"), self.p.size - 1)
        env_ids = leaves // self.capacity
        last = self.write_count[env_ids] - 1
        positions = last - (last - leaves) % self.capacity
        n = np.sum(np.maximum(self.write_count - self.length + 1 - np.maximum(self.write_count - self.capacity, 0), 0))
        weights = ((n * self.p[leaves] / total) ** -BETA).astype(np.float32)
        return env_ids, positions, weights

    def update(self, env_ids: np.ndarray, positions: np.ndarray, priorities: np.ndarray) -> None:
        leaves = env_ids * self.capacity + positions % self.capacity
        stored = (priorities + EPS) ** ALPHA
        self.p[leaves] = self.assigned[leaves] = stored
        self.max_p = max(self.max_p, float(stored.max()))

    def add(self) -> None:
        """One step to every env: the new slot gets the max priority (drawable once L - 1 more steps arrive)."""
        envs = np.arange(self.num_envs) * self.capacity
        new = envs + self.write_count % self.capacity
        ready = envs + (self.write_count - self.length + 1) % self.capacity
        self.write_count += 1
        self.assigned[new] = self.max_p
        self.p[new] = 0.0
        self.p[ready] = self.assigned[ready]


class CountOps(TorchDispatchMode):
    """Counts the aten operators dispatched inside the ``with`` block."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn) -> int:
    with CountOps() as counter:
        fn()
    return counter.count


def minimal_op_ms() -> float:
    x = torch.rand(256)
    return statistics.median(median_ms(lambda: torch.neg(x), 5000, warmup=500))


def minimal_numpy_op_ms() -> float:
    x = np.random.default_rng(0).random(256)
    return statistics.median(median_ms(lambda: np.negative(x), 5000, warmup=500))


def median_ms(fn, calls: int, warmup: int = 10) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def bench_layout(num_envs: int, capacity: int, batch: int, length: int, calls: int, blocks: int,
                 write_back: int) -> dict:
    rng = np.random.default_rng(0)
    stored = (rng.uniform(0.01, 10.0, (num_envs, capacity)) + EPS) ** ALPHA
    stored[:, capacity - length + 1:] = 0.0  # the newest length - 1 steps start no full sequence
    stored = stored.reshape(-1)
    ring = full_ring(num_envs, capacity)
    sampler = PrioritizedSampler(num_envs, capacity, sequence_length=length, alpha=ALPHA, beta=BETA, eps=EPS,
                                 generator=torch.Generator().manual_seed(0))
    buffer = ReplayBuffer(ring, sampler)
    sampler.load_state_dict(sampler_state(num_envs, capacity, length, stored))
    peer = NumpyPrioritized(num_envs, capacity, length, stored, rng)

    info = sampler.sample(ring, batch, length)
    priorities = torch.rand(batch) * 5
    np_env, np_pos, _ = peer.sample(batch)
    np_prio = priorities.numpy()
    all_envs = torch.arange(num_envs)

    step = Experience(step_type=torch.ones(num_envs, dtype=torch.int8), reward=torch.zeros(num_envs),
                      discount=torch.ones(num_envs), observation=torch.zeros(num_envs, 3),
                      action=torch.zeros(num_envs, 1), env_id=all_envs)

    def add_and_sample() -> None:
        buffer.add(step)
        sampler.sample(ring, batch, length)

    def add_and_sample_numpy() -> None:
        peer.add()
        peer.sample(batch)

    ops = {"sample": count_ops(lambda: sampler.sample(ring, batch, length)),
           "update": count_ops(lambda: buffer.update_priorities(info, priorities))}
    t = {"sample": [], "sample_numpy": [], "update": [], "update_numpy": [], "add_sample": [], "add_sample_numpy": []}
    for _ in range(blocks):
        t["sample"] += median_ms(lambda: sampler.sample(ring, batch, length), calls // blocks)
        t["sample_numpy"] += median_ms(lambda: peer.sample(batch), max(calls // blocks // 4, 5))
        t["update"] += median_ms(lambda: buffer.update_priorities(info, priorities), calls // blocks)
        t["update_numpy"] += median_ms(lambda: peer.update(np_env, np_pos, np_prio), calls // blocks)
    # Adds move the newest steps (and so the sampled positions above), so they come last.
    for _ in range(blocks):
        t["add_sample"] += median_ms(add_and_sample, calls // blocks)
        t["add_sample_numpy"] += median_ms(add_and_sample_numpy, max(calls // blocks // 4, 5))
    ops["add_sample"] = count_ops(add_and_sample)
    result = {k: statistics.median(v) for k, v in t.items()}
    result["ops"] = ops
    result.update(bench_write_back(sampler, buffer, peer, batch, length, write_back, blocks))
    return result


def bench_write_back(sampler: PrioritizedSampler, buffer: ReplayBuffer, peer: NumpyPrioritized, batch: int,
                     length: int, num_batches: int, blocks: int) -> dict:
    """``Trainer.presample_mini_batches``'s pattern (DQN's conf: 128 updates per iteration): ``num_batches``
    mini-batches drawn in one call, then all their priorities written back in one ``update_priorities``. Returns the
    medians per mini-batch (ms): ``update_write_back`` and the numpy peer's direct assignment of the same entries,
    ``update_write_back_numpy``. Each timed write-back gets a fresh draw (positions spread over the buffer, as in
    training, rather than the same batch again, which the caches keep warm)."""
    generator = torch.Generator().manual_seed(1)
    times: dict[str, list[float]] = {"update_write_back": [], "update_write_back_numpy": []}
    for _ in range(blocks * 4):
        info = sampler.sample(buffer.storage, batch, length, num_batches=num_batches)
        priorities = torch.rand(batch * num_batches, generator=generator) * 5
        start = time.perf_counter()
        buffer.update_priorities(info, priorities)
        times["update_write_back"].append((time.perf_counter() - start) * 1e3 / num_batches)
        env, pos, prio = info.env_ids.numpy(), info.positions.numpy(), priorities.numpy()
        start = time.perf_counter()
        peer.update(env, pos, prio)
        times["update_write_back_numpy"].append((time.perf_counter() - start) * 1e3 / num_batches)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", nargs="+", default=["1x1000000", "8x125000"], help="ENVSxSTEPS per env")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--length", type=int, default=2)
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per operation (alfish)")
    parser.add_argument("--blocks", type=int, default=5, help="alternations between alfish and numpy")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--write_back", type=int, default=128,
                        help="mini-batches per presampled iteration whose priorities are written back in one call")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    op_ms, np_op_ms = minimal_op_ms(), minimal_numpy_op_ms()
    results = {"minimal_torch_op_ms": op_ms, "minimal_numpy_op_ms": np_op_ms}
    print(f"minimal torch call (neg of 256 floats): {op_ms * 1e3:.2f} us   "
          f"minimal numpy call (negative of 256 floats): {np_op_ms * 1e3:.2f} us")
    for layout in args.layouts:
        num_envs, capacity = (int(x) for x in layout.split("x"))
        r = bench_layout(num_envs, capacity, args.batch, args.length, args.calls, args.blocks, args.write_back)
        results[layout] = r
        print(f"{num_envs} env x {capacity} steps, batch {args.batch} x length {args.length}, "
              f"torch threads {args.threads}:")
        for name, label in (("sample", "sample    "), ("update", "update    "), ("add_sample", "add+sample")):
            ops = r["ops"][name]
            print(f"  {label}  alfish {r[name]:.3f} ms   numpy {r[name + '_numpy']:.3f} ms   "
                  f"numpy/alfish {r[name + '_numpy'] / r[name]:.2f}x   "
                  f"(alfish: {ops} aten calls x minimal torch call = {ops * op_ms:.3f} ms; the rest is numpy calls)")
        print(f"  update, {args.write_back} mini-batches written back in one call (presampled), per mini-batch: "
              f"alfish {r['update_write_back']:.4f} ms   numpy {r['update_write_back_numpy']:.4f} ms")
        r["sample_update"] = r["sample"] + r["update"]
        print(f"  sample+update  alfish {r['sample_update']:.3f} ms   "
              f"numpy {r['sample_numpy'] + r['update_numpy']:.3f} ms")
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
