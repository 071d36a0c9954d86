"""Learning tier for MultiDiscrete and MultiBinary actions: PPO and A2C reach the known optimum of a toy env.

alfish/MatchSubActions-v0 (MultiDiscrete([3, 2, 4])) and alfish/MatchBits-v0 (MultiBinary(3)): the observation shows
the right sub-action of each dimension, the reward is the fraction answered right, one step per episode. Optimum 1;
a random policy averages 0.36 (MultiDiscrete) or 0.5 (MultiBinary). The evaluation is greedy (each sub-action's mode),
over 20 episodes of random targets, so reaching 1 means the greedy policy is optimal for (nearly) every target.
"""
import json

import gin
import numpy as np
import pytest

from alfish.bin import export, play
from alfish.export.formats import load_program

from .inprocess import eval_log, run_trainer_from_text

pytestmark = [pytest.mark.learning]

COMMON = """
create_environment.num_parallel_environments = 8
TrainerConfig.random_seed = 0
TrainerConfig.unroll_length = 8
TrainerConfig.summary_interval = 100
TrainerConfig.evaluate = True
TrainerConfig.num_eval_episodes = 20
TrainerConfig.num_eval_environments = 4
TrainerConfig.num_checkpoints = 0
"""

PPO = COMMON + """
PpoAlgorithm.hidden_sizes = (32,)
PpoAlgorithm.lr = 1e-2
PpoAlgorithm.entropy_coef = 0.0
TrainerConfig.algorithm_ctor = @PpoAlgorithm
TrainerConfig.num_iterations = 16
TrainerConfig.eval_interval = 4
TrainerConfig.whole_replay_buffer_training = True
TrainerConfig.clear_replay_buffer = True
TrainerConfig.replay_buffer_length = 9
TrainerConfig.mini_batch_size = 32
TrainerConfig.mini_batch_length = 1
TrainerConfig.num_updates_per_train_iter = 4
"""

A2C = COMMON + """
A2cAlgorithm.hidden_sizes = (32,)
A2cAlgorithm.lr = 3e-2
A2cAlgorithm.normalize_advantages = True
A2cAlgorithm.entropy_coef = 0.0
TrainerConfig.algorithm_ctor = @A2cAlgorithm
TrainerConfig.num_iterations = 40
TrainerConfig.eval_interval = 10
"""


@pytest.mark.timeout(60)
# slow for A2C: it shares PPO's heads (alfish/algorithms/actor_critic.py), which the PPO runs check in the default run
@pytest.mark.parametrize("algorithm", ["ppo", pytest.param("a2c", marks=pytest.mark.slow)])
@pytest.mark.parametrize("env_name", ["alfish/MatchSubActions-v0", "alfish/MatchBits-v0"])
def test_greedy_policy_becomes_optimal(tmp_path, algorithm, env_name):
    conf = {"ppo": PPO, "a2c": A2C}[algorithm] + f"create_environment.env_name = '{env_name}'\n"
    returns = [r["average_return"] for r in eval_log(run_trainer_from_text(tmp_path, conf))]
    assert returns[-1] >= 1.0 - 1e-6, returns
    assert max(returns) <= 1.0 + 1e-6


@pytest.mark.timeout(60)
# slow for MatchBits: one control shows the learning test can fail; the other env's is the same check
@pytest.mark.parametrize("env_name", ["alfish/MatchSubActions-v0",
                                      pytest.param("alfish/MatchBits-v0", marks=pytest.mark.slow)])
def test_without_learning_the_greedy_policy_is_not_optimal(tmp_path, env_name):
    # The control for the test above: the same run with a negligible learning rate stays below the optimum, so
    # reaching it is the algorithm's doing and not the env's or the evaluation's.
    conf = PPO + f"create_environment.env_name = '{env_name}'\n"
    params = ["PpoAlgorithm.lr = 1e-9", "TrainerConfig.num_iterations = 4"]
    returns = [r["average_return"] for r in eval_log(run_trainer_from_text(tmp_path, conf, params))]
    assert returns and max(returns) <= 0.9, returns


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env_name", ["alfish/MatchSubActions-v0", "alfish/MatchBits-v0"])
def test_trained_policy_checkpoints_plays_and_exports(tmp_path, capsys, env_name):
    # The replay layout of the checkpoint records the action space; play restores the policy from it; the exported
    # program maps observations to the same int64 [B, k] greedy actions as the torch policy.
    conf = PPO + f"create_environment.env_name = '{env_name}'\n"
    params = ["TrainerConfig.num_iterations = 12", "TrainerConfig.evaluate = False",
              "TrainerConfig.num_checkpoints = 1"]
    root = run_trainer_from_text(tmp_path, conf, params)
    try:
        assert play.main(["--root_dir", str(root), "--num_episodes", "4"]) == 0
        assert "average return over 4 episodes: 1.00" in capsys.readouterr().out
        out = tmp_path / "policy.pt2"
        assert export.main(["--root_dir", str(root), "--format", "pt2", "--out", str(out)]) == 0
    finally:
        gin.clear_config()
    program = load_program(str(out), "pt2")
    space = {"alfish/MatchSubActions-v0": (3, 2, 4), "alfish/MatchBits-v0": (2, 2, 2)}[env_name]
    sidecar = json.loads((tmp_path / "policy.pt2.json").read_text())["action_space"]  # what a caller decodes with
    assert sidecar == ({"type": "MultiDiscrete", "nvec": [3, 2, 4], "start": [0, 0, 0]}
                       if env_name.endswith("SubActions-v0") else {"type": "MultiBinary", "n": 3})
    targets = np.stack([np.random.default_rng(0).integers(n, size=64) for n in space], -1)  # [64, 3]
    observations = (np.concatenate([np.eye(n, dtype=np.float32)[targets[:, i]] for i, n in enumerate(space)], -1)
                    if env_name.endswith("SubActions-v0") else targets.astype(np.float32))
    (action,) = program([observations])
    assert action.shape == (64, 3) and action.dtype == np.int64
    assert np.array_equal(action, targets)  # the trained greedy policy, exported, answers every target right
