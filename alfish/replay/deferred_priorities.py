"""Priority updates computed on the device for segment trees kept on the host: copied without waiting, applied late.

Reading ``[B]`` priorities from the GPU right after the update that computed them would make the host wait for that
whole update. Instead ``push`` enqueues a ``non_blocking`` copy into pinned host memory and records a CUDA event behind
it; the update is applied at the second ``take_ready`` (i.e. the second ``sample``) after the push, waiting on that
event, which by then has normally passed: while the host samples batch ``k + 1`` the device still runs update ``k``,
and the priorities of update ``k`` reach the trees before batch ``k + 2`` is drawn. So priorities land one update
late; the order of the updates is kept, and the rule does not depend on timing (same-seed runs stay the same).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from alfish.data.types import BatchInfo


@dataclass
class _Pending:
    batch_info: BatchInfo
    priorities: torch.Tensor  # [B] float32, pinned host memory (being filled by the copy until ``event`` passes)
    event: Any  # torch.cuda.Event, or anything with its ``query()`` and ``synchronize()``
    seen: bool = False  # a take_ready has passed since the push: the next one applies it


class DeferredPriorities:
    """A FIFO of priority updates whose values are still in flight from the device (see the module docstring)."""

    def __init__(self) -> None:
        self._queue: list[_Pending] = []

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, batch_info: BatchInfo, priorities: torch.Tensor) -> None:
        """Queue ``priorities`` ``[B]`` (on a CUDA device) for the sequences of ``batch_info`` (host indices): one
        ``non_blocking`` copy into a pinned buffer and an event behind it; nothing waits."""
        host = torch.empty(priorities.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(priorities.detach().to(torch.float32), non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(priorities.device))
        self.push_copy(batch_info, host, event)

    def push_copy(self, batch_info: BatchInfo, host_priorities: torch.Tensor, event: Any) -> None:
        """Queue a copy already under way into ``host_priorities``, complete once ``event.query()`` is true."""
        self._queue.append(_Pending(batch_info, host_priorities, event))

    def take_ready(self) -> list[tuple[BatchInfo, torch.Tensor]]:
        """Called by every ``sample``: the updates pushed before the previous call, oldest first, after waiting for
        their copies; those pushed since the previous call are kept for the next one."""
        ready = [p for p in self._queue if p.seen]
        self._queue = [p for p in self._queue if not p.seen]
        for pending in self._queue:
            pending.seen = True
        return self._finish(ready)

    def take_all(self) -> list[tuple[BatchInfo, torch.Tensor]]:
        """Every queued update, oldest first, after waiting for its copy (before a checkpoint)."""
        ready, self._queue = self._queue, []
        return self._finish(ready)

    def clear(self) -> None:
        """Drop every queued update (a checkpoint was loaded over the priorities they were computed for)."""
        self._queue = []

    @staticmethod
    def _finish(ready: list[_Pending]) -> list[tuple[BatchInfo, torch.Tensor]]:
        for pending in ready:
            if not pending.event.query():  # normally passed long ago (see the module docstring)
                pending.event.synchronize()
        return [(p.batch_info, p.priorities) for p in ready]
