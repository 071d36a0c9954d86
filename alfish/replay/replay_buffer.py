"""``ReplayBuffer``: raw experience in per-env rings (storage) and the sampler that draws training sequences from it.

The buffer is the only thing that changes the storage, so it is the one place that tells the sampler about changes:
``add`` -> ``sampler.on_add``, ``clear`` -> ``sampler.on_clear``. Nothing outside it keeps positions or write counts.
Samples are raw and batch-major ``[B, L]``; transformers (sample view) and ``to_time_major`` take it from there.

Devices. ``sample`` returns the batch where the storage is (host memory for the ``'cpu'`` and ``'mmap'`` storage
locations, the training device for ``'device'``, see ``storage.py``) with the sampler's indices (on the host, or on
the device for prioritized trees kept there). ``to_device(exp, batch_info)`` then moves the (transformed) batch and
its info to the training device given at construction: through pinned staging buffers and ``non_blocking`` copies
for a CUDA device (``staging.py``), unchanged for a CPU device or what already is on the device. A training step
reads::

    exp, info = replay.sample(B, L)                       # batch where the storage is, the sampler's indices
    exp = transformer.transform_sample(exp, info, replay)
    exp, dev_info = replay.to_device(exp, info)           # batch, indices and importance weights on the device
    ...learner.update(batch, dev_info)...
    replay.update_priorities(info, loss_info.priority)    # device priorities: applied one update late, no sync

The transformers that read the buffer at sample time (frame stacking, hindsight) index the ring's host counters
(oldest indices, episode ends) with the sampler's indices, so ``build.py`` gives them a sampler with host indices
whatever the storage: that index arithmetic then never waits for the device. What they read comes back where the
storage is (``gather_at``; one non-blocking copy of the indices for a device storage), and a host tensor they apply
to it crosses once, through ``to_storage``.

Policy iterations. Every stored step carries the training iteration whose parameters acted it (the storage's
``policy_iterations``); the collector says which before it adds (``set_acting_iteration``) and which iteration
trains now (``set_current_iteration``). ``summary`` reports the age of the policy behind the last batch sampled
(current iteration minus acting iteration: 0 for a synchronous unroll's newest steps, growing with replay age and
with an asynchronous unroll's lag).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from alfish.data import nest
from alfish.data.types import BatchInfo, Experience
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.samplers import Sampler
from alfish.replay.staging import BatchStager


class ReplayBuffer:
    """Raw experience in per-env rings (storage) and the sampler that draws training sequences from it.

    Args:
        storage: the rings. Use it through the buffer from now on (``storage`` is exposed for reading only: an add or
            clear made on it directly would not reach the sampler).
        sampler: ``UniformSampler``, ``PrioritizedSampler`` or another ``Sampler``.
        device: the training device that ``to_device`` moves batches to; ``None``: the storage's device (nothing to
            move).
    """

    def __init__(self, storage: RingBuffer, sampler: Sampler, device: str | torch.device | None = None):
        self._storage = storage
        self._sampler = sampler
        self._stager = BatchStager(storage.device if device is None else device)
        self._steps = torch.arange(0)  # 0, ..., L - 1 for the last sequence length sampled (made once per L)
        sampler.attach(storage)
        self._sampler_tracks_adds = type(sampler).on_add is not Sampler.on_add  # (else on_add does nothing)
        self.stale_forgotten = 0  # steps forgotten for too old a policy (replay_max_staleness)
        self.current_iteration: Optional[int] = None  # the training iteration now (None: no collector says it)
        self._last_sample: Optional[BatchInfo] = None  # the last batch sampled (its policy age goes in the summary)

    @property
    def device(self) -> torch.device:
        """The training device (``to_device``'s destination)."""
        return self._stager.device

    @property
    def storage(self) -> RingBuffer:
        """The rings (read-only use)."""
        return self._storage

    @property
    def sampler(self) -> Sampler:
        return self._sampler

    @property
    def num_envs(self) -> int:
        return self._storage.num_envs

    @property
    def capacity(self) -> int:
        """Steps per env ring."""
        return self._storage.capacity

    # ---------------------------------------------------------------------------------------------------- writing --
    def add(self, exp: Experience) -> None:
        """Append one step per env: leaves ``[B, ...]``; ``exp.env_id`` ``[B]`` (unique, CPU) says which ring."""
        # Bookkeeping must be ordinary tensors even when rollouts run under torch.inference_mode (as the storage).
        with torch.inference_mode(False):
            if not self._sampler_tracks_adds:  # (the uniform sampler: skip reading the write counts)
                self._storage.add(exp)
                return
            env_ids = exp.env_id
            counts_before = self._storage.write_count().index_select(0, env_ids)  # the absolute indices written
            self._storage.add(exp)
            self._sampler.on_add(self._storage, env_ids, counts_before)

    def add_steps(self, exp: Experience) -> None:
        """Append ``T`` steps per env at once, as ``T`` calls of ``add`` would: leaves ``[B, T, ...]`` (batch-major),
        ``exp.env_id`` ``[B, T]`` (every column the same unique envs); see ``RingBuffer.add_steps``. The sampler sees
        the ``B * T`` new slots in one ``on_add``."""
        with torch.inference_mode(False):
            if not self._sampler_tracks_adds:
                self._storage.add_steps(exp)
                return
            env_ids = exp.env_id[:, 0]
            num_steps = exp.env_id.shape[1]
            if num_steps > self.capacity:  # (slots written twice: one add at a time keeps on_add's leaves distinct)
                for t in range(num_steps):
                    self.add(nest.map_nest(lambda x, t=t: x.select(1, t), exp))
                return
            counts_before = self._storage.write_count().index_select(0, env_ids)
            self._storage.add_steps(exp)
            written = counts_before[:, None] + torch.arange(num_steps)  # [B, T] absolute indices
            self._sampler.on_add(self._storage, env_ids[:, None].expand_as(written).reshape(-1), written.reshape(-1))

    def set_acting_iteration(self, iteration: int) -> None:
        """The steps added from now on were acted by the parameters of training iteration ``iteration``."""
        self._storage.next_policy_iteration = iteration

    def set_current_iteration(self, iteration: int) -> None:
        """Training iteration ``iteration`` begins: policy ages (and replay retirement's staleness) count from it."""
        self.current_iteration = iteration
        if hasattr(self._sampler, "current_iteration"):  # (a RetiringSampler)
            self._sampler.current_iteration = iteration

    def policy_iterations(self, env_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """int32 ``[N]``: the training iteration whose parameters acted the stored steps at absolute ``positions``
        ``[N]`` of rings ``env_ids`` ``[N]`` (host or device indices; the answer is on the host)."""
        slots = positions.cpu() % self.capacity
        return self._storage.policy_iterations[env_ids.cpu(), slots]

    def clear(self, keep_last: int = 0) -> None:
        """Forget everything except the newest ``keep_last`` steps of each env (they keep their absolute indices)."""
        oldest_before = self._storage.oldest_index()
        self._storage.clear(keep_last)
        self._sampler.on_clear(self._storage, oldest_before)

    def forget_before(self, index: torch.Tensor) -> None:
        """Forget each env's steps before absolute index ``index`` ``[num_envs]`` (a per-env ``clear``)."""
        with torch.inference_mode(False):
            oldest_before = self._storage.oldest_index()
            self._storage.forget_before(index)
            self._sampler.on_clear(self._storage, oldest_before)

    def truncate_episodes(self, env_ids: Optional[torch.Tensor] = None) -> None:
        """Mark the newest stored step of every env (or of ``env_ids``) LAST (a time-limit truncation); see
        ``RingBuffer``."""
        self._storage.truncate_episodes(env_ids)

    # --------------------------------------------------------------------------------------------------- sampling --
    def sample(self, batch_size: int, length: int, on_device: bool = False,
               num_batches: int = 1) -> tuple[Experience, BatchInfo]:
        """``batch_size`` sequences of ``length`` contiguous steps of one env each, raw and batch-major ``[B, L]``
        (``num_batches`` mini-batches drawn at once: ``[num_batches * B, L]``, see ``Sampler.sample``).

        ``BatchInfo``: ``env_ids`` and ``positions`` (absolute index of each sequence's first step) int64 ``[B]``,
        ``importance_weights`` float32 ``[B]`` (prioritized) or ``None`` (uniform).

        The batch is on the storage's device, or (``on_device=True``: for callers without sample-time transformers)
        on the training device with its info, as ``to_device`` returns them (that info is the learner's: give
        ``update_priorities`` the info of a plain ``sample`` unless the sampler keeps its indices on that device).
        With a host storage and a CUDA training device the host batch's leaves are pinned staging buffers,
        overwritten by the second next ``sample``. No host sync once enough steps are stored.
        """
        stale_before = getattr(self._sampler, "stale_before", None)  # (a RetiringSampler's, once per iteration)
        if stale_before is not None and (index := stale_before(self._storage)) is not None:
            oldest = self._storage.oldest_index()
            self.forget_before(index)
            self.stale_forgotten += int((self._storage.oldest_index() - oldest).sum())
        info = self._last_sample = self._sampler.sample(self._storage, batch_size, length, num_batches)
        steps = self._steps
        if steps.numel() != length or steps.device != info.positions.device:
            steps = self._steps = torch.arange(length, device=info.positions.device)
        index = info.positions.unsqueeze(1) + steps  # [B, L] absolute indices
        exp = self._stager.gather(self._storage, info.env_ids, index)
        return self.to_device(exp, info) if on_device else (exp, info)

    def to_device(self, exp: Experience, batch_info: BatchInfo) -> tuple[Experience, BatchInfo]:
        """``exp`` (a sampled and possibly transformed batch, any nest of tensors) and ``batch_info`` (indices and
        importance weights) on the training device, for the learner; keep the ``batch_info`` given (where the sampler
        put it) for ``update_priorities``. See ``BatchStager.to_device``; the inputs themselves when nothing has to
        move."""
        return self._stager.to_device(exp, batch_info)

    def stage(self, tree: Any) -> Any:
        """``tree`` (any nest of tensors: a batch ``sample`` just gathered, steps read with ``gather_at``) on the
        training device, through the same staging buffers as ``to_device``; ``tree`` itself when it is there."""
        return self._stager.stage(tree)

    def update_priorities(self, batch_info: BatchInfo, priorities: torch.Tensor | tuple | None) -> None:
        """New priorities ``[B]`` for the sequences of a sample (``BatchInfo`` as ``sample`` returned it).

        ``None`` or ``()`` (an algorithm that computes none) does nothing, as does a sampler without priorities.
        ``priorities`` may live on the training device; no host sync (see ``PrioritizedSampler.update_priorities``).
        """
        if priorities is None or (isinstance(priorities, tuple) and not priorities):
            return
        if not isinstance(priorities, torch.Tensor):
            raise TypeError(f"priorities must be a tensor [B] (or None / () for none), got {type(priorities).__name__}")
        self._sampler.update_priorities(self._storage, batch_info, priorities)

    def gather_all(self) -> tuple[Experience, BatchInfo]:
        """Every readable step, ``[num_envs, T]`` (all envs must hold the same ``T``), with ``BatchInfo(env_ids=
        arange(num_envs), positions=oldest_index())`` (no importance weights)."""
        exp = self._storage.gather_all()
        return exp, BatchInfo(env_ids=torch.arange(self.num_envs), positions=self._storage.oldest_index())

    # ----------------------------------------------------------------------------------------- reading (for the
    # transformers' sample view: frame stacking and hindsight relabelling read neighbouring stored steps) --
    def num_stored(self) -> torch.Tensor:
        """Readable steps ``[num_envs]`` per env."""
        return self._storage.num_stored()

    def __len__(self) -> int:
        """Readable steps summed over envs."""
        return self._storage.total_stored()

    def oldest_index(self) -> torch.Tensor:
        """Absolute index ``[num_envs]`` of the oldest readable step of each env."""
        return self._storage.oldest_index()

    def write_count(self) -> torch.Tensor:
        """Steps ever written per env ``[num_envs]`` (the absolute index the next step gets)."""
        return self._storage.write_count()

    def gather(self, env_ids: torch.Tensor, positions: torch.Tensor, length: int) -> Experience:
        """Sequences ``[N, length]`` starting at absolute indices ``positions`` ``[N]`` of rings ``env_ids`` ``[N]``."""
        return self._storage.gather(env_ids, positions, length)

    def gather_at(self, env_ids: torch.Tensor, index: torch.Tensor) -> Experience:
        """Steps ``[N, M]`` at absolute indices ``index`` ``[N, M]`` (readable ones) of rings ``env_ids`` ``[N]``."""
        return self._storage.gather_at(env_ids, index)

    def to_storage(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (a host tensor computed from the sampler's indices) where ``gather_at`` returns steps (see
        ``RingBuffer.to_storage``)."""
        return self._storage.to_storage(x)

    def episode_end(self, env_ids: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Absolute index of the last stored step of the episode holding step ``index`` of ring ``env_ids`` (same
        shapes); needs a storage built with ``track_episode_ends=True``."""
        return self._storage.episode_end(env_ids, index)

    def summary(self) -> dict[str, float]:
        """Scalars for TensorBoard (a buffer that mixes sources reports its mix): the age in iterations of the policy
        that acted the last batch sampled (mean and max over its sequences' first steps; once a collector says the
        current iteration), and with retirement the retired rows drawn again and the stale steps forgotten. (Reading
        the last batch's indices back is one device sync per summary where a sampler keeps them on a device.)"""
        scalars = {}
        if self.current_iteration is not None and self._last_sample is not None:
            ages = self.current_iteration - self.policy_iterations(self._last_sample.env_ids,
                                                                   self._last_sample.positions)
            scalars.update({"replay/sampled_policy_age": float(ages.float().mean()),
                            "replay/sampled_policy_age_max": float(ages.max())})
        redraws = getattr(self._sampler, "redraws", None)  # (a RetiringSampler's)
        if redraws is not None:
            scalars.update({"replay/retired_redraws": float(redraws),
                            "replay/stale_steps_forgotten": float(self.stale_forgotten)})
        return scalars

    # ---------------------------------------------------------------------------------------------- checkpointing --
    def state_dict(self) -> dict:
        """Tensors only: ``{"storage": ..., "sampler": ...}``; priority updates still in flight are applied first."""
        self._sampler.flush(self._storage)
        return {"storage": self._storage.state_dict(), "sampler": self._sampler.state_dict()}

    def load_state_dict(self, state: dict, example: Experience) -> None:
        """Restore from ``state_dict``: the storage first (the sampler reads its counters), then the sampler.
        ``example``: any Experience of the stored structure (see ``RingBuffer.load_state_dict``)."""
        self._storage.load_state_dict(state["storage"], example)
        self._sampler.load_state_dict(state["sampler"])


def online_replay_of(sink: object) -> Optional[ReplayBuffer]:
    """The ``ReplayBuffer`` a collector's sink adds to (the sink itself, or the online buffer of a mixed one) when it
    keeps policy iterations; None otherwise (no replay: an on-policy trajectory)."""
    buffer = getattr(sink, "online", sink)
    return buffer if isinstance(buffer, ReplayBuffer) else None
