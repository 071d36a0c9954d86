"""What the sync-free replay tests share: the recorded sampling scenario, run under ``SyncCounter``
(``alfish.learn.sync_debug``: the calls that would wait for a GPU, counted on the CPU)."""
from __future__ import annotations

import contextlib

import torch

from alfish.data.types import Experience
from alfish.learn.sync_debug import SyncCounter
from alfish.replay import PrioritizedSampler, ReplayBuffer, RingBuffer, UniformSampler
from alfish.replay.prioritized import HostPrioritizedSampler

# ----------------------------------------------------------------------------------------- the recorded scenario --
NUM_ENVS, CAPACITY, BATCH, ROUNDS, SEED = 3, 16, 8, 6, 1234
# name -> the sampler's arguments; the recorded samples (recorded_samples.RECORDED) use these names.
CONFIGS = {
    "uniform_L1": dict(kind="uniform", length=1),
    "uniform_L3": dict(kind="uniform", length=3),
    "prioritized_L2": dict(kind="prioritized", length=2),
    "prioritized_L2_batchmax": dict(kind="prioritized", length=2, normalize_by_max=True, max_over="batch"),
    "prioritized_L3_buffermax": dict(kind="prioritized", length=3, normalize_by_max=True, max_over="buffer"),
}


def step(env_ids: torch.Tensor, index: torch.Tensor) -> Experience:
    """Step ``index`` of rings ``env_ids`` (CPU): its write index is in ``rollout_info`` and the observation."""
    n = env_ids.shape[0]
    return Experience(step_type=torch.ones(n, dtype=torch.int8), reward=index.float(), discount=torch.ones(n),
                      observation=torch.stack([index.float(), env_ids.float()], -1), action=torch.zeros(n, 1),
                      env_id=env_ids, rollout_info={"index": index.clone()})


def add(buf: ReplayBuffer, env_ids: torch.Tensor) -> None:
    buf.add(step(env_ids, buf.write_count()[env_ids]))


def build(name: str, storage: RingBuffer, sampler_device: str | torch.device = "cpu",
          device: str | torch.device | None = None, sampler_cls: type = PrioritizedSampler) -> tuple[ReplayBuffer, int]:
    """The buffer of scenario ``name`` over ``storage`` (its sampler's generator seeded ``SEED``), and its length."""
    cfg = dict(CONFIGS[name])
    kind, length = cfg.pop("kind"), cfg.pop("length")
    gen = torch.Generator().manual_seed(SEED)
    if kind == "uniform":
        return ReplayBuffer(storage, UniformSampler(gen), device=device), length
    sampler = sampler_cls(NUM_ENVS, CAPACITY, sequence_length=length, generator=gen, device=sampler_device, **cfg)
    return ReplayBuffer(storage, sampler, device=device), length


def priorities_of(exp: Experience) -> torch.Tensor:
    """The scenario's priorities ``[B]`` from a batch (on the batch's device): ``(position * 7 + env * 3) % 11 + 0.5``
    (``exp.rollout_info["index"][:, 0]`` is the position, ``exp.env_id[:, 0]`` the env)."""
    return ((exp.rollout_info["index"][:, 0] * 7 + exp.env_id[:, 0] * 3) % 11).float() + 0.5


def fill(buf: ReplayBuffer) -> None:
    """20 lockstep adds: every ring wrapped once."""
    for _ in range(20):
        add(buf, torch.arange(NUM_ENVS))


def run_rounds(buf: ReplayBuffer, length: int, before_round=None, guard=contextlib.nullcontext
               ) -> tuple[list, list[str], list]:
    """``ROUNDS`` rounds of (one add outside the count; then, counted: sample, to_device, update_priorities from the
    device batch). ``before_round()`` runs before each counted part (e.g. a device synchronize); ``guard()`` is a
    context manager entered around it too (e.g. CUDA's sync debug mode).

    Returns the rounds' ``(env_ids, positions, importance_weights or None)`` as lists, every counted call, and the
    rounds' device batches."""
    draws, calls, batches = [], [], []
    for r in range(ROUNDS):
        add(buf, torch.arange(NUM_ENVS) if r % 2 else torch.tensor([0, 2]))
        if before_round is not None:
            before_round()
        with guard(), SyncCounter() as counter:
            exp, info = buf.sample(BATCH, length)
            exp, dev_info = buf.to_device(exp, info)
            buf.update_priorities(info, priorities_of(exp))
        calls += counter.calls
        weights = dev_info.importance_weights
        draws.append((info.env_ids.tolist(), info.positions.tolist(), None if weights is None else weights.tolist()))
        batches.append(exp)
    return draws, calls, batches


# ------------------------------------------------------------------ deferred priority updates, emulated on the CPU --
class DoneEvent:
    """A CUDA event stand-in whose copy has completed (counts the waits asked of it)."""

    def __init__(self) -> None:
        self.waits = 0

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.waits += 1


class DeferringSampler(HostPrioritizedSampler):
    """Queues every update as ``update_priorities`` does for CUDA priorities with host trees (the copy is done), so
    the CPU runs the same schedule: each update applied by the second next sample."""

    def update_priorities(self, storage, batch_info, priorities):
        self._deferred.push_copy(batch_info, priorities.float().clone(), DoneEvent())
