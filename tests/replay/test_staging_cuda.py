"""Replay on a CUDA device: pinned staging, deferred priority updates, no host sync (skipped without a GPU).

Run with ``python -m pytest -m cuda tests``. The steady state runs under ``torch.cuda.set_sync_debug_mode("error")``
(any blocking copy or value read raises) as well as under the CPU's ``SyncCounter``; each round starts after a device
synchronize, so the staging sets' and the deferred updates' events have passed and the intended waits on them (a
``query()`` first) do not count as syncs.
"""
import contextlib

import pytest
import torch
from torch.utils import _pytree as pytree

from alfish.replay import ReplayBuffer, UniformSampler, make_storage
from tests.replay.recorded_samples import RECORDED
from tests.replay.sync_scenario import (
    BATCH,
    CAPACITY,
    CONFIGS,
    NUM_ENVS,
    DeferringSampler,
    add,
    build,
    fill,
    run_rounds,
    step,
)

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GPU_CYCLES = 200_000_000  # torch.cuda._sleep: about 0.1 s of device time queued ahead of the copies under test


def leaves(exp):
    return pytree.tree_leaves(exp)


def clone(exp):
    return pytree.tree_map(lambda x: x.clone(), exp)


def assert_on_device_and_equal(dev, host):
    for d, h in zip(leaves(dev), leaves(host)):
        assert d.device.type == "cuda"
        assert torch.equal(d.cpu(), h)


@contextlib.contextmanager
def cuda_sync_errors():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def host_buffer(name="uniform_L3", tmp_path=None, location="cpu"):
    buf, length = build(name, make_storage(location, NUM_ENVS, CAPACITY, scratch_dir=tmp_path), device="cuda")
    fill(buf)
    return buf, length


def test_staging_gives_the_batch_a_plain_copy_gives(tmp_path):
    for name in ("uniform_L3", "prioritized_L2"):
        buf, length = host_buffer(name, tmp_path)
        plain, _ = build(name, make_storage("cpu", NUM_ENVS, CAPACITY))  # the same draws, no staging
        fill(plain)
        exp, info = buf.sample(BATCH, length)
        assert exp.observation.is_pinned()  # gathered straight into a staging buffer
        expected, expected_info = plain.sample(BATCH, length)
        dev, dev_info = buf.to_device(exp, info)
        torch.cuda.synchronize()
        assert_on_device_and_equal(dev, expected)
        assert info.positions.device.type == "cpu"  # indices stay with the replay buffer
        if expected_info.importance_weights is not None:
            assert torch.equal(dev_info.importance_weights.cpu(), expected_info.importance_weights)


def test_the_two_staging_sets_alternate():
    buf, length = host_buffer()
    pointers = []
    for _ in range(4):
        exp, info = buf.sample(BATCH, length)
        pointers.append(exp.observation.data_ptr())
        buf.to_device(exp, info)  # (copies made: a set is reused once its event has passed)
    assert pointers[0] != pointers[1] and pointers[0] == pointers[2] and pointers[1] == pointers[3]


def test_a_staging_set_is_not_refilled_while_its_copies_are_in_flight():
    """The copies of batch k queue behind ~0.1 s of device work; sample k + 2 reuses batch k's set and must wait for
    them, else batch k would arrive with batch k + 2's data. Odd batches are transformed (a replaced leaf goes through
    a pinned buffer of its own)."""
    buf, length = host_buffer()
    torch.cuda._sleep(GPU_CYCLES)
    sent = []
    for k in range(5):
        exp, info = buf.sample(BATCH, length)
        if k % 2:
            exp = exp._replace(observation=exp.observation + 1000 * k)
        expected = clone(exp)
        sent.append((expected, buf.to_device(exp, info)[0]))
    torch.cuda.synchronize()
    assert not torch.equal(sent[0][0].observation, sent[2][0].observation)  # (so an overwrite would show)
    for expected, dev in sent:
        assert_on_device_and_equal(dev, expected)


def test_a_deferred_priority_update_lands_before_the_second_next_sample():
    buf, length = host_buffer("prioritized_L2")
    sampler = buf.sampler
    exp, info = buf.sample(BATCH, length)
    buf.to_device(exp, info)
    slots = info.env_ids * CAPACITY + info.positions % CAPACITY
    before = sampler._assigned[slots].clone()
    torch.cuda._sleep(GPU_CYCLES)  # the priorities' copy waits behind this
    buf.update_priorities(info, torch.full((BATCH,), 5.0, device="cuda"))
    assert len(sampler._deferred) == 1
    buf.sample(BATCH, length)
    assert torch.equal(sampler._assigned[slots], before)  # the next sample: not yet
    buf.sample(BATCH, length)
    assert torch.equal(sampler._assigned[slots], (torch.full((BATCH,), 5.0) + 1e-6).pow(0.7))
    assert len(sampler._deferred) == 0


# (storage location, device of the prioritized sampler's trees)
PLACEMENTS = [("cpu", "cpu"), ("mmap", "cpu"), ("device", "cpu"), ("device", "cuda")]


@pytest.mark.parametrize("location,trees", PLACEMENTS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_steady_state_makes_no_sync_on_cuda(name, location, trees, tmp_path):
    storage = make_storage(location, NUM_ENVS, CAPACITY, device="cuda", scratch_dir=tmp_path)
    buf, length = build(name, storage, sampler_device=trees, device="cuda")
    fill(buf)
    draws, calls, batches = run_rounds(buf, length, before_round=torch.cuda.synchronize, guard=cuda_sync_errors)
    assert calls == []
    for (env_ids, positions, _), exp in zip(draws, batches):
        assert exp.observation.device.type == "cuda"
        assert exp.rollout_info["index"].cpu().tolist() == [list(range(p, p + length)) for p in positions]
        assert exp.env_id[:, 0].cpu().tolist() == env_ids
    recorded = [tuple(r) for r in RECORDED[name]]
    if CONFIGS[name]["kind"] == "uniform":
        assert draws == recorded  # drawn on the CPU as before
    elif trees == "cpu":
        # Host trees apply CUDA priorities one update late: the CPU emulation of that schedule draws the same.
        emulated, _ = build(name, make_storage("cpu", NUM_ENVS, CAPACITY), sampler_cls=DeferringSampler)
        fill(emulated)
        assert draws == run_rounds(emulated, length)[0]
    else:  # device trees apply at once, as the recording did; the GPU's float64 sums may differ in the last bit
        assert [d[:2] for d in draws] == [r[:2] for r in recorded]
        for d, r in zip(draws, recorded):
            assert torch.allclose(torch.tensor(d[2]), torch.tensor(r[2]), rtol=1e-6)


def test_device_storage_checkpoints_on_the_cpu_and_restores_on_the_device():
    storage = make_storage("device", NUM_ENVS, CAPACITY, device="cuda")
    buf = ReplayBuffer(storage, UniformSampler(torch.Generator().manual_seed(0)))
    fill(buf)
    add(buf, torch.tensor([1]))
    state = buf.state_dict()
    assert {x.device.type for x in state["storage"]["leaves"]} == {"cpu"}
    restored = ReplayBuffer(make_storage("device", NUM_ENVS, CAPACITY, device="cuda"), UniformSampler())
    restored.load_state_dict(state, step(torch.arange(1), torch.zeros(1, dtype=torch.int64)))
    assert restored.storage.device.type == "cuda"
    assert restored.storage.leaf_layout() == storage.leaf_layout()
    assert torch.equal(restored.gather(torch.tensor([1]), torch.tensor([10]), 4).observation,
                       buf.gather(torch.tensor([1]), torch.tensor([10]), 4).observation)
