"""Retiring replayed samples, as DI-engine's ``AdvancedReplayBuffer`` does: a stored sequence start is not drawn
again once it was drawn ``max_use`` times (``Trainer.replay_max_use``), nor once the policy that acted it is more than
``max_staleness`` iterations older than the current one (``Trainer.replay_max_staleness``: those are each env's
oldest steps, forgotten once per iteration, so the draws never meet them).

``RetiringSampler`` wraps the buffer's sampler (uniform or prioritized): it keeps, per stored slot, how often it was
drawn, reads the iteration whose parameters acted it from the storage (``RingBuffer.policy_iterations``, set by the
collector: the current iteration for a synchronous unroll, the iteration that published the acting version for an
asynchronous one), draws from the wrapped sampler, and draws again for the rows that are used up (up to ``REDRAWS``
times). A
batch that still holds used-up rows after that means the buffer holds too few live sequences for the training
asked of it: the one-line error says which settings to change. Counted: ``replay/retired_redraws`` (rows drawn
again) and ``replay/stale_steps_forgotten``. The counts are checkpointed with the sampler's state (the acting
iterations with the storage's).

The bookkeeping lives on the host: with the priority trees on a device (``DevicePolicy.replay_storage='device'``)
each sample reads its indices back (one sync per sample).
"""
from __future__ import annotations

from typing import Optional

import torch

from alfish.data.types import BatchInfo
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.samplers import Sampler

REDRAWS = 32  # redraws of a batch's retired rows before the buffer is deemed too stale (half retired: 2e-10 a row)


class RetiringSampler(Sampler):
    """``inner`` with ``max_use`` / ``max_staleness`` (``None``: that limit off) over ``num_envs`` rings of
    ``capacity`` slots."""

    def __init__(self, inner: Sampler, num_envs: int, capacity: int, max_use: Optional[int] = None,
                 max_staleness: Optional[int] = None):
        if max_use is None and max_staleness is None:
            raise ValueError("a RetiringSampler needs max_use or max_staleness")
        self.inner, self.max_use, self.max_staleness = inner, max_use, max_staleness
        self.uses = torch.zeros(num_envs, capacity, dtype=torch.int32)
        self.current_iteration = 0  # staleness is measured against this (ReplayBuffer.set_current_iteration)
        self._storage: Optional[RingBuffer] = None
        self.redraws = 0
        self._stale_checked: Optional[int] = None  # the iteration whose stale steps were last forgotten

    # ------------------------------------------------------------------------------------------- storage changes --
    def attach(self, storage: RingBuffer) -> None:
        self._storage = storage
        self.inner.attach(storage)

    def on_add(self, storage: RingBuffer, env_ids: torch.Tensor, write_counts_before: torch.Tensor) -> None:
        self.uses[env_ids, write_counts_before % storage.capacity] = 0
        self.inner.on_add(storage, env_ids, write_counts_before)

    def on_clear(self, storage: RingBuffer, oldest_before: torch.Tensor) -> None:
        self.inner.on_clear(storage, oldest_before)

    def stale_before(self, storage: RingBuffer) -> Optional[torch.Tensor]:
        """Once per ``current_iteration`` (None otherwise, and without ``max_staleness``): the absolute index
        ``[num_envs]`` before which each env's steps are stale. An env's stamps never decrease along its ring (each
        unroll process acts with ever newer parameters), so its stale steps are its oldest ones: ``ReplayBuffer``
        forgets them (moves the ring's oldest readable index past them), and the draws never meet them."""
        if self.max_staleness is None or self._stale_checked == self.current_iteration:
            return None
        self._stale_checked = self.current_iteration
        oldest, written = storage.oldest_index(), storage.write_count()
        index = oldest.unsqueeze(1) + torch.arange(storage.capacity)  # [num_envs, capacity], readable where < written
        stamps = storage.policy_iterations.gather(1, index % storage.capacity)
        stale = (index < written.unsqueeze(1)) & (self.current_iteration - stamps > self.max_staleness)
        return oldest + stale.sum(1)

    # ---------------------------------------------------------------------------------------------------- drawing --
    def retired(self, env_ids: torch.Tensor, positions: torch.Tensor, storage: RingBuffer) -> torch.Tensor:
        """bool ``[B]``: which rows of a batch of sequence starts (``env_ids``, absolute ``positions``, host) are
        retired. A start drawn twice in the batch is used twice: its second row is retired when the first use was its
        last."""
        capacity = storage.capacity
        slots = positions % capacity
        mask = torch.zeros(positions.shape, dtype=torch.bool)
        if self.max_use is not None:
            earlier = _occurrence_rank(env_ids * capacity + slots)  # same start in earlier rows of this batch
            mask |= self.uses[env_ids, slots] + earlier >= self.max_use
        if self.max_staleness is not None:
            mask |= self.current_iteration - storage.policy_iterations[env_ids, slots] > self.max_staleness
        return mask

    def sample(self, storage: RingBuffer, batch_size: int, length: int, num_batches: int = 1) -> BatchInfo:
        info = self.inner.sample(storage, batch_size, length, num_batches)
        device = info.positions.device
        env_ids, positions = info.env_ids.cpu(), info.positions.cpu()
        weights = info.importance_weights
        for _ in range(REDRAWS):
            retired = self.retired(env_ids, positions, storage).nonzero().squeeze(1)
            if retired.numel() == 0:
                break
            self.redraws += retired.numel()
            again = self.inner.sample(storage, retired.numel(), length)
            env_ids[retired], positions[retired] = again.env_ids.cpu(), again.positions.cpu()
            if weights is not None:
                weights = weights.clone()
                weights[retired.to(weights.device)] = again.importance_weights.to(weights.device)
        else:
            fraction = float(self.retired(env_ids, positions, storage).float().mean())
            if fraction > 0:
                raise RuntimeError(
                    f"{fraction:.0%} of a replay batch is still retired after {REDRAWS} redraws "
                    f"(Trainer.replay_max_use={self.max_use}, replay_max_staleness={self.max_staleness}): the buffer "
                    "holds too few live sequences for the updates asked of it; raise those limits, or train less per "
                    "iteration (num_updates_per_train_iter, mini_batch_size) or collect more (unroll_length)")
        self.uses.index_put_((env_ids, positions % storage.capacity), torch.ones_like(env_ids, dtype=torch.int32),
                             accumulate=True)
        return BatchInfo(env_ids=env_ids.to(device), positions=positions.to(device), importance_weights=weights)

    # ------------------------------------------------------------------------------------------------- forwarded --
    def update_priorities(self, storage: RingBuffer, batch_info: BatchInfo, priorities: torch.Tensor) -> None:
        self.inner.update_priorities(storage, batch_info, priorities)

    def flush(self, storage: RingBuffer) -> None:
        self.inner.flush(storage)

    def state_dict(self) -> dict:
        return {"inner": self.inner.state_dict(), "uses": self.uses.clone(), "redraws": torch.tensor(self.redraws)}

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state["inner"])
        if state["uses"].shape != self.uses.shape:
            raise ValueError(f"the checkpoint's replay use counts are {tuple(state['uses'].shape)}, this buffer's "
                             f"{tuple(self.uses.shape)}: resume with the same num_parallel_environments and "
                             "replay_buffer_length")
        self.uses.copy_(state["uses"])
        if "stamps" in state and self._storage is not None:  # (a checkpoint from before the storage kept them)
            self._storage.policy_iterations.copy_(state["stamps"])
        self.redraws = int(state["redraws"])


def _occurrence_rank(keys: torch.Tensor) -> torch.Tensor:
    """For each element of ``keys`` ``[B]``, how many earlier elements are equal to it (int64 ``[B]``)."""
    order = torch.argsort(keys, stable=True)
    ordered = keys[order]
    index = torch.arange(keys.numel())
    starts = torch.ones_like(ordered, dtype=torch.bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    group_start = torch.cummax(torch.where(starts, index, torch.zeros_like(index)), 0).values
    rank = torch.empty_like(index)
    rank[order] = index - group_start
    return rank
