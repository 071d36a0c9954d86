"""``DevicePolicy.replay_storage='device'`` with the transformers that read the buffer at sample time (frame stacking,
hindsight relabelling), through the buffer ``build.py`` assembles, on the ``meta`` device: sampling, the transformers'
sample view and ``to_device`` run with the storage there, and the batch and its info come out there.

The sampler keeps its indices on the host for these transformers (they index the ring's host counters with them,
see ``build_replay_buffer``); what they read comes back on the device, and the batch never meets a host tensor.
"""
import pytest
import torch

from tests.replay.device_parts import BATCH, LENGTH, META, READERS, assert_on, device_replay, fill

CPU = torch.device("cpu")


@pytest.mark.parametrize("priority_replay", [False, True], ids=["uniform", "prioritized"])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_buffer_reader_samples_and_transforms_on_the_device_storage(tmp_path, reader, priority_replay):
    buffer, transformer, spec = device_replay(tmp_path, reader, priority_replay)
    assert buffer.storage.device == META
    fill(buffer, spec)
    for _ in range(3):
        raw, where = buffer.sample(BATCH, LENGTH)
        assert where.env_ids.device == where.positions.device == CPU  # the sampler's, next to the ring's counters
        exp = transformer.transform_sample(raw, where, buffer)
        exp, info = buffer.to_device(exp, where)
        assert_on(exp, META)
        assert_on(info, META)  # indices and (prioritized) importance weights: what the learner gets
        assert (info.importance_weights is not None) == priority_replay
        assert exp.step_type.shape == (BATCH, LENGTH)
        if reader == "frame_stacker":
            assert exp.observation.shape == (BATCH, LENGTH, 3 * 3)  # 3 frames of 3
        else:
            assert exp.observation["desired_goal"].shape == (BATCH, LENGTH, 2)
            assert exp.reward.shape == exp.discount.shape == (BATCH, LENGTH)
        if priority_replay:  # host trees: priorities from the device are applied later (on CUDA), so none here
            assert buffer.sampler.device == CPU


def test_without_a_reader_the_priority_trees_live_with_the_device_storage(tmp_path):
    buffer, _, spec = device_replay(tmp_path, None, priority_replay=True)
    assert buffer.sampler.device == META
    fill(buffer, spec)
    raw, where = buffer.sample(BATCH, LENGTH)
    assert_on(raw, META)
    assert_on(where, META)
    buffer.update_priorities(where, torch.ones(BATCH, device=META))  # the whole update on the device, no read

