"""Learning from pixels and from dict observations with the conv / per-key encoders, in seconds.

alfish/PixelCorridor-v0: the goal's side shows only in a uint8 image (1, 5, 7); optimum 0.8, and a policy that does
not read the image averages at most -0.1 (greedy evaluation over 10 episodes with random goals).
alfish/DictCorridor-v0: the same task, the agent in an image key and the goal in a one-hot vector key.
Seeds and hyperparameters tried here: DQN reaches 0.8 by ~1,700 of 2,020 env steps, PPO by iteration ~15 of 45.
"""
import pytest

from .inprocess import eval_log, run_trainer_from_text

pytestmark = [pytest.mark.learning]

OPTIMUM = 0.8

DQN_PIXELS = """
create_environment.env_name = 'alfish/PixelCorridor-v0'
create_environment.num_parallel_environments = 4
EncodingNetwork.conv_layers = ((8, 3, 1),)
DqnAlgorithm.hidden_sizes = (64,)
DqnAlgorithm.lr = 3e-3
DqnAlgorithm.gamma = 0.9
DqnAlgorithm.target_update_period = 20
DqnAlgorithm.epsilon_greedy = 0.2
TrainerConfig.algorithm_ctor = @DqnAlgorithm
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 60
TrainerConfig.unroll_length = 8
TrainerConfig.initial_collect_steps = 100
TrainerConfig.replay_buffer_length = 1000
TrainerConfig.mini_batch_size = 64
TrainerConfig.mini_batch_length = 2
TrainerConfig.num_updates_per_train_iter = 4
TrainerConfig.summary_interval = 10
TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 10
TrainerConfig.num_eval_episodes = 10
TrainerConfig.num_eval_environments = 5
TrainerConfig.num_checkpoints = 0
"""

PPO_PIXELS = """
create_environment.env_name = 'alfish/PixelCorridor-v0'
create_environment.num_parallel_environments = 4
EncodingNetwork.conv_layers = ((8, 3, 1),)
PpoAlgorithm.hidden_sizes = (64,)
PpoAlgorithm.lr = 3e-3
PpoAlgorithm.gamma = 0.9
PpoAlgorithm.gae_lambda = 0.9
TrainerConfig.algorithm_ctor = @PpoAlgorithm
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 45
TrainerConfig.unroll_length = 16
TrainerConfig.whole_replay_buffer_training = True
TrainerConfig.clear_replay_buffer = True
TrainerConfig.replay_buffer_length = 17
TrainerConfig.mini_batch_size = 32
TrainerConfig.mini_batch_length = 1
TrainerConfig.num_updates_per_train_iter = 4
TrainerConfig.summary_interval = 10
TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 3
TrainerConfig.num_eval_episodes = 10
TrainerConfig.num_eval_environments = 5
TrainerConfig.num_checkpoints = 0
"""


def returns(root) -> list[float]:
    return [r["average_return"] for r in eval_log(root)]


@pytest.mark.timeout(120)
def test_dqn_learns_the_pixel_corridor(tmp_path):
    got = returns(run_trainer_from_text(tmp_path, DQN_PIXELS))
    assert len(got) == 6 and got[0] < 0.5, got  # it started far from the optimum
    assert got[-1] >= OPTIMUM - 1e-4 and got[-2] >= OPTIMUM - 1e-4, got
    assert max(got) <= OPTIMUM + 1e-4


@pytest.mark.timeout(120)
def test_dqn_without_learning_stays_below_what_reading_the_image_gives(tmp_path):
    # The control: the same run with a negligible learning rate does not get there.
    got = returns(run_trainer_from_text(tmp_path, DQN_PIXELS, ["DqnAlgorithm.lr = 1e-9"]))
    assert max(got) < 0.5, got


@pytest.mark.timeout(120)
def test_ppo_learns_the_pixel_corridor(tmp_path):
    got = returns(run_trainer_from_text(tmp_path, PPO_PIXELS))
    assert len(got) == 15 and min(got[:4]) < 0.5, got
    assert max(got) >= OPTIMUM - 1e-4, got
    assert sorted(got[-6:])[3] >= OPTIMUM - 1e-4, got  # most of the last evaluations at the optimum


@pytest.mark.timeout(120)
def test_dqn_learns_the_dict_corridor_with_per_key_encoders(tmp_path):
    conf = DQN_PIXELS.replace("PixelCorridor", "DictCorridor") + "EncodingNetwork.key_fc_layers = (16,)\n"
    got = returns(run_trainer_from_text(tmp_path, conf))
    assert got[-1] >= OPTIMUM - 1e-4 and got[-2] >= OPTIMUM - 1e-4, got
