"""The collective-timeout diagnosis names the rank that stopped making progress (a real TCPStore, as torchrun's)."""
import re
import time
import types
from datetime import timedelta

import pytest
import torch.distributed as dist

from alfish.learn import heartbeat


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, timeout=timedelta(seconds=5),
                         wait_for_workers=False)


@pytest.fixture(autouse=True)
def no_throttle(monkeypatch):
    monkeypatch.setattr(heartbeat._State, "last_write", float("-inf"))


def test_the_rank_that_did_not_time_out_is_named_with_its_last_iteration(store):
    start = time.monotonic()
    heartbeat.beat(41, rank=1, store=store)
    heartbeat._State.last_write = float("-inf")
    heartbeat.beat(42, rank=0, store=store)
    line = heartbeat.diagnose_timeout(rank=0, world_size=2, grace_s=0.5, store=store)
    elapsed = time.monotonic() - start  # the grace, and on a loaded machine more: the age is at most this
    match = re.match(r"rank 1 \(last progress: iteration 41, (\d+) s ago\) stopped making progress", line)
    assert match and 0 <= int(match.group(1)) <= round(elapsed) + 1, (line, elapsed)
    assert "rank 0 timed out waiting for it in a collective" in line
    assert "\n" not in line


def test_a_rank_writing_a_checkpoint_is_named_as_writing_not_as_hung(store):
    """Rank 0 writes the crash checkpoint after its own failure while rank 1 waits in a collective: rank 1's timeout
    names rank 0's write, not a hang; the mark goes when the write ends."""
    heartbeat.beat(39, rank=0, store=store)
    start = time.monotonic()
    with heartbeat.writing_checkpoint(40, rank=0, store=store):
        assert heartbeat.checkpoint_in_progress(0, store)[0] == 40
        line = heartbeat.diagnose_timeout(rank=1, world_size=2, grace_s=0.3, store=store)
    elapsed = time.monotonic() - start
    match = re.fullmatch(r"rank 0 \(writing the checkpoint of iteration 40 for (\d+) s\) is writing a checkpoint, not "
                         r"hung; rank 1 timed out waiting for it in a collective \(a checkpoint written then follows a "
                         r"failure of that rank: look at its error\)", line)
    assert match and int(match.group(1)) <= round(elapsed) + 1, line
    assert heartbeat.checkpoint_in_progress(0, store) is None
    assert heartbeat.diagnose_timeout(rank=1, world_size=2, grace_s=0.1, store=store).startswith(
        "rank 0 (last progress: iteration 39, ")  # no longer writing: silent again, as a hung rank


def test_no_rank_is_blamed_when_every_rank_timed_out(store):
    store.set("alfish/timed_out/1", "0")  # rank 1 timed out too: a mismatched collective, not a hung rank
    assert heartbeat.diagnose_timeout(rank=0, world_size=2, grace_s=0.5, store=store) is None


def test_several_silent_ranks_and_a_rank_that_never_beat(store):
    start = time.monotonic()
    heartbeat.beat(7, rank=2, store=store)
    line = heartbeat.diagnose_timeout(rank=0, world_size=3, grace_s=0.2, store=store)
    elapsed = time.monotonic() - start
    match = re.match(r"rank 1 \(no progress recorded\), rank 2 \(last progress: iteration 7, (\d+) s ago\) all "
                     r"stopped making progress", line)
    assert match and 0 <= int(match.group(1)) <= round(elapsed) + 1, (line, elapsed)
    assert "waiting for them" in line


def test_beats_are_throttled(store, monkeypatch):
    now = [1000.0]  # the wall clock beats read: stepped by the test (a real one may jump on a loaded machine)
    monkeypatch.setattr(heartbeat, "time", types.SimpleNamespace(time=lambda: now[0]))
    heartbeat.beat(1, rank=0, store=store)
    now[0] += 0.9 * heartbeat.BEAT_INTERVAL_S
    heartbeat.beat(2, rank=0, store=store)  # within BEAT_INTERVAL_S of the first: not written
    assert store.get("alfish/progress/0").decode().split() == ["1", "1000.000"]
    now[0] += 0.1 * heartbeat.BEAT_INTERVAL_S
    heartbeat.beat(3, rank=0, store=store)  # BEAT_INTERVAL_S after the first: written
    assert store.get("alfish/progress/0").decode().split()[0] == "3"


@pytest.mark.parametrize("error, expected", [
    (RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms for recv operation"), True),
    (RuntimeError("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)"), True),
    (RuntimeError("Connection reset by peer"), False),
    (ValueError("timed out"), False),
])
def test_is_timeout(error, expected):
    assert heartbeat.is_timeout(error) is expected
