"""Learning tier for recurrent policies: alfish/MemoryCue-v0 (remember a +-1 cue over 4 blank steps, then answer).

Optimum 1; a memoryless policy sees the same query whatever the cue, so it averages 0. Recurrent PPO (a GRU of 16
units as the shared encoder, whole 12-step sequences from the stored rollout state) reached 1.0 by iteration 9-12 of
30 with seeds 0-3 here (~3 s a run); the same conf without the core stayed within [-0.35, 0.35]. Recurrent DQN, and
recurrent SAC on its continuous-action variant alfish/MemoryCueContinuous-v0, below.
"""

import pytest

from alfish.bin import play

from .inprocess import CONFS, eval_log, run_trainer, run_trainer_from_text

pytestmark = [pytest.mark.learning]

RECURRENT_PPO_MEMORY_CUE = """
create_environment.env_name = 'alfish/MemoryCue-v0'
create_environment.num_parallel_environments = 8
PpoAlgorithm.hidden_sizes = (32,)
PpoAlgorithm.lr = 1e-2
PpoAlgorithm.gamma = 0.9
PpoAlgorithm.gae_lambda = 0.9
ActorCriticNetworks.encoding_network_ctor = @EncodingNetwork
EncodingNetwork.rnn = 'gru'
EncodingNetwork.rnn_size = 16
TrainerConfig.algorithm_ctor = @PpoAlgorithm
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 24
TrainerConfig.unroll_length = 12
TrainerConfig.whole_replay_buffer_training = True
TrainerConfig.clear_replay_buffer = True
TrainerConfig.replay_buffer_length = 13
TrainerConfig.mini_batch_size = 4
TrainerConfig.mini_batch_length = 12
TrainerConfig.use_rollout_state = True
TrainerConfig.num_updates_per_train_iter = 4
TrainerConfig.summary_interval = 10
TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 3
TrainerConfig.num_eval_episodes = 40
TrainerConfig.num_eval_environments = 4
TrainerConfig.num_checkpoints = 0
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("params", [[], ["EncodingNetwork.rnn = 'lstm'"], ["TrainerConfig.use_rollout_state = False"]],
                         ids=["gru", "lstm", "zero_initial_state"])
def test_recurrent_ppo_remembers_the_cue(tmp_path, params):
    returns = [r["average_return"] for r in eval_log(run_trainer_from_text(tmp_path, RECURRENT_PPO_MEMORY_CUE, params))]
    assert returns[0] < 0.5, returns  # it had to learn
    assert returns[-1] >= 0.9 and max(returns) <= 1.0, returns


@pytest.mark.timeout(60)
def test_feed_forward_ppo_cannot_remember_the_cue(tmp_path):
    root = run_trainer_from_text(tmp_path, RECURRENT_PPO_MEMORY_CUE,
                                 ["EncodingNetwork.rnn = None", "TrainerConfig.use_rollout_state = False"])
    returns = [r["average_return"] for r in eval_log(root)]
    assert sum(returns) / len(returns) <= 0.3 and max(returns) <= 0.5, returns


@pytest.mark.timeout(90)
def test_recurrent_ppo_checkpoints_resumes_and_plays(tmp_path, capsys):
    conf = tmp_path / "memory.gin"
    conf.write_text(RECURRENT_PPO_MEMORY_CUE)
    root = tmp_path / "run"
    first = ["TrainerConfig.num_iterations = 12", "TrainerConfig.num_checkpoints = 1"]
    assert run_trainer(conf, root, first) == 0
    assert [r["iteration"] for r in eval_log(root)][-1] == 12
    resumed = ["TrainerConfig.num_iterations = 24", "TrainerConfig.num_checkpoints = 2"]
    assert run_trainer(conf, root, resumed) == 0
    log = eval_log(root)
    assert [r["iteration"] for r in log] == list(range(3, 25, 3))  # continued from 12, not restarted
    assert log[-1]["average_return"] >= 0.9, [r["average_return"] for r in log]
    capsys.readouterr()
    assert play.main(["--root_dir", str(root), "--num_episodes", "4"]) == 0
    out = capsys.readouterr().out
    returns = [float(line.split("return ")[1].split()[0]) for line in out.splitlines() if line.startswith("episode")]
    assert returns == [1.0] * 4, out


RECURRENT_DQN_MEMORY_CUE = """
create_environment.env_name = 'alfish/MemoryCue-v0'
create_environment.num_parallel_environments = 8
DqnAlgorithm.hidden_sizes = (32,)
DqnAlgorithm.lr = 3e-3
DqnAlgorithm.gamma = 0.9
DqnAlgorithm.epsilon_greedy = 0.2
DqnAlgorithm.target_update_period = 10
DqnAlgorithm.encoding_network_ctor = @EncodingNetwork
EncodingNetwork.rnn = 'gru'
EncodingNetwork.rnn_size = 16
Trainer.num_threads = 1
TrainerConfig.algorithm_ctor = @DqnAlgorithm
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 150
TrainerConfig.unroll_length = 2
TrainerConfig.initial_collect_steps = 128
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.replay_buffer_length = 500
TrainerConfig.mini_batch_size = 16
TrainerConfig.mini_batch_length = 8
TrainerConfig.use_rollout_state = True
TrainerConfig.num_updates_per_train_iter = 1
TrainerConfig.summary_interval = 50
TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 15
TrainerConfig.num_eval_episodes = 40
TrainerConfig.num_eval_environments = 4
TrainerConfig.num_checkpoints = 0
"""


# Seeds 0-2 (GRU, stored state) reached 1.0 by iteration 30-75 of 150 (~3 s a run); the two variants by iteration 45.
@pytest.mark.timeout(60)
@pytest.mark.parametrize("params", [
    [],
    ["TrainerConfig.use_rollout_state = False", "DqnAlgorithm.burn_in = 2", "TrainerConfig.mini_batch_length = 10"],
    ["EncodingNetwork.rnn = 'lstm'", "TrainerConfig.priority_replay = True"],
], ids=["gru_stored_state", "zero_state_burn_in", "lstm_prioritized"])
def test_recurrent_dqn_remembers_the_cue(tmp_path, params):
    returns = [r["average_return"] for r in eval_log(run_trainer_from_text(tmp_path, RECURRENT_DQN_MEMORY_CUE, params))]
    assert returns[0] < 0.5, returns
    assert returns[-1] >= 0.9 and min(returns[-3:]) >= 0.9, returns


@pytest.mark.timeout(60)
def test_feed_forward_dqn_cannot_remember_the_cue(tmp_path):
    root = run_trainer_from_text(tmp_path, RECURRENT_DQN_MEMORY_CUE, [
        "EncodingNetwork.rnn = None", "TrainerConfig.use_rollout_state = False", "TrainerConfig.mini_batch_length = 2"])
    returns = [r["average_return"] for r in eval_log(root)]
    assert sum(returns) / len(returns) <= 0.3 and max(returns) <= 0.5, returns


# alfish/CartPoleNoVelocity-v1 (CartPole-v1 without its velocities) with the shipped recurrent conf. Measured here:
# seed 0 scored 223 at 12k env steps and >= 475 from 44k; seeds 1-2 >= 199 by 32k; feed-forward 40-50 up to 100k.
NO_VELOCITY = CONFS / "ppo_cartpole_novelocity.gin"
FEED_FORWARD = ["EncodingNetwork.rnn = None", "TrainerConfig.use_rollout_state = False"]


@pytest.mark.slow  # (~20 s; CI covers recurrent-vs-feed-forward on the memory toys above)
@pytest.mark.timeout(90)
def test_recurrent_ppo_balances_cartpole_without_velocities(tmp_path):
    root = tmp_path / "run"
    assert run_trainer(NO_VELOCITY, root, ["TrainerConfig.num_env_steps = 40000",
                                           "TrainerConfig.num_checkpoints = 0"]) == 0
    returns = [r["average_return"] for r in eval_log(root)]
    assert max(returns) >= 195, returns  # CartPole-v0's "solved", 4x what the feed-forward policy reaches


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_feed_forward_ppo_cannot_balance_cartpole_without_velocities(tmp_path):
    root = tmp_path / "run"
    assert run_trainer(NO_VELOCITY, root, ["TrainerConfig.num_env_steps = 40000", "TrainerConfig.num_checkpoints = 0",
                                           *FEED_FORWARD]) == 0
    returns = [r["average_return"] for r in eval_log(root)]
    assert max(returns) <= 100, returns


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shipped_recurrent_conf_reaches_475_without_velocities(tmp_path, seed):
    root = tmp_path / "run"
    assert run_trainer(NO_VELOCITY, root, [f"TrainerConfig.random_seed = {seed}",
                                           "TrainerConfig.num_checkpoints = 0"]) == 0
    returns = [r["average_return"] for r in eval_log(root)]
    assert max(returns) >= 475, returns


@pytest.mark.slow  # DDP learning (12 s); recurrent PPO learns and two-rank DDP runs each in the default run
@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_recurrent_ppo_learns_the_cue_on_two_ranks_with_identical_parameters(tmp_path):
    """torchrun, 2 gloo ranks: each rank unrolls its own 8 envs and keeps its own rollout states; gradients over
    whole sequences are averaged; the parameter check every iteration would stop the job if the ranks diverged."""
    import subprocess

    import torch

    from tests.trainer.test_distributed import ENV, REPO, TORCHRUN, WORKER

    conf, root = tmp_path / "memory.gin", tmp_path / "root"
    conf.write_text(RECURRENT_PPO_MEMORY_CUE + "TrainerConfig.ddp_paras_check_interval = 1\n")
    proc = subprocess.run(TORCHRUN + [WORKER, "train", str(tmp_path), str(conf), str(root)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stderr[-4000:]
    params = [torch.load(tmp_path / f"params-rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    assert any("rnn" in name for name in params[0]), list(params[0])
    for name in params[0]:
        assert torch.equal(params[0][name], params[1][name]), name
    returns = [r["average_return"] for r in eval_log(root)]
    assert returns[0] < 0.5 and returns[-1] >= 0.9, returns


# alfish/MemoryCueContinuous-v0: the same task with a Box(-1, 1) action; the query pays cue * action (optimum 1,
# memoryless 0). SAC's temperature starts low (alpha = e^-3): from SAC's default alpha = 1, the entropy bonus weighs
# as much as this reward of at most 1, and seed 0 stayed within [-0.03, 0.03] for 600 iterations.
RECURRENT_SAC_MEMORY_CUE = """
create_environment.env_name = 'alfish/MemoryCueContinuous-v0'
create_environment.num_parallel_environments = 8
SacAlgorithm.hidden_sizes = (32,)
SacAlgorithm.actor_lr = 3e-3
SacAlgorithm.critic_lr = 3e-3
SacAlgorithm.alpha_lr = 3e-3
SacAlgorithm.gamma = 0.9
SacAlgorithm.target_update_tau = 0.05
SacAlgorithm.initial_log_alpha = -3.0
SacAlgorithm.encoding_network_ctor = @EncodingNetwork
EncodingNetwork.rnn = 'gru'
EncodingNetwork.rnn_size = 16
Trainer.num_threads = 1
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 300
TrainerConfig.unroll_length = 2
TrainerConfig.initial_collect_steps = 128
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.replay_buffer_length = 500
TrainerConfig.mini_batch_size = 16
TrainerConfig.mini_batch_length = 8
TrainerConfig.use_rollout_state = True
TrainerConfig.num_updates_per_train_iter = 1
TrainerConfig.summary_interval = 50
TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 30
TrainerConfig.num_eval_episodes = 40
TrainerConfig.num_eval_environments = 4
TrainerConfig.num_checkpoints = 0
"""


# Measured here (first evaluation >= 0.9, of 300 iterations, one every 30; ~4 s a run): GRU with the stored state,
# seeds 0-3: iterations 150, 210, 150, 240; zero state + burn-in 2, seeds 0-2: 210, 210, 180; LSTM with prioritized
# replay, seeds 0-2: 210, 240, 150. Each ended at 0.97-0.99.
# The default run trains SAC with the stored state; the burn-in and LSTM + prioritized variants run in the slow tier
# (`python -m pytest -m slow tests`): the recurrent DQN test above runs the same two variants in the default run.
@pytest.mark.timeout(60)
@pytest.mark.parametrize("params", [
    [],
    pytest.param(["TrainerConfig.use_rollout_state = False", "SacAlgorithm.burn_in = 2",
                  "TrainerConfig.mini_batch_length = 10"], marks=pytest.mark.slow),
    pytest.param(["EncodingNetwork.rnn = 'lstm'", "TrainerConfig.priority_replay = True"], marks=pytest.mark.slow),
], ids=["gru_stored_state", "zero_state_burn_in", "lstm_prioritized"])
def test_recurrent_sac_remembers_the_cue(tmp_path, params):
    returns = [r["average_return"] for r in eval_log(run_trainer_from_text(tmp_path, RECURRENT_SAC_MEMORY_CUE, params))]
    assert returns[0] < 0.5, returns
    assert returns[-1] >= 0.9 and min(returns[-3:]) >= 0.9, returns


# The same shared-encoder SAC without the core (seeds 0-2): evaluations within [-0.17, 0.14], means about 0.
@pytest.mark.timeout(60)
def test_feed_forward_sac_cannot_remember_the_cue(tmp_path):
    root = run_trainer_from_text(tmp_path, RECURRENT_SAC_MEMORY_CUE, [
        "EncodingNetwork.rnn = None", "TrainerConfig.use_rollout_state = False"])
    returns = [r["average_return"] for r in eval_log(root)]
    assert sum(returns) / len(returns) <= 0.3 and max(returns) <= 0.5, returns


@pytest.mark.timeout(90)
def test_recurrent_dqn_resumes_with_its_stored_rollout_states(tmp_path):
    """Stopped at iteration 75 of 150 and resumed: the replay buffer (with each step's rollout state) comes back
    from the checkpoint, and the resumed run still learns the cue."""
    conf = tmp_path / "memory.gin"
    conf.write_text(RECURRENT_DQN_MEMORY_CUE)
    root = tmp_path / "run"
    assert run_trainer(conf, root, ["TrainerConfig.num_iterations = 75", "TrainerConfig.num_checkpoints = 1"]) == 0
    assert run_trainer(conf, root, ["TrainerConfig.num_checkpoints = 2"]) == 0  # (replay buffers are saved by default)
    log = eval_log(root)
    assert [r["iteration"] for r in log] == list(range(15, 151, 15))  # continued from 75, not restarted
    assert log[-1]["average_return"] >= 0.9, [r["average_return"] for r in log]
