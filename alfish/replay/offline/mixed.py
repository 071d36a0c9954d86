"""``MixedReplayBuffer``: online and offline replay seen as one buffer (RLPD's symmetric sampling, Ball et al. 2023).

Each ``sample(B, L)`` draws ``round(B * offline_fraction)`` sequences from the offline buffer and the rest from the
online one, and returns them as one batch (online rows first): ``mini_batch_size`` is the total of both parts. The
fraction may be a schedule; the fraction actually drawn is reported as ``replay/offline_fraction`` and the counts of
sequences drawn from each part are checkpointed, so the figure continues across a resume.

The offline rings are addressed as envs ``num_online_envs ..`` of the mixture: transformers that read neighbouring
stored steps (frame stacking, hindsight) call ``gather_at`` / ``episode_end`` / ``oldest_index`` with the batch's
``env_ids`` and are routed to the right part. Online steps are added to, and cleared from, the online part only.

Devices. The offline data always lives on the host; the online rings may live on the training device
(``DevicePolicy.replay_storage='device'``). A mixed sample is where the online storage is: the offline rows are
gathered into the offline buffer's pinned staging buffers and copied there, one non-blocking copy per field
(``ReplayBuffer.stage``), before the two parts are joined, and so are the offline steps that the transformers read
(``gather_at``). The sample's ``BatchInfo`` keeps its indices where the online sampler keeps them (the host, or the
device for prioritized trees there), the offline sampler's host indices joining them in one non-blocking copy, and
its importance weights with the batch. ``update_priorities`` hands each part's sampler the indices that sampler
drew, on its own device, so no index is read back from the device.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from alfish.data import nest
from alfish.data.types import BatchInfo, Experience
from alfish.replay.offline.offline_buffer import OfflineReplayBuffer
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.transfer import host_to_device
from alfish.schedulers import Scheduler, as_scheduler


class MixedReplayBuffer:
    """Online ``ReplayBuffer`` + ``OfflineReplayBuffer``, sampled together (see the module docstring).

    Args:
        online: the buffer the collector adds to.
        offline: the offline data.
        offline_fraction: share of each batch drawn from the offline data, in [0, 1] (a number or a schedule).
    """

    def __init__(self, online: ReplayBuffer, offline: OfflineReplayBuffer, offline_fraction: float | Scheduler = 0.5):
        self.online, self.offline = online, offline
        self.offline_fraction = as_scheduler(offline_fraction)
        if offline.storage.device != online.storage.device and offline.device != online.storage.device:
            raise ValueError(f"the offline data (on {offline.storage.device}) is mixed into samples of the online "
                             f"storage on {online.storage.device}, so its buffer must hand batches to that device, "
                             f"not to {offline.device}")
        self.drawn = torch.zeros(2, dtype=torch.int64)  # sequences drawn so far: [online, offline]
        self._last_split: Optional[tuple[int, int]] = None  # (online rows, offline rows) of the last sample
        # The last sample's BatchInfo, and each part's as its sampler drew it (for update_priorities).
        self._last_sample: Optional[BatchInfo] = None
        self._last_parts: tuple[Optional[BatchInfo], Optional[BatchInfo]] = (None, None)

    # --------------------------------------------------------------------------------- as the online buffer ----
    @property
    def device(self) -> torch.device:
        return self.online.device

    @property
    def storage(self) -> RingBuffer:
        """The online rings (what a checkpoint's ``replay_layout`` describes)."""
        return self.online.storage

    @property
    def num_envs(self) -> int:
        """Online envs (the offline rings follow them as envs ``num_envs ..``)."""
        return self.online.num_envs

    @property
    def capacity(self) -> int:
        return self.online.capacity

    def add(self, exp: Experience) -> None:
        self.online.add(exp)

    def add_steps(self, exp: Experience) -> None:
        self.online.add_steps(exp)

    def clear(self, keep_last: int = 0) -> None:
        self.online.clear(keep_last)

    def truncate_episodes(self, env_ids: Optional[torch.Tensor] = None) -> None:
        self.online.truncate_episodes(env_ids)

    def __len__(self) -> int:
        """Steps collected online (what a warm-up or a refill looks at)."""
        return len(self.online)

    # ---------------------------------------------------------------------------------------------- sampling ----
    def split(self, batch_size: int) -> tuple[int, int]:
        """``(online, offline)`` sequences of a batch of ``batch_size``."""
        fraction = float(self.offline_fraction())
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"offline_fraction must lie in [0, 1], got {fraction}")
        offline = int(round(batch_size * fraction))
        return batch_size - offline, offline

    def sample(self, batch_size: int, length: int, on_device: bool = False) -> tuple[Experience, BatchInfo]:
        """``batch_size`` sequences ``[B, L]``: the online part's rows first, then the offline part's (see the module
        docstring), where the online storage is (``on_device``: on the training device, with its info, as
        ``to_device`` returns them). ``BatchInfo.env_ids`` of offline rows are ``num_envs + ring``; give the info
        returned to ``update_priorities``."""
        n_online, n_offline = self.split(batch_size)
        device = self.sample_device
        parts, infos, drawn = [], [], []
        for buffer, n, first_env in ((self.online, n_online, 0), (self.offline, n_offline, self.num_envs)):
            if n == 0:
                drawn.append(None)
                continue
            exp, info = buffer.sample(n, length)
            if buffer.storage.device != device:  # the host offline data next to a device storage
                exp = buffer.stage(exp)
            drawn.append(info)
            parts.append(exp)
            infos.append(nest.replace_fields(info, env_ids=info.env_ids + first_env) if first_env else info)
        self.record_draw(n_online, n_offline)
        exp = parts[0] if len(parts) == 1 else nest.map_nest(lambda *x: torch.cat(x), *parts)
        info = infos[0] if len(infos) == 1 else concat_infos(infos, device)
        if on_device:
            exp, info = self.to_device(exp, info)
        self._last_sample, self._last_parts = info, (drawn[0], drawn[1])
        return exp, info

    @property
    def sample_device(self) -> torch.device:
        """Where samples (and the steps transformers read) are: the online storage's device."""
        return self.online.storage.device

    def record_draw(self, n_online: int, n_offline: int) -> None:
        """Count a batch of ``n_online`` + ``n_offline`` sequences (``HybridTraining`` samples the parts itself)."""
        self._last_split = (n_online, n_offline)
        self.drawn += torch.tensor([n_online, n_offline])

    def to_device(self, exp: Experience, batch_info: BatchInfo) -> tuple[Experience, BatchInfo]:
        return self.online.to_device(exp, batch_info)

    def update_priorities(self, batch_info: BatchInfo, priorities) -> None:
        """Split ``priorities [B]`` of the last sample (``batch_info``: the info it returned) between the two parts
        (each ignores them if not prioritized), each with the indices its sampler drew, on that sampler's device."""
        if priorities is None or (isinstance(priorities, tuple) and not priorities):
            return
        if batch_info is not self._last_sample:
            raise ValueError("MixedReplayBuffer.update_priorities takes the priorities of its last sample, with the "
                             "BatchInfo that sample returned")
        n_online = self._last_split[0]
        online, offline = self._last_parts
        if online is not None:
            self.online.update_priorities(online, priorities[:n_online])
        if offline is not None:
            self.offline.update_priorities(offline, priorities[n_online:])

    def gather_all(self):
        raise RuntimeError("whole-buffer training (TrainerConfig.whole_replay_buffer_training) cannot mix offline data "
                           "in; sample mini-batches instead")

    # ---------------------------------------------------- reading by env id (transformers' sample view) ----
    def num_stored(self) -> torch.Tensor:
        return torch.cat([self.online.num_stored(), self.offline.num_stored()])

    def oldest_index(self) -> torch.Tensor:
        return torch.cat([self.online.oldest_index(), self.offline.oldest_index()])

    def write_count(self) -> torch.Tensor:
        return torch.cat([self.online.write_count(), self.offline.write_count()])

    def gather(self, env_ids: torch.Tensor, positions: torch.Tensor, length: int) -> Experience:
        return self.gather_at(env_ids, positions.unsqueeze(1) + torch.arange(length))

    def gather_at(self, env_ids: torch.Tensor, index: torch.Tensor) -> Experience:
        """Steps where samples are (``sample_device``): the offline part's are staged there."""
        return self._route(env_ids, index, lambda buffer, ids, idx: self._on_sample_device(buffer,
                                                                                           buffer.gather_at(ids, idx)))

    def to_storage(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (a host tensor computed from sample indices) where ``gather_at`` returns steps."""
        return self.online.to_storage(x)

    def _on_sample_device(self, buffer: ReplayBuffer, steps: Experience) -> Experience:
        return steps if buffer.storage.device == self.sample_device else buffer.stage(steps)

    def episode_end(self, env_ids: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return self._route(env_ids, index, lambda buffer, ids, idx: buffer.episode_end(ids, idx))

    def _route(self, env_ids: torch.Tensor, index: torch.Tensor, read):
        """``read(part, env ids in the part, index)`` for the rows of each part, reassembled in the order asked."""
        offline_rows = env_ids >= self.num_envs
        if not bool(offline_rows.any()):
            return read(self.online, env_ids, index)
        if bool(offline_rows.all()):
            return read(self.offline, env_ids - self.num_envs, index)
        on, off = (~offline_rows).nonzero().squeeze(1), offline_rows.nonzero().squeeze(1)
        first = read(self.online, env_ids[on], index[on])
        second = read(self.offline, env_ids[off] - self.num_envs, index[off])
        order = torch.argsort(torch.cat([on, off]))
        return nest.map_nest(lambda a, b: torch.cat([a, b]).index_select(0, host_to_device(order, a.device)), first,
                             second)

    # ------------------------------------------------------------------------------------------ summaries ----
    def summary(self) -> dict[str, float]:
        """``replay/offline_fraction``: the share of the last batch drawn offline; ``replay/offline_fraction_total``:
        over the run (restored on resume); and the online buffer's own (the policy age of its part of the batch)."""
        out = self.online.summary()
        if self._last_split is not None:
            out["replay/offline_fraction"] = self._last_split[1] / max(1, sum(self._last_split))
        total = int(self.drawn.sum())
        if total:
            out["replay/offline_fraction_total"] = float(self.drawn[1]) / total
        return out

    # ---------------------------------------------------------------------------------------- checkpoints ----
    def state_dict(self) -> dict:
        return {"online": self.online.state_dict(), "offline": self.offline.state_dict(), "drawn": self.drawn.clone()}

    def load_state_dict(self, state: dict, example: Experience) -> None:
        if "online" not in state:
            raise ValueError("the checkpoint's replay buffer was saved without offline data (no 'online' part); "
                             "resume it with the offline_buffer_dir it was trained with, or start a new root_dir")
        self.online.load_state_dict(state["online"], example)
        self.offline.load_state_dict(state["offline"])
        self.drawn = state["drawn"].clone()


def concat_infos(infos: Sequence[BatchInfo], weight_device: torch.device) -> BatchInfo:
    """The infos of consecutive blocks of rows as one ``BatchInfo``: indices where the first block's are (its
    sampler's), the others' (host, or there already) joining them in one non-blocking copy each
    (``transfer.host_to_device``);
    importance weights on ``weight_device`` (the batch's), a block sampled uniformly weighing 1; ``None`` when no
    block has weights."""
    index_device = infos[0].env_ids.device

    def cat(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
        return torch.cat([host_to_device(x, device) for x in tensors])

    env_ids = cat([i.env_ids for i in infos], index_device)
    positions = cat([i.positions for i in infos], index_device)
    if all(i.importance_weights is None for i in infos):
        return BatchInfo(env_ids=env_ids, positions=positions)
    weights = [i.importance_weights if i.importance_weights is not None
               else torch.ones(len(i.env_ids), device=weight_device) for i in infos]
    return BatchInfo(env_ids=env_ids, positions=positions, importance_weights=cat(weights, weight_device))
