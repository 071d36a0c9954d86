"""The shared parameter block: a publish waiting for a lock that a dead reader still holds (a SIGKILLed child never
releases it) asks its ``keep_waiting`` every poll, so the child's death is reported at once, not after the 10 s lock
timeout; a publish from a device crosses to the host in one copy (the block's bytes packed there), byte for byte what
a host publish writes."""
import multiprocessing as mp
import time

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from alfish.collect import shared_params
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


# ------------------------------------------------------------------------------- one host copy per publish ---

class HostCopies(TorchDispatchMode):
    """Counts the copies out of a device into host memory (``_to_copy`` to the CPU, ``copy_`` into a host tensor).
    The "device" is ``meta``, which has no values: such a copy returns zeros on the host instead."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and args[0].device.type != "cpu" \
                and torch.device(kwargs.get("device") or args[0].device).type == "cpu":
            self.count += 1
            return torch.zeros(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
        if func is torch.ops.aten.copy_.default and args[0].device.type == "cpu" and args[1].device.type != "cpu":
            self.count += 1
            return args[0]
        return func(*args, **kwargs)


def mixed_state(device: str) -> dict[str, torch.Tensor]:
    """A rollout state with many tensors of several dtypes and shapes (0-d included), like a policy's with its
    normalizer statistics."""
    g = torch.Generator().manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(5, 5) for _ in range(12)])
    state = {f"algorithm.{k}": v for k, v in net.state_dict().items()}
    state.update({"transformer.count": torch.tensor(7, dtype=torch.int64),
                  "transformer.mean": torch.randn(3, generator=g, dtype=torch.float64),
                  "transformer.half": torch.randn(2, 3, generator=g).half(),
                  "transformer.mask": torch.tensor([True, False, True]),
                  "transformer.t": torch.randn(4, 3, generator=g).t()})  # not contiguous
    return {k: v.to(device) for k, v in state.items()}


def test_a_publish_from_a_device_crosses_to_the_host_in_one_copy_whatever_the_number_of_tensors():
    state = mixed_state("meta")
    assert len(state) > 20
    block = ParamBlock(SharedParams(mp.get_context("spawn")), state)
    try:
        with HostCopies() as copies:
            block.write(state, (1.0, 2.0, 0.5))
        assert copies.count == 1, f"{copies.count} device-to-host copies for one publish of {len(state)} tensors"
        with HostCopies() as copies:
            assert block.write(state, (2.0, 4.0, 1.0)) == 2
        assert copies.count == 1
    finally:
        block.close(unlink=True)


def test_the_packed_bytes_of_a_device_publish_are_the_block_a_host_publish_writes_and_reads_back():
    state = mixed_state("cpu")
    shared = SharedParams(mp.get_context("spawn"))
    block = ParamBlock(shared, state)
    try:
        block.write(state, (1.0, 2.0, 0.5))
        # What a publish from a GPU packs there and copies over:
        packed = shared_params.pack([shared_params.byte_view(state[name]) for name, _, _ in block.layout])
        assert torch.equal(packed, torch.from_numpy(block._view()[:packed.numel()].copy()))
        back = {k: torch.zeros_like(v) for k, v in state.items()}
        assert block.read_into(back) == (1, (1.0, 2.0, 0.5))
        for name, value in state.items():
            assert back[name].dtype == value.dtype and torch.equal(back[name], value), name
    finally:
        block.close(unlink=True)
