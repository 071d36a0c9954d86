"""Resume is a function of the parts and a checkpoint: parts built from an EnvSpec alone (no env, no process) and
restored from the final checkpoint of a real run equal that run's parts, for each training strategy: counters,
replay buffer (storage and sampler), optimizer, update count, RNG and the scheduled learning rate."""
import os

import gin
import gymnasium as gym
import pytest
import torch

from alfish.algorithms.build import build_policy
from alfish.collect.episode_stats import EpisodeStats
from alfish.config import TrainerConfig, load_conf
from alfish.envs.spec import EnvSpec
from alfish.learn.device import DevicePolicy
from alfish.learn.learner import Learner
from alfish.rundir.checkpoint import Checkpointer
from alfish.schedulers import update_progress
from alfish.trainer.build import build_replay_buffer, build_trainer
from alfish.trainer.counters import Counters, RunPlan
from alfish.trainer.resume import CheckpointedParts, restore
from tests.rundir.test_checkpoint import _assert_nest_equal

COMMON = """
TrainerConfig.random_seed = 3
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 1
TrainerConfig.summary_interval = 1000
Trainer.save_replay_buffer = True
lr/LinearScheduler.progress_type = 'percent'
lr/LinearScheduler.schedule = [(0, 1e-2), (1, 1e-3)]
"""
CHAIN = gym.spaces.Box(0.0, 1.0, shape=(5,)), gym.spaces.Discrete(2)  # alfish/Chain-v0's spaces
POINT = gym.spaces.Box(-2.0, 2.0, shape=(1,)), gym.spaces.Box(-1.0, 1.0, shape=(1,))  # alfish/PointGoal-v0's

STRATEGIES = {
    "on_policy": (CHAIN, 2, """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 2
A2cAlgorithm.hidden_sizes = (8,)
A2cAlgorithm.lr = @lr/LinearScheduler()
TrainerConfig.algorithm_ctor = @A2cAlgorithm
TrainerConfig.num_iterations = 7
TrainerConfig.unroll_length = 3
"""),
    "whole_buffer": (CHAIN, 2, """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 2
PpoAlgorithm.hidden_sizes = (8,)
PpoAlgorithm.lr = @lr/LinearScheduler()
TrainerConfig.algorithm_ctor = @PpoAlgorithm
TrainerConfig.num_iterations = 5
TrainerConfig.unroll_length = 4
TrainerConfig.replay_buffer_length = 5
TrainerConfig.mini_batch_size = 4
TrainerConfig.mini_batch_length = 1
"""),
    "sampled_prioritized": (POINT, 1, """
create_environment.env_name = 'alfish/PointGoal-v0'
SacAlgorithm.hidden_sizes = (8,)
SacAlgorithm.actor_lr = @lr/LinearScheduler()
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.num_iterations = 12
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = 5
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.priority_replay = True
TrainerConfig.replay_buffer_length = 16
TrainerConfig.mini_batch_size = 4
TrainerConfig.mini_batch_length = 2
"""),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_parts_built_from_a_spec_restore_to_the_run_that_wrote_the_checkpoint(tmp_path, strategy):
    (observation_space, action_space), num_envs, conf_text = STRATEGIES[strategy]
    conf = tmp_path / "conf.gin"
    conf.write_text(COMMON + conf_text)
    load_conf(str(conf))
    try:
        config = TrainerConfig(root_dir=str(tmp_path / "run"))
        trainer = build_trainer(config)
        assert trainer.run() == 0
        ckpt = Checkpointer(os.path.join(config.root_dir, "checkpoints")).load_latest()
        assert ckpt.step == trainer.counters.iteration

        # The parts again, from the spaces alone.
        spec = EnvSpec(observation_space, action_space, num_envs)
        transformer, algorithm = build_policy(config, spec)
        learner = Learner(algorithm)
        cpu = torch.device("cpu")
        replay = None if algorithm.on_policy else build_replay_buffer(config, spec, transformer, DevicePolicy(), cpu)
        counters, stats = Counters(), EpisodeStats(num_envs)
        torch.manual_seed(12345)  # anything: restore must bring back the checkpoint's RNG state
        restore(ckpt, CheckpointedParts(algorithm=algorithm, transformer=transformer, learner=learner,
                                        counters=counters, stats=stats, replay=replay, spec=spec))
    finally:
        gin.clear_config()

    assert (counters.iteration, counters.env_steps, counters.unroll_credit) == (
        trainer.counters.iteration, trainer.counters.env_steps, trainer.counters.unroll_credit)
    assert stats.num_episodes == trainer.collector.stats.num_episodes
    _assert_nest_equal(algorithm.state_dict(), trainer.algorithm.state_dict(), "algorithm")
    _assert_nest_equal(learner.state_dict(), trainer.learner.state_dict(), "learner")
    assert learner.num_updates == trainer.learner.num_updates > 0
    assert torch.equal(torch.get_rng_state(), ckpt.tensors["rng"]["torch_cpu"])
    if replay is not None:
        _assert_nest_equal(replay.sampler.state_dict(), trainer.replay.sampler.state_dict(), "sampler")
        restored, saved = replay.gather_all()[0], trainer.replay.gather_all()[0]
        _assert_nest_equal(restored.observation, saved.observation, "stored observations")
        assert len(replay) == len(trainer.replay) > 0
    # The scheduled learning rate follows the restored progress as it did in the run.
    point = RunPlan(config, num_envs).progress(counters)
    update_progress(iterations=point.iterations, env_steps=point.env_steps, fraction=point.fraction)
    learner.update_learning_rates()
    trainer.learner.update_learning_rates()
    lrs = [[g["lr"] for g in ln.optimizer.param_groups] for ln in (learner, trainer.learner)]
    assert lrs[0] == lrs[1] and lrs[0][0] == pytest.approx(1e-3)  # the run ended: the schedule's end value
