"""``TrainerConfig.eval_uncertainty``: the spread of the evaluation's returns and, for an algorithm with a critic
ensemble, of the critics' estimates on the evaluation's own state-action pairs, checked against a hand computation;
its TensorBoard tags and eval_log fields present when on (sync and async) and absent when off; no critic spread for
algorithms without a critic ensemble (PPO, DQN)."""
import math

import gin
import pytest
import torch

from alfish.algorithms.build import build_policy
from alfish.config import TrainerConfig, load_conf
from alfish.envs.batched_env import create_environment
from alfish.envs.spec import EnvSpec
from alfish.evaluate.evaluator import Evaluator
from tests.integration.inprocess import OFF_POLICY_POINT_GOAL, eval_log, run_trainer_from_text, tb_scalars

pytestmark = [pytest.mark.timeout(90)]

RETURN_SPREAD = ("return_std", "return_min", "return_max")
CRITIC_SPREAD = ("critic_mean", "critic_std")

SAC = OFF_POLICY_POINT_GOAL + """
SacAlgorithm.hidden_sizes = (16,)
TrainerConfig.algorithm_ctor = @SacAlgorithm
Trainer.num_threads = 1
TrainerConfig.num_env_steps = 300
TrainerConfig.eval_interval = 100
"""

PPO = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 2
PpoAlgorithm.hidden_sizes = (8,)
TrainerConfig.algorithm_ctor = @PpoAlgorithm
Trainer.num_threads = 1
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 4
TrainerConfig.unroll_length = 8
TrainerConfig.whole_replay_buffer_training = True
TrainerConfig.clear_replay_buffer = True
TrainerConfig.replay_buffer_length = 9
TrainerConfig.mini_batch_size = 8
TrainerConfig.mini_batch_length = 1
TrainerConfig.num_updates_per_train_iter = 1
TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 2
TrainerConfig.epsilon_greedy = 1.0
TrainerConfig.num_eval_episodes = 6
TrainerConfig.num_eval_environments = 2
TrainerConfig.num_checkpoints = 0
"""

DQN = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 2
DqnAlgorithm.hidden_sizes = (8,)
TrainerConfig.algorithm_ctor = @DqnAlgorithm
Trainer.num_threads = 1
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 40
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = 16
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.replay_buffer_length = 100
TrainerConfig.mini_batch_size = 8
TrainerConfig.mini_batch_length = 2
TrainerConfig.num_updates_per_train_iter = 1
TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 20
TrainerConfig.epsilon_greedy = 1.0
TrainerConfig.num_eval_episodes = 10
TrainerConfig.num_eval_environments = 2
TrainerConfig.num_checkpoints = 0
"""


@pytest.fixture(autouse=True)
def clean_gin():
    yield
    gin.clear_config()


def sac_point_goal_policy(tmp_path):
    conf = tmp_path / "conf.gin"
    conf.write_text(SAC)
    load_conf(str(conf))
    config = TrainerConfig(root_dir=str(tmp_path / "root"))
    env = create_environment()
    torch.manual_seed(3)
    transformer, algorithm = build_policy(config, EnvSpec.of(env))
    return env, transformer, algorithm


def test_the_spread_of_returns_and_critics_matches_a_hand_computation(tmp_path):
    env, transformer, algorithm = sac_point_goal_policy(tmp_path)
    evaluator = Evaluator(env, num_episodes=2, epsilon_greedy=0.0, transform=transformer.rollout_view(False),
                          uncertainty=True)
    result = evaluator.evaluate(algorithm)
    env.close()
    # By hand: PointGoal is deterministic (x0 = 0.8, x += 0.25 a, reward -|x|, 10 steps), the greedy policy too, so
    # both episodes are the same: no spread of returns. The critics score each (x, a) the policy chose.
    x, ret, q_mean, q_std = 0.8, 0.0, [], []
    zero = EnvSpec.of(env).zero_time_step()
    with torch.no_grad():
        for _ in range(10):
            obs = torch.tensor([[x]])
            action = algorithm.predict_step(zero._replace(observation=obs)).output
            q = algorithm.critics(obs, algorithm.unscale_action(action)).squeeze(-1)[:, 0].double()  # [E]
            q_mean.append(float(q.mean()))
            q_std.append(math.sqrt(float(((q - q.mean()) ** 2).mean())))
            x = min(2.0, max(-2.0, x + 0.25 * float(action.clamp(-1, 1))))
            ret -= abs(x)
    assert result.num_episodes == 2 and result.average_return == pytest.approx(ret, abs=1e-5)
    assert result.return_std == pytest.approx(0.0, abs=1e-9)
    assert result.return_min == pytest.approx(ret, abs=1e-5) and result.return_max == pytest.approx(ret, abs=1e-5)
    assert result.critic_mean == pytest.approx(sum(q_mean) / 10, rel=1e-5)
    assert result.critic_std == pytest.approx(sum(q_std) / 10, rel=1e-5) and result.critic_std > 0


def test_the_return_spread_is_the_population_std_min_and_max_of_the_episodes(tmp_path):
    env, transformer, algorithm = sac_point_goal_policy(tmp_path)
    # epsilon_greedy = 1: every action sampled, so the episodes differ
    evaluator = Evaluator(env, num_episodes=3, epsilon_greedy=1.0, transform=transformer.rollout_view(False),
                          uncertainty=True)
    torch.manual_seed(0)
    result = evaluator.evaluate(algorithm)
    env.close()
    assert result.num_episodes == 3
    assert result.return_min < result.average_return < result.return_max
    # three values with this min, max and mean: the third is fixed, hence the std
    third = 3 * result.average_return - result.return_min - result.return_max
    values = torch.tensor([result.return_min, result.return_max, third], dtype=torch.float64)
    assert result.return_std == pytest.approx(float(values.std(correction=0)), rel=1e-9)


def test_without_eval_uncertainty_a_result_has_no_spread(tmp_path):
    env, transformer, algorithm = sac_point_goal_policy(tmp_path)
    result = Evaluator(env, 1, 0.0, transform=transformer.rollout_view(False)).evaluate(algorithm)
    env.close()
    assert result.uncertainty() == {}
    assert all(getattr(result, name) is None for name in RETURN_SPREAD + CRITIC_SPREAD)


def check_run(root, expected):
    """Every eval record and TensorBoard's eval/ tags have exactly the ``expected`` uncertainty fields."""
    log = eval_log(root)
    scalars = tb_scalars(root)
    assert log
    for record in log:
        assert {k for k in record if k in RETURN_SPREAD + CRITIC_SPREAD} == set(expected), record
        assert record["return_min"] <= record["average_return"] <= record["return_max"] if expected else True
    for name in RETURN_SPREAD + CRITIC_SPREAD:
        tag = f"eval/{name}"
        if name in expected:
            assert [step for step, _ in scalars[tag]] == [r["iteration"] for r in log]
            assert [v for _, v in scalars[tag]] == pytest.approx([r[name] for r in log], rel=1e-5)
        else:
            assert tag not in scalars
    return log


@pytest.mark.parametrize("async_eval", [False, True], ids=["sync", "async"])
def test_sac_records_the_return_and_critic_spread(tmp_path, async_eval):
    root = run_trainer_from_text(tmp_path, SAC, ["TrainerConfig.eval_uncertainty = True",
                                                 f"TrainerConfig.async_eval = {async_eval}"])
    log = check_run(root, RETURN_SPREAD + CRITIC_SPREAD)
    assert [r["iteration"] for r in log] == [100, 200]
    assert all(r["critic_std"] > 0 for r in log)  # two critics, initialised apart
    assert all(r.get("asynchronous", False) is async_eval for r in log)


def test_sac_without_eval_uncertainty_records_no_spread(tmp_path):
    check_run(run_trainer_from_text(tmp_path, SAC), ())


@pytest.mark.parametrize("conf,async_eval", [(PPO, True), (DQN, False)], ids=["ppo-async", "dqn-sync"])
def test_algorithms_without_a_critic_ensemble_record_the_return_spread_only(tmp_path, conf, async_eval):
    root = run_trainer_from_text(tmp_path, conf, ["TrainerConfig.eval_uncertainty = True",
                                                  f"TrainerConfig.async_eval = {async_eval}"])
    log = check_run(root, RETURN_SPREAD)
    assert any(r["return_max"] > r["return_min"] for r in log)  # epsilon-greedy episodes differ
