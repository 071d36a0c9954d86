"""The shared parameter block: a publish waiting for a lock that a dead reader still holds (a SIGKILLed child never
releases it) asks its ``keep_waiting`` every poll, so the child's death is reported at once, not after the 10 s lock
timeout."""
import multiprocessing as mp
import time

import pytest
import torch

from alfish.collect.shared_params import AsyncUnrollError, ParamBlock, SharedParams


def test_a_publish_blocked_by_a_dead_reader_reports_it_within_a_poll():
    shared = SharedParams(mp.get_context("spawn"))
    block = ParamBlock(shared, {"w": torch.zeros(3)})
    try:
        assert block.write({"w": torch.ones(3)}, (1.0, 2.0, 0.5)) == 1  # free lock: published
        assert shared.lock.acquire(timeout=1.0)  # the "reader" takes the lock and dies with it
        asked = []

        def reader_gone() -> bool:
            asked.append(time.monotonic())
            raise AsyncUnrollError("the async unroll child (pid 1) was killed by signal SIGKILL")

        start = time.monotonic()
        with pytest.raises(AsyncUnrollError, match="killed by signal SIGKILL"):
            block.write({"w": torch.full((3,), 2.0)}, (2.0, 4.0, 1.0), keep_waiting=reader_gone)
        assert len(asked) == 1 and time.monotonic() - start < 1.0
        assert shared.version.value == 1  # nothing was published
    finally:
        block.close(unlink=True)
