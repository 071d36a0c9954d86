"""Assembly checks: combinations the parts cannot serve fail before any env or process starts, with one line naming
the parameters; a checkpoint of the older layout is refused with a clear message instead of a half-restored run."""
import dataclasses
import functools
import logging
import os

import gin
import gymnasium as gym
import psutil
import pytest

from alfish.algorithms.a2c import A2cAlgorithm
from alfish.algorithms.ddpg import Td3Algorithm
from alfish.algorithms.sac import SacAlgorithm
from alfish.config import TrainerConfig
from alfish.rundir.checkpoint import Checkpointer, CheckpointError
from alfish.trainer.build import build_trainer, check_combinations
from alfish.trainer.options import RunOptions
from alfish.trainer.resume import check_resumable


@pytest.mark.parametrize("settings, options, message", [
    (dict(algorithm_ctor=SacAlgorithm, unroll_with_grad=True), RunOptions(),
     "TrainerConfig.unroll_with_grad=True: SacAlgorithm is off-policy and stores its steps in the replay buffer, "
     "where autograd graphs must not be kept; set it to False (on-policy algorithms always unroll with gradients)"),
    (dict(algorithm_ctor=A2cAlgorithm, priority_replay=True, whole_replay_buffer_training=False, mini_batch_size=4,
          mini_batch_length=2), RunOptions(),
     "TrainerConfig.priority_replay=True needs an off-policy algorithm; A2cAlgorithm trains on-policy without replay"),
    (dict(algorithm_ctor=A2cAlgorithm, async_unroll=True), RunOptions(),
     "TrainerConfig.async_unroll=True: A2cAlgorithm would train on steps acted by older parameters as if its own had "
     "acted them; set A2cAlgorithm.off_policy_correction='vtrace', or async_unroll=False"),
    (dict(algorithm_ctor=SacAlgorithm, async_unroll=True), RunOptions(random_warm_up_actions=True),
     "Trainer.random_warm_up_actions=True needs an off-policy algorithm and a synchronous unroll"),
    (dict(algorithm_ctor=SacAlgorithm), RunOptions(num_unroll_processes=2),
     "Trainer.num_unroll_processes, unroll_min_fraction and max_policy_lag shape an asynchronous unroll: set "
     "TrainerConfig.async_unroll=True, or remove them"),
    (dict(algorithm_ctor=SacAlgorithm), RunOptions(max_policy_lag=3),
     "Trainer.num_unroll_processes, unroll_min_fraction and max_policy_lag shape an asynchronous unroll"),
    (dict(algorithm_ctor=SacAlgorithm, async_unroll=True), RunOptions(unroll_min_fraction=0.5),
     "Trainer.unroll_min_fraction=0.5 lets an iteration start before every unroll process delivered its "
     "unroll_length steps: it needs Trainer.num_unroll_processes > 1 and TrainerConfig.unroll_length > 0"),
    (dict(algorithm_ctor=SacAlgorithm, async_unroll=True, unroll_length=0, num_iterations=5),
     RunOptions(num_unroll_processes=2, unroll_min_fraction=0.5),
     "Trainer.unroll_min_fraction=0.5 lets an iteration start before every unroll process delivered"),
    (dict(algorithm_ctor=SacAlgorithm, async_unroll=True, unroll_length=0, num_iterations=5),
     RunOptions(num_unroll_processes=2),
     "TrainerConfig.whole_replay_buffer_training=True trains on the same number of steps of every env, so with "
     "Trainer.num_unroll_processes > 1 every process must deliver unroll_length steps each iteration"),
    (dict(algorithm_ctor=A2cAlgorithm, async_unroll=True), RunOptions(num_unroll_processes=2, unroll_min_fraction=0.5),
     "Trainer.unroll_min_fraction=0.5: A2cAlgorithm trains on whole unrolls of every env, so every unroll process "
     "must deliver its share; set it to 1"),
])
def test_unservable_combinations_fail_before_anything_starts(tmp_path, settings, options, message):
    root = tmp_path / "root"
    children_before = len(psutil.Process().children(recursive=True))
    with pytest.raises(ValueError) as error:
        build_trainer(TrainerConfig(root_dir=str(root), **settings), options)
    assert str(error.value).startswith(message)
    assert not root.exists()  # nothing was created: the check ran first
    assert len(psutil.Process().children(recursive=True)) == children_before  # no process was started


def test_a_rollout_device_that_nothing_would_use_is_refused_first(tmp_path):
    import gin

    gin.bind_parameter("DevicePolicy.rollout_device", "cuda")
    try:
        with pytest.raises(ValueError, match=r"^DevicePolicy.rollout_device='cuda' applies to the async unroll "
                                             r"and async eval children, but this run has neither"):
            build_trainer(TrainerConfig(root_dir=str(tmp_path / "root"), algorithm_ctor=SacAlgorithm))
        assert not (tmp_path / "root").exists()
        # the asynchronous evaluator's policy copy acts there: accepted
        check_combinations(TrainerConfig(root_dir=str(tmp_path / "root"), algorithm_ctor=SacAlgorithm, evaluate=True,
                                         async_eval=True), RunOptions(), on_policy=False)
    finally:
        gin.clear_config()


def test_a_checkpoint_of_the_older_layout_is_refused_with_a_clear_message(tmp_path):
    checkpointer = Checkpointer(os.path.join(tmp_path, "checkpoints"))
    checkpointer.save(5, {"algorithm": {}}, {"iteration": 5, "seed": 1})  # layout 1 had no "layout" entry
    with pytest.raises(CheckpointError, match=r"checkpoint .*ckpt-5 was made by an older alfish \(checkpoint layout "
                                              r"1, this version reads 2\); resume it with the alfish that wrote it, "
                                              r"or train into a new root_dir"):
        check_resumable(checkpointer.load_latest())


def test_an_asynchronous_on_policy_run_needs_whole_unrolls_and_is_refused_before_the_child_starts(tmp_path):
    import gin

    gin.bind_parameter("A2cAlgorithm.off_policy_correction", "vtrace")
    children_before = len(psutil.Process().children(recursive=True))
    try:
        with pytest.raises(ValueError, match=r"^TrainerConfig.unroll_length=0: A2cAlgorithm trains on whole unrolls "
                                             r"of a fixed length from the asynchronous unroll; set it to 1 or more"):
            build_trainer(TrainerConfig(root_dir=str(tmp_path / "root"), algorithm_ctor=A2cAlgorithm,
                                        async_unroll=True, unroll_length=0, num_iterations=3))
        assert not (tmp_path / "root").exists()
        assert len(psutil.Process().children(recursive=True)) == children_before
    finally:
        gin.clear_config()


def test_a_corrected_algorithm_with_a_slow_parameter_publish_is_warned_about(caplog):
    from alfish.trainer.build import check_lag_correction

    algorithm = A2cAlgorithm(gym.spaces.Box(-1.0, 1.0, (2,)), gym.spaces.Discrete(2), hidden_sizes=(4,),
                             off_policy_correction="vtrace")
    config = TrainerConfig(root_dir="unused", algorithm_ctor=A2cAlgorithm, async_unroll=True, unroll_length=4)
    with caplog.at_level(logging.WARNING):
        check_lag_correction(config, algorithm, "vtrace")  # the default period, 10
    assert "TrainerConfig.unroll_parameter_update_period=10: A2cAlgorithm's data will be acted by parameters up to " \
           "10 iterations old" in caplog.text
    caplog.clear()
    check_lag_correction(dataclasses.replace(config, unroll_parameter_update_period=1), algorithm, "vtrace")
    assert not caplog.text


def test_td3_in_the_critic_first_order_refuses_prioritized_replay_at_build(tmp_path):
    gin.bind_parameter("create_environment.env_name", "Pendulum-v1")
    try:
        with pytest.raises(ValueError) as error:
            build_trainer(TrainerConfig(root_dir=str(tmp_path / "root"), priority_replay=True, mini_batch_size=4,
                                        mini_batch_length=2, whole_replay_buffer_training=False,
                                        algorithm_ctor=functools.partial(Td3Algorithm, hidden_sizes=(8,),
                                                                         update_order="critic_first")))
    finally:
        gin.clear_config()
    assert str(error.value) == ("Td3Algorithm.update_order='critic_first' defers the actor's term to the next batch, "
                                "which TrainerConfig.priority_replay=True would weight or mix as that batch's own "
                                "rows: use update_order='joint' with it")
