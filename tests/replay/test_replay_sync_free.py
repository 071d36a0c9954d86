"""Steady-state replay makes no host sync, and draws what it drew before it was made sync-free.

``sample`` + ``to_device`` + ``update_priorities`` run under ``SyncCounter`` (see ``sync_scenario.py``) for both
samplers and every storage location buildable on the CPU; the draws are compared with ``recorded_samples.RECORDED``,
made by the code before the change. The meta device runs the device-storage path with no values at all: any read of
a value would raise there.
"""
import operator

import pytest
import torch

from alfish.data.types import BatchInfo
from alfish.replay import PrioritizedSampler, ReplayBuffer, UniformSampler, make_storage
from alfish.replay.deferred_priorities import DeferredPriorities
from tests.replay.recorded_samples import RECORDED
from tests.replay.sync_scenario import (
    BATCH,
    CAPACITY,
    CONFIGS,
    NUM_ENVS,
    DeferringSampler,
    DoneEvent,
    SyncCounter,
    add,
    build,
    fill,
    priorities_of,
    run_rounds,
)

LOCATIONS = ["cpu", "mmap", "device"]  # 'device' is the CPU here


def storage_at(location, tmp_path, device="cpu"):
    return make_storage(location, NUM_ENVS, CAPACITY, device=device, scratch_dir=tmp_path)


# ------------------------------------------------------------------------------------ the counter counts at all --
t, f, b = torch.tensor(3), torch.tensor([1.5, 2.0]), torch.tensor(True)
SYNCING_CALLS = {
    "item": lambda: t.item(), "tolist": lambda: f.tolist(), "cpu": lambda: f.cpu(), "numpy": lambda: f.numpy(),
    "__bool__": lambda: 1 if b else 0, "__float__": lambda: float(t), "__int__": lambda: int(t),
    "__index__": lambda: operator.index(t), "equal": lambda: torch.equal(f, f), "nonzero": lambda: f.nonzero(),
    "__getitem__[bool mask]": lambda: f[f > 1.7], "repeat_interleave": lambda: torch.repeat_interleave(t.view(1)),
}


@pytest.mark.parametrize("name", sorted(SYNCING_CALLS))
def test_the_counter_sees_every_kind_of_syncing_call(name):
    with SyncCounter() as counter:
        SYNCING_CALLS[name]()
    assert counter.calls == [name]


def test_the_counter_ignores_ordinary_ops():
    with SyncCounter() as counter:
        torch.searchsorted(f, f).sum().float() * f[torch.tensor([1, 0])]
    assert counter.calls == []


# ------------------------------------------------------------------------------------------------ steady state --
@pytest.mark.parametrize("location", LOCATIONS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_steady_state_sample_and_update_make_no_sync_and_draw_as_recorded(name, location, tmp_path):
    buf, length = build(name, storage_at(location, tmp_path))
    fill(buf)
    draws, calls, batches = run_rounds(buf, length)
    assert calls == []
    assert draws == [tuple(r) for r in RECORDED[name]]
    for (env_ids, positions, _), exp in zip(draws, batches):  # and the data are those steps
        assert exp.rollout_info["index"].tolist() == [list(range(p, p + length)) for p in positions]
        assert exp.env_id[:, 0].tolist() == env_ids


def test_the_comparison_with_the_recording_can_fail(tmp_path):
    buf, length = build("prioritized_L2", storage_at("cpu", tmp_path))
    buf.sampler.generator.manual_seed(1235)
    fill(buf)
    assert run_rounds(buf, length)[0] != [tuple(r) for r in RECORDED["prioritized_L2"]]


@pytest.mark.parametrize("name", ["uniform_L3", "prioritized_L2"])
def test_sample_on_device_on_a_cpu_buffer_returns_the_sample_itself(name, tmp_path):
    buf, length = build(name, storage_at("cpu", tmp_path), device="cpu")
    fill(buf)
    exp, info = buf.sample(BATCH, length)
    assert buf.to_device(exp, info)[0] is exp and buf.to_device(exp, info)[1] is info
    with SyncCounter() as counter:
        buf.sample(BATCH, length, on_device=True)
    assert counter.calls == []


# ---------------------------------------------------------------------------------------------------- meta device --
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_storage_and_trees_on_the_meta_device_sample_and_update_without_values(kind):
    """Meta tensors have shapes but no values: the draws run on the CPU (uniform) or on meta trees (prioritized),
    the gather and the priority update on meta. Any read of a value raises, and the counter sees none."""
    storage = make_storage("device", NUM_ENVS, CAPACITY, device="meta")
    gen = torch.Generator().manual_seed(0)
    sampler = (UniformSampler(gen) if kind == "uniform"
               else PrioritizedSampler(NUM_ENVS, CAPACITY, sequence_length=2, generator=gen, device="meta"))
    buf = ReplayBuffer(storage, sampler)
    fill(buf)
    for _ in range(3):
        add(buf, torch.tensor([0, 2]))
        with SyncCounter() as counter:
            exp, info = buf.sample(BATCH, 2)
            exp, dev_info = buf.to_device(exp, info)
            buf.update_priorities(info, priorities_of(exp))
        assert counter.calls == []
        assert exp.observation.device.type == "meta" and exp.observation.shape == (BATCH, 2, 2)
        assert exp.env_id.shape == (BATCH, 2)
        if kind == "prioritized":
            assert info.positions.device.type == "meta" and dev_info.importance_weights.shape == (BATCH,)


# ------------------------------------------------------------------------------ deferred priority updates (CPU) --
def test_deferred_updates_are_applied_at_the_second_next_sample_in_order():
    queue = DeferredPriorities()
    info = BatchInfo(env_ids=torch.tensor([0]), positions=torch.tensor([1]))
    queue.push_copy(info, torch.tensor([1.0]), DoneEvent())
    assert queue.take_ready() == []  # the sample right after the update: its copy may still run
    queue.push_copy(info, torch.tensor([2.0]), DoneEvent())
    assert [p.tolist() for _, p in queue.take_ready()] == [[1.0]]
    assert [p.tolist() for _, p in queue.take_ready()] == [[2.0]]
    assert queue.take_ready() == [] and len(queue) == 0
    queue.push_copy(info, torch.tensor([3.0]), DoneEvent())
    assert [p.tolist() for _, p in queue.take_all()] == [[3.0]]


def test_a_deferred_update_lands_before_the_second_next_sample_without_a_sync(tmp_path):
    buf, length = build("prioritized_L2", storage_at("cpu", tmp_path), sampler_cls=DeferringSampler)
    fill(buf)
    sampler = buf.sampler
    exp, info = buf.sample(BATCH, length)
    leaves = info.env_ids * CAPACITY + info.positions % CAPACITY
    before = sampler._assigned[leaves].clone()
    buf.update_priorities(info, torch.full((BATCH,), 5.0))
    with SyncCounter() as first:
        buf.sample(BATCH, length)
    assert torch.equal(sampler._assigned[leaves], before)  # not yet: one update late
    with SyncCounter() as second:
        buf.sample(BATCH, length)
    assert first.calls == second.calls == []
    assert torch.equal(sampler._assigned[leaves], (torch.full((BATCH,), 5.0) + 1e-6).pow(0.7))


def test_state_dict_applies_updates_still_in_flight(tmp_path):
    buf, length = build("prioritized_L2", storage_at("cpu", tmp_path), sampler_cls=DeferringSampler)
    fill(buf)
    _, info = buf.sample(BATCH, length)
    buf.update_priorities(info, torch.full((BATCH,), 5.0))
    assigned = buf.state_dict()["sampler"]["assigned"]
    assert torch.equal(assigned[info.env_ids * CAPACITY + info.positions % CAPACITY],
                       (torch.full((BATCH,), 5.0) + 1e-6).pow(0.7))
