"""Which ``PrioritizedSampler`` implementation is built, and the trainer's one construction from ``TrainerConfig``."""
import pytest
import torch

from alfish.algorithms.dqn import DqnAlgorithm
from alfish.config.trainer_config import TrainerConfig
from alfish.replay.prioritized import (
    DevicePrioritizedSampler,
    HostPrioritizedSampler,
    PrioritizedSampler,
    make_prioritized_sampler,
)
from tests.replay.test_segment_tree import torch_code


def test_the_device_picks_the_implementation():
    host = PrioritizedSampler(2, 8, sequence_length=2)
    assert type(host) is HostPrioritizedSampler and isinstance(host, PrioritizedSampler)
    assert type(PrioritizedSampler(2, 8, device="meta")) is DevicePrioritizedSampler
    with torch_code():  # numpy switched off: the torch code on the CPU (what the bit-for-bit tests compare)
        assert type(PrioritizedSampler(2, 8, device="cpu")) is DevicePrioritizedSampler


def test_an_implementation_built_directly_checks_its_device_and_options():
    with pytest.raises(ValueError, match="trees on the CPU"):
        HostPrioritizedSampler(1, 8, device="meta")
    with pytest.raises(TypeError):
        PrioritizedSampler(1, 8, alhpa=0.5)  # a misspelt option is an error, as with a plain signature


def test_the_trainer_sampler_follows_the_config(tmp_path):
    config = TrainerConfig(root_dir=str(tmp_path), algorithm_ctor=DqnAlgorithm, whole_replay_buffer_training=False,
                           mini_batch_size=8, mini_batch_length=3, priority_replay=True, priority_replay_alpha=0.5,
                           priority_replay_beta=0.25, priority_replay_eps=0.01,
                           normalize_importance_weights_by_max=True)
    sampler = make_prioritized_sampler(config, 4, 16, device="meta")
    assert type(sampler) is DevicePrioritizedSampler and sampler.device == torch.device("meta")
    assert (sampler.num_envs, sampler.capacity, sampler.sequence_length) == (4, 16, 3)
    assert sampler.alpha() == 0.5 and sampler.beta() == 0.25  # numbers become schedules, read at each use
    assert sampler.eps == 0.01 and sampler.normalize_by_max and sampler.max_over == "batch"
    assert type(make_prioritized_sampler(config, 1, 16)) is HostPrioritizedSampler
