"""Which rank of a torchrun job stopped making progress, when a collective times out.

A collective that times out fails on the ranks that were waiting, not on the rank they were waiting for: with a hung
(alive but stuck: a deadlocked env, a SIGSTOP, a swapping machine) rank 1, rank 0's gloo error says that *rank 0*
timed out, and torchrun's "Root Cause" repeats it. To name the right rank, each rank records its progress in the
job's rendezvous store (the TCPStore torchrun already runs), and a rank whose collective timed out reads everyone's:

- ``beat(iteration)``: called once per training iteration at the stop-flag sync (``any_rank``); writes
  ``alfish/progress/<rank> = "<iteration> <unix time>"`` at most once per ``BEAT_INTERVAL_S`` (one small TCP write per
  second: nothing next to an iteration).
- ``writing_checkpoint(iteration, rank)``: around a checkpoint write, ``alfish/checkpoint/<rank> = "<iteration> <unix
  time>"``, removed when the write ends. A rank writing a checkpoint makes no progress but is not hung: the ranks wait
  for it in the checkpoint barrier (``alfish.learn.checkpoint_barrier``), and the diagnosis says it is writing.
- ``diagnose_timeout(error)``: marks this rank as timed out, waits ``GRACE_S`` for the other live ranks to time out
  too (they wait in the same or the next collective, with the same timeout), then names the ranks that did not: the
  ones that stopped making progress, with their last iteration and how long ago that was, or the checkpoint they
  are writing and for how long.

The store is reached with short timeouts, so a diagnosis never adds a hang of its own; when the store is gone (the
agent died) the diagnosis is skipped and the original error stands.
"""
from __future__ import annotations

import contextlib
import logging
import time
from datetime import timedelta
from typing import Iterator, Optional

import torch.distributed as dist

logger = logging.getLogger(__name__)

BEAT_INTERVAL_S = 1.0
GRACE_S = 3.0
STORE_TIMEOUT_S = 2.0
_PROGRESS_KEY = "alfish/progress/{rank}"
_TIMED_OUT_KEY = "alfish/timed_out/{rank}"
_CHECKPOINT_KEY = "alfish/checkpoint/{rank}"
# Phrases of a collective that gave up waiting: gloo ("Timed out waiting 10000ms for recv"), NCCL's watchdog
# ("Watchdog caught collective operation timeout"), the store ("Socket Timeout", "wait timeout").
_TIMEOUT_PHRASES = ("timed out", "timeout")


class _State:
    last_write = float("-inf")


def _store() -> Optional[dist.Store]:
    """The job's rendezvous store, or None outside a process group (a private torch helper: there is no public one)."""
    if not dist.is_initialized():
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
        return store
    except Exception:  # noqa: BLE001  (no store, or a torch without the helper: no diagnosis)
        return None


def beat(iteration: int, rank: int, store: Optional[dist.Store] = None) -> None:
    """Record that ``rank`` reached ``iteration`` (at most once per ``BEAT_INTERVAL_S``) in ``store`` (default: the
    job's rendezvous store)."""
    now = time.time()
    if now - _State.last_write < BEAT_INTERVAL_S:
        return
    store = store or _store()
    if store is None:
        return
    try:
        store.set(_PROGRESS_KEY.format(rank=rank), f"{iteration} {now:.3f}")
        _State.last_write = now
    except Exception as err:  # noqa: BLE001  (the store is down: the collective will say so)
        logger.debug("heartbeat not written: %s", err)


@contextlib.contextmanager
def writing_checkpoint(iteration: int, rank: int, store: Optional[dist.Store] = None) -> Iterator[None]:
    """Record, for the time of the ``with`` block, that ``rank`` is writing the checkpoint of ``iteration`` (in
    ``store``, default: the job's rendezvous store; nothing outside a process group). The record stays when the write
    fails: the rank then is still "the one that was writing" for the others' diagnosis."""
    store = store or _store()
    if store is None:
        yield
        return
    key = _CHECKPOINT_KEY.format(rank=rank)
    try:
        store.set(key, f"{iteration} {time.time():.3f}")
    except Exception as err:  # noqa: BLE001  (the store is down: the next collective will say so)
        logger.debug("checkpoint mark not written: %s", err)
    yield
    try:
        store.delete_key(key)
    except Exception as err:  # noqa: BLE001
        logger.debug("checkpoint mark not removed: %s", err)


def checkpoint_in_progress(rank: int, store: Optional[dist.Store] = None) -> Optional[tuple[int, float]]:
    """``(iteration, seconds since it started)`` of the checkpoint ``rank`` is writing, or None (not writing, or no
    store to ask)."""
    store = store or _store()
    if store is None:
        return None
    key = _CHECKPOINT_KEY.format(rank=rank)
    try:
        if not store.check([key]):
            return None
        iteration, stamp = store.get(key).decode().split()
        # Never negative: the stamp comes from another process (on a multi-node job, another host's clock), and a
        # "-0 s" in the diagnosis would read as nonsense.
        return int(iteration), max(0.0, time.time() - float(stamp))
    except Exception as err:  # noqa: BLE001  (the store went away)
        logger.debug("no checkpoint mark read: %s", err)
        return None


def is_timeout(error: BaseException) -> bool:
    """True for a collective or store error that gave up waiting for another rank."""
    if not isinstance(error, (RuntimeError, dist.DistError)):
        return False
    text = str(error).lower()
    return any(phrase in text for phrase in _TIMEOUT_PHRASES)


def diagnose_timeout(rank: int, world_size: int, grace_s: float = GRACE_S,
                     store: Optional[dist.Store] = None) -> Optional[str]:
    """One line naming the ranks that stopped making progress, or None when it cannot tell.

    Call on a rank whose collective just timed out. Ranks that also report a timeout within ``grace_s`` were waiting
    too; the others are named, each with its last recorded iteration and its age."""
    store = store or _store()
    if store is None:
        return None
    try:
        store.set(_TIMED_OUT_KEY.format(rank=rank), f"{time.time():.3f}")
        deadline = time.monotonic() + grace_s
        others = [r for r in range(world_size) if r != rank]
        silent = others
        while silent and time.monotonic() < deadline:
            silent = [r for r in others if not store.check([_TIMED_OUT_KEY.format(rank=r)])]
            time.sleep(0.2)
        if not silent:
            return None  # every rank timed out: a collective mismatch, not a hung rank
        writing = {r: checkpoint_in_progress(r, store) for r in silent}
        now = time.time()
        parts = []
        for r in silent:
            key = _PROGRESS_KEY.format(rank=r)
            if writing[r] is not None:
                iteration, age = writing[r]
                parts.append(f"rank {r} (writing the checkpoint of iteration {iteration} for {age:.0f} s)")
            elif store.check([key]):
                iteration, stamp = store.get(key).decode().split()
                parts.append(f"rank {r} (last progress: iteration {iteration}, {now - float(stamp):.0f} s ago)")
            else:
                parts.append(f"rank {r} (no progress recorded)")
    except Exception as err:  # noqa: BLE001  (the store went away: keep the original error)
        logger.debug("no timeout diagnosis: %s", err)
        return None
    one = len(parts) == 1
    if all(w is not None for w in writing.values()):
        # The ranks wait for a due checkpoint in the checkpoint barrier, not in a collective: a rank writes one while
        # the others are in a collective only after its own failure (the crash checkpoint).
        return (f"{', '.join(parts)} {'is' if one else 'are'} writing a checkpoint, not hung; rank {rank} timed out "
                f"waiting for {'it' if one else 'them'} in a collective (a checkpoint written then follows a failure "
                f"of {'that rank' if one else 'those ranks'}: look at {'its' if one else 'their'} error)")
    return (f"{', '.join(parts)} {'stopped' if one else 'all stopped'} making progress (alive but not answering: "
            f"hung, stopped or swapping); rank {rank} timed out waiting for {'it' if one else 'them'} in a collective; "
            f"look at {'its stack' if one else 'their stacks'} (e.g. py-spy dump --pid PID)")
