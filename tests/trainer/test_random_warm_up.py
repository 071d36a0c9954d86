"""Trainer.random_warm_up_actions: the warm-up steps carry uniformly random actions (reproducibly), the policy takes
over afterwards, and algorithms that store rollout info or async unroll are refused."""
import gin
import pytest
import torch

from alfish.config import TrainerConfig, load_conf
from alfish.trainer.build import build_trainer
from tests.integration.inprocess import OFF_POLICY_POINT_GOAL

DDPG = OFF_POLICY_POINT_GOAL + """
DdpgAlgorithm.hidden_sizes = (16,)
TrainerConfig.algorithm_ctor = @DdpgAlgorithm
TrainerConfig.num_env_steps = 150
TrainerConfig.initial_collect_steps = 100
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 0
Trainer.random_warm_up_actions = True
"""


def trainer_from(tmp_path, text, name="run"):
    conf = tmp_path / f"{name}.gin"
    conf.write_text(text)
    load_conf(str(conf))
    try:
        return build_trainer(TrainerConfig(root_dir=str(tmp_path / name)))
    finally:
        gin.clear_config()


def stored_actions(trainer):
    exp, _ = trainer.replay.gather_all()  # [1 env, T]
    return exp.action[0, :, 0]


def test_warm_up_actions_are_uniform_then_the_policy_acts(tmp_path):
    trainer = trainer_from(tmp_path, DDPG)
    assert trainer.run() == 0
    actions = stored_actions(trainer)
    warm_up, policy = actions[:100], actions[100:]
    # uniform on [-1, 1]: std 0.577, both halves of the range used
    assert 0.45 < float(warm_up.std()) < 0.7 and float(warm_up.min()) < -0.5 and float(warm_up.max()) > 0.5
    # DDPG's actor + N(0, 0.1) noise after the warm-up: a different, narrower distribution
    assert float(policy.std()) < 0.35
    again = trainer_from(tmp_path, DDPG, name="again")
    again.run()
    assert torch.equal(stored_actions(again)[:100], warm_up)  # same seed, same random actions


PPO = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 2
PpoAlgorithm.hidden_sizes = (8,)
TrainerConfig.algorithm_ctor = @PpoAlgorithm
TrainerConfig.num_iterations = 2
TrainerConfig.unroll_length = 4
TrainerConfig.initial_collect_steps = 4
TrainerConfig.whole_replay_buffer_training = True
TrainerConfig.replay_buffer_length = 16
TrainerConfig.mini_batch_size = 4
TrainerConfig.mini_batch_length = 1
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 0
Trainer.random_warm_up_actions = True
"""


def test_refused_where_random_actions_cannot_be_stored(tmp_path):
    with pytest.raises(ValueError, match="random_warm_up_actions=True: PpoAlgorithm stores rollout info with each "
                                         "step, which random actions do not have; set it to False"):
        trainer_from(tmp_path, PPO, name="ppo").run()
    with pytest.raises(ValueError, match="random_warm_up_actions=True needs an off-policy algorithm and a "
                                         "synchronous unroll"):
        trainer_from(tmp_path, DDPG + "TrainerConfig.async_unroll = True\n", name="async")
