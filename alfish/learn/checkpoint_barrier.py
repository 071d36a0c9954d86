"""Checkpoints under torchrun without a "hung rank": the ranks wait for rank 0's checkpoint in a barrier with a
timeout made for writing one, not in a collective with the short one.

Rank 0 alone writes checkpoints (DESIGN.md §3.8), with the replay buffer by default: gigabytes at scale, minutes on a
slow disk. The other ranks used to go on to the next collective (the stop-flag all-reduce, ``any_rank``) and wait
there with ``init_distributed.timeout_s`` (30 s), which a long save outlasts: the job then died as if rank 0 hung.

Chosen: waits whose timeout accounts for the save (b), rather than a quick snapshot written in the background (a, as
``torch.distributed.checkpoint``'s async save does), for three reasons:

- memory: a consistent background write needs a snapshot of what it writes, and a snapshot of a multi-GB replay
  buffer doubles its host memory in the middle of training (the machine that holds a 40 GB buffer rarely has 40 GB
  more);
- correctness: without that snapshot the buffer keeps changing while it is written (each iteration adds steps and
  overwrites the oldest), so the checkpoint would mix iterations and its counters, RNG states and priorities would
  not match its buffer: an exact resume would be lost, silently;
- simplicity: the ranks already agree on every point where a checkpoint is written (a due iteration, an agreed signal
  or callback request, the stop, the end), so one barrier there is all it takes; the write, its atomic rename and
  its errors stay where they were, in the training thread, instead of a thread that must be joined, checked and
  ordered against the next write and the exit.

Its cost: the other ranks idle while rank 0 writes, which they did before too (every rank waits for rank 0 at the next
collective anyway); it bounds no write that was not already bounded.

How: ``init_distributed`` makes, on every rank, a gloo group whose timeout is ``init_distributed.checkpoint_timeout_s``
(``DistContext.checkpoint_group``). At each checkpoint point every rank calls ``wait_for_checkpoint``: rank 0 once
it has written the checkpoint, the others at once, so they wait there. While rank 0 writes, the job's store says so
(``writing_checkpoint``, ``heartbeat.writing_checkpoint``): a collective timeout diagnosed meanwhile says that rank 0
is writing a checkpoint, not that it hung. A write that outlasts ``checkpoint_timeout_s`` (a hung disk) still ends
the job: each waiting rank raises ``CheckpointWaitError``, one line naming rank 0, the checkpoint, how long it has been
writing and the setting to raise. The end of a run (``shutdown(synchronize=True)``) waits in the same group: rank 0
may still be writing its final checkpoint, evaluation record and summaries there.

Not waited for (the other ranks cannot know of them): the crash checkpoint, which rank 0 writes after its own failure
while the others are wherever they were (their collective times out, and the diagnosis names rank 0 as writing a
checkpoint, pointing at its error); and the best policy's checkpoint (``Trainer.keep_best_checkpoint``: the policy
alone, megabytes, written when an evaluation on rank 0 ends).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch.distributed as dist

from alfish.learn import heartbeat
from alfish.learn.distributed import DistContext, RankStoppedError


class CheckpointWaitError(RankStoppedError):
    """A rank waited longer than ``init_distributed.checkpoint_timeout_s`` for rank 0 to write a checkpoint."""


@contextlib.contextmanager
def writing_checkpoint(ctx: DistContext, iteration: int) -> Iterator[None]:
    """Around rank ``ctx.rank``'s write of the checkpoint of ``iteration``: the job's store says it is writing (no-op
    in a single process)."""
    if not ctx.enabled:
        yield
        return
    with heartbeat.writing_checkpoint(iteration, ctx.rank):
        yield


def wait_for_checkpoint(ctx: DistContext, iteration: int) -> None:
    """Every rank, at a checkpoint point: rank 0 after writing the checkpoint of ``iteration``, the others at once to
    wait for it, up to ``ctx.checkpoint_timeout_s``. No-op in a single process.

    Raises:
        CheckpointWaitError: the wait timed out (one line: rank 0 is still writing, or never started).
    """
    if not ctx.enabled:
        return
    try:
        dist.barrier(group=ctx.checkpoint_group)
    except Exception as err:
        if not heartbeat.is_timeout(err):
            raise
        raise CheckpointWaitError(_wait_timed_out(ctx, iteration)) from err


def _wait_timed_out(ctx: DistContext, iteration: int) -> str:
    if ctx.is_main:
        return (f"rank 0 wrote the checkpoint of iteration {iteration} but the other ranks did not meet it in the "
                f"checkpoint barrier within {ctx.checkpoint_timeout_s:g} s (init_distributed.checkpoint_timeout_s); "
                "look at their errors")
    writing = heartbeat.checkpoint_in_progress(0)
    if writing is None:
        state = "rank 0 has not been writing it (it failed, hung or stopped before: look at its error or stack)"
    else:
        state = f"rank 0 has been writing the checkpoint of iteration {writing[0]} for {writing[1]:.0f} s"
    return (f"rank {ctx.rank} waited {ctx.checkpoint_timeout_s:g} s (init_distributed.checkpoint_timeout_s) for rank "
            f"0 to write the checkpoint of iteration {iteration}; {state}; if writes of this size take longer (a "
            "multi-GB replay buffer on a slow disk), raise init_distributed.checkpoint_timeout_s or set "
            "Trainer.save_replay_buffer = False")
