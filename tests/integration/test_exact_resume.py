"""Exact resume: a run stopped by SIGTERM mid-episode (``SimulatedPreemption``) and resumed in a new process equals
the run that never stopped, tensor for tensor (parameters, optimizer state, replay contents with priorities, data
transformers, the envs' episodes in flight, RNG states) and evaluation for evaluation; checked by
``python -m alfish.tools.check_resume`` (three ``alfish.bin.train`` processes each). Also: the envs' episode seeds
and replay (``EpisodeLog``), a nondeterministic env named in a warning (the run continues as before), and the tool
reporting the first difference where a resume cannot be exact (async unroll)."""
import logging

import gin
import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.envs.batched_env import BatchedEnv
from alfish.rundir.checkpoint import Checkpointer
from alfish.tools import check_resume

from .inprocess import eval_log, run_trainer_from_text

pytestmark = [pytest.mark.timeout(240)]

# SAC on Pendulum-v1 (200-step episodes): stopped at iteration 70 (warm-up 50 steps, then 1 step an iteration: the
# episode is at step 120), compared at 140.
SAC = """
create_environment.env_name = 'Pendulum-v1'
create_environment.num_parallel_environments = 1
SacAlgorithm.hidden_sizes = (32, 32)
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.random_seed = 3
TrainerConfig.num_iterations = 1000
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = 50
TrainerConfig.replay_buffer_length = 1000
TrainerConfig.mini_batch_size = 32
TrainerConfig.mini_batch_length = 2
TrainerConfig.evaluate = True
TrainerConfig.async_eval = False
TrainerConfig.eval_interval = 40
TrainerConfig.num_eval_episodes = 1
TrainerConfig.summary_interval = 20
TrainerConfig.num_checkpoints = 0
Trainer.num_threads = 1
"""

# PPO on CartPole-v1, 4 envs x 16 steps: stopped at iteration 5, compared at 10; evaluated asynchronously every 5
# iterations. Each eval env step takes 0.05 s more (alfish/Latency-v0), so an evaluation (4 episodes of at least 8
# steps) takes at least 1.6 s: far longer than the moment between sending it and the stop right after, on a machine
# however loaded (a sleep is never shorter). So the evaluation of the stop's iteration is always still running at the
# stop: it goes into the checkpoint and is re-run after the resume (without the latency, whether it finished first was
# a race between the evaluation and the stop).
PPO = """
create_environment.env_name = 'CartPole-v1'
create_environment.num_parallel_environments = 4
PpoAlgorithm.hidden_sizes = (32,)
TrainerConfig.algorithm_ctor = @PpoAlgorithm
TrainerConfig.random_seed = 1
TrainerConfig.num_iterations = 100
TrainerConfig.unroll_length = 16
TrainerConfig.whole_replay_buffer_training = True
TrainerConfig.clear_replay_buffer = True
TrainerConfig.replay_buffer_length = 17
TrainerConfig.mini_batch_size = 32
TrainerConfig.mini_batch_length = 1
TrainerConfig.num_updates_per_train_iter = 4
TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 5
TrainerConfig.num_eval_episodes = 4
TrainerConfig.num_checkpoints = 0
Trainer.num_threads = 1
eval/create_environment.env_name = 'alfish/Latency-v0'
eval/create_environment.env_kwargs = {'env_name': 'CartPole-v1', 'latency_s': 0.05}
"""

# Double DQN with prioritized replay on CartPole-v1, 2 envs, 4 steps an iteration: stopped at iteration 30.
DQN_PER = """
create_environment.env_name = 'CartPole-v1'
create_environment.num_parallel_environments = 2
DqnAlgorithm.hidden_sizes = (32,)
TrainerConfig.algorithm_ctor = @DqnAlgorithm
TrainerConfig.random_seed = 2
TrainerConfig.num_iterations = 1000
TrainerConfig.unroll_length = 4
TrainerConfig.initial_collect_steps = 64
TrainerConfig.replay_buffer_length = 2000
TrainerConfig.priority_replay = True
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.mini_batch_size = 32
TrainerConfig.mini_batch_length = 2
TrainerConfig.evaluate = True
TrainerConfig.async_eval = False
TrainerConfig.eval_interval = 20
TrainerConfig.num_eval_episodes = 2
TrainerConfig.num_checkpoints = 0
Trainer.num_threads = 1
"""


def check(tmp_path, conf_text, iterations, *params):
    conf = tmp_path / "conf.gin"
    conf.write_text(conf_text)
    return check_resume.main(["--conf", str(conf), "--iterations", str(iterations), "--work_dir",
                              str(tmp_path / "runs"), *[a for p in params for a in ("--conf_param", p)]])


def test_sac_resumes_exactly_mid_episode(tmp_path, capsys):
    assert check(tmp_path, SAC, 70) == 0, capsys.readouterr().out
    assert "resume is exact" in capsys.readouterr().out
    log = eval_log(tmp_path / "runs" / "resumed")
    assert [r["iteration"] for r in log] == [40, 80, 120]  # evaluated before and after the stop


@pytest.mark.slow  # 26 s; SAC and DQN+PER exact resumes stay in the default run
def test_ppo_resumes_exactly_with_an_interrupted_asynchronous_evaluation(tmp_path, capsys):
    assert check(tmp_path, PPO, 5) == 0, capsys.readouterr().out
    resumed = tmp_path / "runs" / "resumed"
    checkpoints = Checkpointer(str(resumed / "checkpoints"))
    # the evaluation of iteration 5, running at the first stop, was kept in its checkpoint and recorded after the
    # resume; the one of iteration 10 (sent after it was recorded) is running at the second stop, kept likewise
    assert [p["iteration"] for p in checkpoints.load(5).tensors["pending_evaluations"]] == [5]
    assert [r["iteration"] for r in eval_log(resumed)] == [5]
    assert [p["iteration"] for p in checkpoints.load(10).tensors["pending_evaluations"]] == [10]


# slow: 14 s in CI; SAC's exact resume stays in the default run, and prioritized replay's state round trip is
# tested in tests/replay
@pytest.mark.slow
def test_dqn_with_prioritized_replay_resumes_exactly(tmp_path, capsys):
    assert check(tmp_path, DQN_PER, 30) == 0, capsys.readouterr().out


@pytest.mark.slow  # 17 s; the transformers' state round trips are unit-tested in the default run
def test_a_frame_stacker_and_an_observation_normalizer_resume_exactly(tmp_path, capsys):
    assert check(tmp_path, SAC, 70,
                 "TrainerConfig.data_transformer_ctor = [@FrameStacker, @ObservationNormalizer]",
                 "FrameStacker.stack_size = 3") == 0, capsys.readouterr().out


@pytest.mark.slow  # 15 s; the exploration state's round trip is unit-tested in tests/algorithms/test_sde_algorithms.py
def test_sac_with_gsde_resumes_exactly_with_its_noise_matrices(tmp_path, capsys):
    # the stop falls between two redraws (every 4 steps): the resumed run must act from the stored matrices
    assert check(tmp_path, SAC, 70, "SacAlgorithm.use_sde = True", "SacAlgorithm.sde_sample_freq = 4",
                 "TrainerConfig.unroll_length = 3") == 0, capsys.readouterr().out


@pytest.mark.slow  # ~15 s; the running returns' round trip is unit-tested in tests/transforms
def test_the_return_based_reward_normalizer_resumes_exactly_mid_episode(tmp_path, capsys):
    # stopped at env step 120 of a 200-step episode: the running return in flight must come back with the unroll
    assert check(tmp_path, SAC, 70, "TrainerConfig.data_transformer_ctor = [@RewardNormalizer]",
                 "RewardNormalizer.gamma = 0.9") == 0, capsys.readouterr().out


@pytest.mark.slow  # 21 s; check_resume's comparison is unit-tested in the default run
def test_the_tool_names_the_first_difference_where_a_resume_cannot_be_exact(tmp_path, capsys):
    # async unroll: which parameter version chose each action depends on timing
    assert check(tmp_path, SAC, 70, "TrainerConfig.async_unroll = True") == 1
    out = capsys.readouterr().out
    assert "resume is not exact: the first difference at iteration 140 is /" in out, out


# --------------------------------------------------------------------------------------------------- the envs ----
def test_envs_replay_their_episodes_in_flight_to_the_same_state():
    env = BatchedEnv("CartPole-v1", 2, seed=10)
    env.reset()
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):  # several episodes each: the later ones began from the env's RNG
        env.step(torch.randint(2, (2,), generator=generator))
    states = env.resume_states()
    assert all("rng" in s["start"] for s in states)  # autoreset episodes: the RNG's state before their reset
    again = BatchedEnv("CartPole-v1", 2, seed=999)
    assert again.restore(states, env._prev_done.copy()) == [True, True]
    actions = torch.randint(2, (40, 2), generator=generator)  # through more episode ends and autoresets
    assert all(torch.equal(env.step(a).observation, again.step(a).observation) for a in actions)
    env.close(), again.close()
    fresh = BatchedEnv("CartPole-v1", 1, seed=3)
    fresh.reset()
    assert fresh.resume_states()[0]["start"] == {"seed": 3}
    fresh.close()


def test_an_env_restored_right_after_its_episode_ended_resets_at_its_next_step():
    env = BatchedEnv("CartPole-v1", 1, seed=4)
    env.reset()
    step = None
    while step is None or int(step.step_type[0]) != 2:  # until the episode's LAST step
        step = env.step(torch.ones(1, dtype=torch.int64))  # always push right: it falls quickly
    states, prev_done = env.resume_states(), env._prev_done.copy()
    again = BatchedEnv("CartPole-v1", 1, seed=0)
    assert again.restore(states, prev_done) == [True]
    first, first_again = env.step(torch.zeros(1, dtype=torch.int64)), again.step(torch.zeros(1, dtype=torch.int64))
    assert int(first.step_type[0]) == int(first_again.step_type[0]) == 0  # FIRST: the next episode
    assert torch.equal(first.observation, first_again.observation)
    env.close(), again.close()


class Unseeded(gym.Env):
    """Starts every episode from OS entropy, whatever the seed: not reproducible."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._state = np.random.default_rng().uniform(-1, 1, 2).astype(np.float32)
        return self._state, {}

    def step(self, action):
        self._state = np.clip(self._state + (0.1 if action else -0.1), -1, 1).astype(np.float32)
        return self._state, 0.0, False, False, {}


def test_a_nondeterministic_env_is_named_on_resume_and_the_run_goes_on(tmp_path, caplog):
    if "alfish_test/Unseeded-v0" not in gym.registry:
        gym.register(id="alfish_test/Unseeded-v0", entry_point=Unseeded, max_episode_steps=50)
    conf = DQN_PER.replace("'CartPole-v1'", "'alfish_test/Unseeded-v0'") + \
        "Trainer.callbacks = [@SimulatedPreemption()]\n"
    try:
        run_trainer_from_text(tmp_path, conf, ["SimulatedPreemption.iteration = 30"], expect=143)
        with caplog.at_level(logging.WARNING):
            run_trainer_from_text(tmp_path, conf, ["SimulatedPreemption.iteration = 40"], expect=143)
    finally:
        gin.clear_config()
    warnings = [r.getMessage() for r in caplog.records if "exact resume" in r.getMessage()]
    assert len(warnings) == 1 and "env 'alfish_test/Unseeded-v0' is not deterministic" in warnings[0], warnings


def test_a_resume_under_other_settings_warns(tmp_path, caplog):
    """The checkpoint records the device type, threads, compile mode and deterministic algorithms; a resume under
    other ones says which (exactness holds for the same ones)."""
    from alfish.trainer.resume import warn_on_other_settings

    class Ckpt:
        path = str(tmp_path / "ckpt-5")
        meta = {"reproducibility": {"device": "cpu", "threads": torch.get_num_threads() + 1, "compile_mode": None,
                                    "deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}}

    class Learner:
        device, compile_mode = torch.device("cpu"), None

    with caplog.at_level(logging.WARNING):
        warn_on_other_settings(Ckpt(), Learner())
    (message,) = [r.getMessage() for r in caplog.records]
    assert f"threads {torch.get_num_threads() + 1} -> {torch.get_num_threads()}" in message
    assert "device" not in message.split("(")[1]  # only what changed is named
    caplog.clear()
    Ckpt.meta["reproducibility"]["threads"] = torch.get_num_threads()
    warn_on_other_settings(Ckpt(), Learner())
    assert not caplog.records
