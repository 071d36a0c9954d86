"""Learning tier for DQN: alfish/Chain-v0 (optimum 0.7: 3 steps of -0.1, then +1; a random policy < 0).

The evaluation is greedy and the env deterministic, so every eval episode has the same return. An untrained greedy
policy is optimal for about half of the seeds (seeds 0, 3, 5, 7, 8 here: the Q-net's shared bias favours "right"
everywhere), so the seed is one whose untrained policy gets -1 (seeds 1, 2, 4, 6), and the control run (a negligible
learning rate, same seed, hence the same initial network) checks that. Seeds 1, 2, 4, 6 x (n_step 1, 3) x (uniform,
prioritized) all ended at 0.7, each optimal from the first eval (iteration 25) on, with a rare single eval at -1.
"""
import pytest

from .inprocess import eval_log, run_trainer_from_text

pytestmark = [pytest.mark.learning]

DQN_CHAIN = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 4
DqnAlgorithm.hidden_sizes = (32,)
DqnAlgorithm.lr = 1e-2
DqnAlgorithm.gamma = 0.9
DqnAlgorithm.n_step = 1
DqnAlgorithm.epsilon_greedy = 0.3
DqnAlgorithm.target_update_period = 20
Trainer.num_threads = 1
TrainerConfig.algorithm_ctor = @DqnAlgorithm
TrainerConfig.random_seed = 1
TrainerConfig.num_iterations = 200
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = 64
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.replay_buffer_length = 1000
TrainerConfig.mini_batch_size = 32
TrainerConfig.mini_batch_length = 2
TrainerConfig.num_updates_per_train_iter = 1
TrainerConfig.summary_interval = 50
TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 25
TrainerConfig.num_eval_episodes = 1
TrainerConfig.num_eval_environments = 1
TrainerConfig.num_checkpoints = 0
"""

N_STEP_3 = ["DqnAlgorithm.n_step = 3", "TrainerConfig.mini_batch_length = 4"]
PRIORITIZED = ["TrainerConfig.priority_replay = True", "TrainerConfig.priority_replay_beta = 0.4"]
# The same 800 env steps and 200 updates as 50 iterations of 4 steps and 4 updates, the 4 mini-batches of an
# iteration drawn at once (priorities written back after them), each update the whole compiled update (aot_eager:
# the same graph as inductor's without generating code, so the test stays quick); "scanned": an iteration's 4
# updates as one compiled scan (Learner.scan_updates; the target period, 20, a multiple of 4)
PRESAMPLED_COMPILED = ["Trainer.presample_mini_batches = True", "TrainerConfig.num_iterations = 50",
                       "TrainerConfig.unroll_length = 4", "TrainerConfig.num_updates_per_train_iter = 4",
                       "TrainerConfig.eval_interval = 7", "Learner.compile_mode = 'default'",
                       "Learner.compile_backend = 'aot_eager'"]


def returns(tmp_path, params=()):
    return [r["average_return"] for r in eval_log(run_trainer_from_text(tmp_path, DQN_CHAIN, list(params)))]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("params", [[], N_STEP_3, PRIORITIZED, N_STEP_3 + PRIORITIZED,
                                    PRIORITIZED + PRESAMPLED_COMPILED,
                                    PRIORITIZED + PRESAMPLED_COMPILED + ["Learner.scan_updates = True"]],
                         ids=["n1", "n3", "n1-prioritized", "n3-prioritized", "n1-prioritized-presampled-compiled",
                              "n1-prioritized-presampled-scanned"])
def test_dqn_reaches_the_optimum_of_chain(tmp_path, params):
    result = returns(tmp_path, params)
    assert len(result) == 8
    assert max(result) >= 0.65, result
    assert result[-1] >= 0.65, result
    assert max(result) <= 0.7 + 1e-6


@pytest.mark.timeout(60)
def test_dqn_with_a_negligible_learning_rate_does_not_reach_the_threshold(tmp_path):
    result = returns(tmp_path, ["DqnAlgorithm.lr = 1e-9"])
    assert max(result) < 0.4, result


def test_scan_updates_without_presampled_mini_batches_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^Learner.scan_updates=True runs an iteration's presampled mini-batches as "
                                         r"one compiled call: set Trainer.presample_mini_batches=True too$"):
        run_trainer_from_text(tmp_path, DQN_CHAIN, ["Learner.compile_mode = 'default'",
                                                    "Learner.compile_backend = 'aot_eager'",
                                                    "Learner.scan_updates = True"])
