"""``Trainer.num_threads = 'auto'``: how many torch intra-op threads a training process uses.

What decides it (measurements: ``tools/bench/bench_threads.py``, figures in tools/bench/README.md):

* Small matmuls do not speed up with threads: below ``MIN_MACS_FOR_THREADS`` multiply-accumulates in the update's
  largest matmul (batch x in x out), a second thread only adds its hand-over cost. RL's usual networks (64x64 PPO,
  256x256 DQN at batch 64) sit at or below it; SAC/TD3 at batch 256 with 256x256 networks sit above.
* More threads than free cores is far worse than one thread: OpenMP workers spin-wait for each other, and when a core
  is taken by another process, each matmul waits for a descheduled worker. Measured on the 2-core development machine
  with other jobs running, a 256x256 update at batch 256 took ~11 ms on one thread and 130+ ms on two. So the count is
  the cores this process may use (CPU affinity and a cgroup quota, shared by the ranks of a torchrun job on this
  machine) minus those other processes keep busy (measured over 0.2 s when training starts), never below 1. The run's
  own child processes that work alongside training (the async unroll child, the async evaluator) are idle when that is
  measured, so each counts as one busy core.
"""
from __future__ import annotations

import logging
import math
import os
from typing import Optional

import torch
from torch import nn

AUTO = "auto"
#: Multiply-accumulates of the largest matmul of one update below which one thread is used (measured, see above).
MIN_MACS_FOR_THREADS = 8_000_000
#: Beyond this many threads small-network RL updates stop scaling (and a big machine is usually shared by ranks).
MAX_AUTO_THREADS = 8


def cores_available() -> int:
    """CPU cores this process may run on: its affinity mask, reduced by a cgroup v2 CPU quota if one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def busy_cores(interval_s: float = 0.2) -> float:
    """Cores other processes keep busy now: the machine's CPU use over ``interval_s`` (this process sleeps meanwhile),
    in cores. (Not the load average: it lags by minutes, so a job that just ended would still count.)"""
    import psutil

    return psutil.cpu_percent(interval=interval_s) / 100.0 * (os.cpu_count() or 1)


def largest_matmul_macs(module: nn.Module, batch: int) -> int:
    """Multiply-accumulates of the largest matmul a forward pass of ``module`` on ``batch`` rows makes: ``batch``
    times the largest ``in x out`` of its weight matrices (an ensemble weight ``[E, in, out]`` counts ``E`` of
    them, as its batched matmul does)."""
    largest = 0
    for p in module.parameters():
        if p.dim() >= 2:
            largest = max(largest, p.numel())
    return batch * largest


def auto_threads(macs: int, ranks_on_machine: int = 1, cores: Optional[int] = None,
                 busy: Optional[float] = None) -> int:
    """The thread count of the rule above for an update whose largest matmul has ``macs`` multiply-accumulates."""
    if macs < MIN_MACS_FOR_THREADS:
        return 1
    cores = cores_available() if cores is None else cores
    busy = busy_cores() if busy is None else busy
    free = math.floor(cores / max(1, ranks_on_machine) - busy / max(1, ranks_on_machine) + 0.5)
    return max(1, min(free, MAX_AUTO_THREADS))


def set_threads(setting: int | str | None, module: nn.Module, batch: int, own_children: int = 0) -> None:
    """Apply ``Trainer.num_threads``: ``None`` leaves torch's default, an int is used as is, ``'auto'`` follows the
    rule above for ``module`` trained on batches of ``batch`` rows (logged with its reasons); ``own_children``: child
    processes of this rank that will work alongside training (one busy core each)."""
    if setting is None:
        return
    if setting != AUTO:
        torch.set_num_threads(int(setting))
        return
    macs = largest_matmul_macs(module, batch)
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if macs < MIN_MACS_FOR_THREADS:
        threads, why = 1, f"largest matmul {macs / 1e6:.1f}M MACs < {MIN_MACS_FOR_THREADS / 1e6:.0f}M"
    else:
        cores, busy = cores_available(), busy_cores()
        threads = auto_threads(macs, ranks, cores, busy + own_children * ranks)
        why = (f"largest matmul {macs / 1e6:.1f}M MACs; {cores} cores available, {busy:.1f} busy, {ranks} rank(s) "
               f"on this machine" + (f", {own_children} child process(es) of this rank" if own_children else ""))
    torch.set_num_threads(threads)
    logging.info("Trainer.num_threads='auto': %d torch thread(s) (%s)", threads, why)


def check_setting(setting: object) -> None:
    """A one-line error unless ``setting`` is None, ``'auto'`` or a positive int."""
    if setting is None or setting == AUTO:
        return
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ValueError(f"Trainer.num_threads={setting!r} must be 'auto', a positive int or None (torch's default)")
