"""Replay on the training device (``DevicePolicy.replay_storage='device'``) with what reads the buffer at sample time
or mixes host data in: frame stacking (with prioritized replay), hindsight relabelling, RLPD's mixed batches and ALF's
hybrid training with prioritized replay, each built by the trainer from a conf and trained a few iterations on
``DEVICE``. The steady state's training part (sample, transform, staging, update, new priorities) runs under
``no_host_syncs`` on CUDA; collection (acting reads actions back) stays outside.

The CPU tier proves the placement on the ``meta`` device (tests/replay/test_device_storage_sampling.py,
tests/offline/test_mixed_buffer.py, tests/offline/test_hybrid_training.py); here values flow on a real device.
"""
from __future__ import annotations

import pathlib
from typing import Callable

import numpy as np
import pytest

from alfish.trainer.hybrid_training import HybridTraining
from alfish.trainer.training import SampledReplayTraining
from tests.integration.test_dqn_learning import DQN_CHAIN, PRIORITIZED
from tests.offline.datasets import point_goal_expert, rollouts

from .helpers import DEVICE, NO_FINITE_READS, assert_on_device, device_bindings, no_host_syncs, started_trainer

WARM_ITERATIONS = 3  # unguarded: lazy initialization, the optimizer's state, the first staging buffers
GUARDED_ITERATIONS = 5
SHORT = f"""
TrainerConfig.evaluate = False
TrainerConfig.summary_interval = 1000
Learner.finite_check_interval = {NO_FINITE_READS}
"""

FRAME_STACKING = DQN_CHAIN + "\n".join(PRIORITIZED) + """
TrainerConfig.data_transformer_ctor = [@FrameStacker]
FrameStacker.stack_size = 3
"""

HER_BIT_FLIPPING = """
create_environment.env_name = 'alfish/BitFlipping-v0'
create_environment.env_kwargs = {'num_bits': 4}
create_environment.num_parallel_environments = 4
DqnAlgorithm.hidden_sizes = (32,)
DqnAlgorithm.double_q = True
HindsightExperienceTransformer.her_proportion = 0.8
TrainerConfig.data_transformer_ctor = [@HindsightExperienceTransformer]
TrainerConfig.algorithm_ctor = @DqnAlgorithm
TrainerConfig.random_seed = 0
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = 64
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.replay_buffer_length = 200
TrainerConfig.mini_batch_size = 32
TrainerConfig.mini_batch_length = 2
TrainerConfig.num_updates_per_train_iter = 1
TrainerConfig.num_iterations = 20
TrainerConfig.num_checkpoints = 0
"""

SAC_POINT_GOAL_WITH_DATA = """
create_environment.env_name = 'alfish/PointGoal-v0'
SacAlgorithm.hidden_sizes = (16, 16)
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.random_seed = 1
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = 8
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.replay_buffer_length = 500
TrainerConfig.mini_batch_size = 16
TrainerConfig.mini_batch_length = 2
TrainerConfig.num_updates_per_train_iter = 1
TrainerConfig.num_iterations = 20
TrainerConfig.num_checkpoints = 0
"""
RLPD = SAC_POINT_GOAL_WITH_DATA + "OfflineData.mixing = 'mixed'\nOfflineData.offline_fraction = 0.5\n"
ALF_HYBRID = SAC_POINT_GOAL_WITH_DATA + "\n".join(PRIORITIZED) + "\n"

#: case -> (conf, whether it trains on offline data)
CASES = {"frame-stacking": (FRAME_STACKING, False), "hindsight": (HER_BIT_FLIPPING, False),
         "rlpd-mixed": (RLPD, True), "alf-hybrid-prioritized": (ALF_HYBRID, True)}


@pytest.fixture(scope="module")
def expert_npz(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A few PointGoal episodes of the expert, as D4RL arrays (made here, nothing downloaded)."""
    path = tmp_path_factory.mktemp("data") / "expert.npz"
    np.savez(path, **rollouts("alfish/PointGoal-v0", lambda o, r: point_goal_expert(o).astype(np.float32), 5))
    return path


def training_part(training) -> Callable[[], None]:
    """The training step's part that samples and updates (no collection): the sampled replay's ``_train``; for
    ALF's hybrid scheme one update of both losses (the RL part due)."""
    if isinstance(training, HybridTraining):
        return lambda: training._update(rl_due=True)
    assert isinstance(training, SampledReplayTraining)
    return training._train


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(CASES))
def test_device_replay_trains_without_host_syncs(tmp_path, expert_npz, case):
    conf, offline = CASES[case]
    params = [f"TrainerConfig.offline_buffer_dir = '{expert_npz}'"] if offline else []
    with started_trainer(tmp_path, conf + SHORT + device_bindings(replay_storage="device"), params) as trainer:
        replay, learner = trainer.replay, trainer.learner
        assert replay.storage.device.type == DEVICE.type  # the online rings (a mixture's online part)
        if offline:
            assert replay.offline.storage.device.type == "cpu"  # the data stay on the host, staged per batch
        update = training_part(trainer.training)
        collect = trainer.training.collector.collect
        for _ in range(WARM_ITERATIONS):
            collect(1)
            update()
        before = learner.num_updates
        for _ in range(GUARDED_ITERATIONS):
            collect(1)
            with no_host_syncs():
                update()
        assert learner.num_updates == before + GUARDED_ITERATIONS
        learner.check_finite()
        assert_on_device(trainer.algorithm)
