"""The checkpoint barrier's wait (``alfish.learn.checkpoint_barrier``): nothing in a single process; a wait that times
out is one line naming rank 0's write, which the collective-timeout diagnosis leaves as it is. (The wait itself, in a
real 2-rank job with a slow write: tests/trainer/test_distributed.py.)"""
import re
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from alfish.learn import checkpoint_barrier, heartbeat
from alfish.learn.checkpoint_barrier import CheckpointWaitError, wait_for_checkpoint, writing_checkpoint
from alfish.learn.distributed import DistContext, RankStoppedError, explain_collective_timeout

GLOO_TIMEOUT = RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 2000ms "
                            "for recv operation to complete")
RANK_1 = DistContext(rank=1, world_size=2, checkpoint_timeout_s=2.0)


@pytest.fixture
def store(monkeypatch):
    """The job's store, as torchrun's (a real TCPStore), for the code that asks for the default one."""
    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, timeout=timedelta(seconds=5),
                          wait_for_workers=False)
    monkeypatch.setattr(heartbeat, "_store", lambda: store)
    return store


def barrier_times_out(monkeypatch, error=GLOO_TIMEOUT):
    def barrier(group=None):
        raise error

    monkeypatch.setattr(checkpoint_barrier.dist, "barrier", barrier)


def test_a_single_process_neither_waits_nor_marks(monkeypatch):
    barrier_times_out(monkeypatch)  # (would raise if called)
    with writing_checkpoint(DistContext(), 3):
        wait_for_checkpoint(DistContext(), 3)


def test_a_wait_longer_than_the_checkpoint_timeout_names_rank_0s_write(store, monkeypatch):
    barrier_times_out(monkeypatch)
    start = time.monotonic()
    with writing_checkpoint(DistContext(rank=0, world_size=2), 40):  # (rank 0's mark, as rank 0 would leave it)
        with pytest.raises(CheckpointWaitError) as raised:
            wait_for_checkpoint(RANK_1, 40)
    elapsed = time.monotonic() - start
    match = re.fullmatch(r"rank 1 waited 2 s \(init_distributed\.checkpoint_timeout_s\) for rank 0 to write the "
                         r"checkpoint of iteration 40; rank 0 has been writing the checkpoint of iteration 40 for "
                         r"(\d+) s; if writes of this size take longer \(a multi-GB replay buffer on a slow disk\), "
                         r"raise init_distributed\.checkpoint_timeout_s or set Trainer\.save_replay_buffer = False",
                         str(raised.value))
    assert match and int(match.group(1)) <= round(elapsed) + 1, str(raised.value)
    assert raised.value.__cause__ is GLOO_TIMEOUT
    # it names the rank already: the diagnosis (which would wait heartbeat.GRACE_S) leaves it as it is
    start = time.monotonic()
    assert explain_collective_timeout(raised.value, RANK_1) is raised.value
    assert time.monotonic() - start < 0.5 and isinstance(raised.value, RankStoppedError)


def test_a_wait_for_a_write_that_never_started_says_so(store, monkeypatch):
    barrier_times_out(monkeypatch)
    with pytest.raises(CheckpointWaitError, match=r"; rank 0 has not been writing it \(it failed, hung or stopped "
                                                  r"before: look at its error or stack\); "):
        wait_for_checkpoint(RANK_1, 40)


def test_other_failures_of_the_barrier_are_not_turned_into_a_timeout(store, monkeypatch):
    closed = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
    barrier_times_out(monkeypatch, closed)
    with pytest.raises(RuntimeError) as raised:
        wait_for_checkpoint(RANK_1, 40)
    assert raised.value is closed
