"""``alfish.train`` and ``alfish.load_policy`` (alfish/api/): the train command's code path as a call that returns the
final evaluation and raises one-line errors, twice in one process; the policy play acts with, one observation at a
time; and ``import alfish`` without torch."""
import json
import logging
import os
import subprocess
import sys
import textwrap

import gin
import gymnasium as gym
import numpy as np
import pytest
import torch

import alfish
from alfish.bin import play
from tests.evaluate.test_one_acting_function import SEED, TINY_RECURRENT_SAC, recording
from tests.integration.inprocess import REPO, eval_log

pytestmark = [pytest.mark.timeout(120)]

# CartPole, 2 envs x 4 steps per iteration, 3 iterations; evaluations (in this process) at iterations 2 and 3.
TINY = """
create_environment.env_name = 'CartPole-v1'
create_environment.num_parallel_environments = 2
A2cAlgorithm.hidden_sizes = (8,)
Trainer.num_threads = 1
TrainerConfig.algorithm_ctor = @A2cAlgorithm
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 3
TrainerConfig.unroll_length = 4
TrainerConfig.evaluate = True
TrainerConfig.async_eval = False
TrainerConfig.eval_interval = 2
TrainerConfig.num_eval_episodes = 3
TrainerConfig.num_eval_environments = 1
TrainerConfig.num_checkpoints = 1
"""


@pytest.fixture
def conf(tmp_path):
    path = tmp_path / "tiny.gin"
    path.write_text(TINY)
    return path


def algorithm_tensors(root) -> dict:
    newest = max((root / "checkpoints").glob("ckpt-*"), key=lambda p: int(p.name.split("-")[1]))
    return torch.load(newest / "algorithm.pt", weights_only=True)


def test_import_alfish_imports_no_torch_and_reaches_the_api_lazily():
    code = textwrap.dedent("""
        import sys
        import alfish
        assert 'torch' not in sys.modules and 'alfish.api' not in sys.modules, sorted(sys.modules)
        assert {'train', 'load_policy', 'TrainError'} <= set(dir(alfish))
        from alfish import train
        assert 'torch' in sys.modules and train is sys.modules['alfish.api'].train
        try:
            alfish.trian
        except AttributeError as err:
            print(err)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "module 'alfish' has no attribute 'trian'"


def test_train_returns_the_final_evaluation_that_eval_log_records(conf, tmp_path):
    result = alfish.train(conf, tmp_path / "run")
    records = eval_log(tmp_path / "run")
    assert [r["iteration"] for r in records] == [2, 3]
    assert result.evaluation == records[-1]
    assert result.average_return == records[-1]["average_return"] > 0
    assert result.average_episode_length == records[-1]["average_episode_length"]
    assert (result.iterations, result.env_steps) == (3, 3 * 4 * 2)  # iterations x unroll_length x envs
    assert result.root_dir == str(tmp_path / "run")
    assert (tmp_path / "run" / "config" / "operative.gin").is_file()  # the command's config record


def test_train_twice_in_one_process_starts_clean_each_time_and_resumes(conf, tmp_path):
    root_logger = logging.getLogger()
    handlers, level = list(root_logger.handlers), root_logger.level
    first = alfish.train(conf, tmp_path / "a")
    assert root_logger.handlers == handlers and root_logger.level == level
    assert gin.config_str() == ""
    second = alfish.train(conf, tmp_path / "b")
    # the same seed in a clean process state: the same run, tensor for tensor
    assert second.evaluation["average_return"] == first.evaluation["average_return"]
    a, b = algorithm_tensors(tmp_path / "a"), algorithm_tensors(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    log_a = (tmp_path / "a" / "log.txt").read_text()
    assert "training finished: 3 iterations" in log_a and str(tmp_path / "b") not in log_a  # its handler was closed

    alfish.train(conf, tmp_path / "c", ["TrainerConfig.random_seed = 1"])
    c = algorithm_tensors(tmp_path / "c")
    assert not all(torch.equal(a[k], c[k]) for k in a)

    resumed = alfish.train(conf, tmp_path / "a", ["TrainerConfig.num_iterations = 5"])
    assert (resumed.iterations, resumed.env_steps, resumed.evaluation["iteration"]) == (5, 40, 5)
    assert "resumed from" in (tmp_path / "a" / "log.txt").read_text()


def test_a_bad_binding_raises_one_line_and_the_next_call_works(conf, tmp_path):
    with pytest.raises(alfish.TrainError) as caught:
        alfish.train(conf, tmp_path / "bad", ["TrainerConfig.num_iteratons = 4"])
    message = str(caught.value)
    assert "\n" not in message and "did you mean 'num_iterations'" in message, message
    assert caught.value.exit_code == 2
    assert not (tmp_path / "bad").exists()  # refused before anything was written
    assert gin.config_str() == ""
    with pytest.raises(TypeError, match=r"pass \['TrainerConfig.num_iterations=4'\]"):
        alfish.train(conf, tmp_path / "bad", "TrainerConfig.num_iterations=4")
    with pytest.raises(alfish.TrainError, match="tiny_typo.gin"):
        alfish.train(tmp_path / "tiny_typo.gin", tmp_path / "bad")
    assert alfish.train(conf, tmp_path / "good", ["TrainerConfig.num_iterations = 1"]).iterations == 1


class NanReward(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), float("nan"), False, False, {}


def test_a_failure_during_training_raises_the_commands_one_line(conf, tmp_path):
    gym.register(id="ApiTest/NanReward-v0", entry_point=NanReward, max_episode_steps=5)
    try:
        with pytest.raises(alfish.TrainError) as caught:
            alfish.train(conf, tmp_path / "nan", ["create_environment.env_name = 'ApiTest/NanReward-v0'"])
    finally:
        del gym.registry["ApiTest/NanReward-v0"]
    message = str(caught.value)
    assert caught.value.exit_code == 1 and "\n" not in message
    assert message.startswith("training stopped: EnvContractError: env 'ApiTest/NanReward-v0'") and "nan" in message


def test_a_stopped_run_raises_with_the_signal_and_resumes(conf, tmp_path):
    # a real SIGTERM (Trainer.callbacks' preemption) in a child process, then a second call there resumes the run
    code = textwrap.dedent(f"""
        import alfish
        try:
            alfish.train({str(conf)!r}, 'run', ['Trainer.callbacks = [@SimulatedPreemption()]',
                                                  'SimulatedPreemption.iteration = 2'])
        except alfish.TrainError as err:
            print(err.exit_code, err)
        print(alfish.train({str(conf)!r}, 'run').iterations)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=90,
                          env={**_child_env(), "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    stopped, finished = proc.stdout.strip().splitlines()
    assert stopped == ("143 training stopped by SIGTERM at iteration 2; call alfish.train again with the same "
                       "root_dir to resume from its newest checkpoint")
    assert finished == "3" and "resumed from" in proc.stderr


SPAWNING_SCRIPT = """
import multiprocessing

import alfish

if __name__ == "__mp_main__":  # a spawned child, running this script again as multiprocessing starts it
    try:
        alfish.train("tiny.gin", "run")
    except alfish.TrainError as err:
        print(err, flush=True)

if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(target=print)
    child.start()
    child.join()
"""


def test_train_refuses_to_run_in_a_child_that_is_starting(conf, tmp_path):
    # A script calling alfish.train without the __main__ guard: each child of the run would train again.
    (tmp_path / "script.py").write_text(SPAWNING_SCRIPT)
    proc = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**_child_env(), "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == ("alfish.train was called while a child process was starting: multiprocessing "
                                   "starts the child processes of a run (async evaluation and unroll, env workers) by "
                                   'running your script again, so call alfish.train under `if __name__ == "__main__":`')
    assert not (tmp_path / "run").exists()


def _child_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1")


# ------------------------------------------------------------------------------------------------------ load_policy --
@pytest.fixture(scope="module")
def recurrent_run(tmp_path_factory):
    """Two iterations of recurrent SAC (a GRU) with an observation normalizer: actions depend on the state carried
    along an episode and on the normalizer's statistics."""
    work = tmp_path_factory.mktemp("recurrent")
    (work / "conf.gin").write_text(TINY_RECURRENT_SAC)
    alfish.train(work / "conf.gin", work / "run")
    return work / "run"


def play_actions(monkeypatch, root) -> np.ndarray:
    """The actions ``python -m alfish.bin.play --num_episodes 1`` takes on ``root`` (its env reset from ``SEED``)."""
    actions: list = []
    with monkeypatch.context() as patch:
        recording(patch, play, "create_env", actions)
        try:
            assert play.main(["--root_dir", str(root), "--num_episodes", "1"]) == 0
        finally:
            gin.clear_config()
    return np.stack(actions)


def episode_actions(policy, env) -> np.ndarray:
    observation, _ = env.reset(seed=SEED)
    policy.reset()
    actions, done = [], False
    while not done:
        action = policy.act(observation)
        assert isinstance(action, np.ndarray) and env.action_space.contains(action)
        actions.append(action)
        observation, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    return np.stack(actions)


def test_load_policy_acts_as_play_does(recurrent_run, monkeypatch):
    reference = play_actions(monkeypatch, recurrent_run)
    assert len(reference) >= 5 and len(np.unique(reference)) >= 3  # the actions vary from step to step
    policy = alfish.load_policy(recurrent_run)
    assert gin.config_str() == ""
    env = policy.make_env()
    try:
        for _ in range(2):  # the second episode shows that reset() starts the recurrent state over
            np.testing.assert_array_equal(episode_actions(policy, env), reference)
        sampling = alfish.load_policy(recurrent_run, epsilon_greedy=1.0)  # the comparison can fail
        assert not np.array_equal(episode_actions(sampling, env), reference)
    finally:
        env.close()
    assert policy.env_name == "alfish/MemoryCueContinuous-v0" and policy.checkpoint.endswith("ckpt-2")
    assert policy.iteration == 2


def test_a_discrete_policy_takes_its_networks_argmax(conf, tmp_path):
    alfish.train(conf, tmp_path / "run")
    policy = alfish.load_policy(tmp_path / "run")
    weights = algorithm_tensors(tmp_path / "run")
    env = gym.make("CartPole-v1")
    observation, _ = env.reset(seed=3)
    for _ in range(20):
        action = policy.act(observation)
        # A2C's flat policy MLP by hand: 4 -> 8 (tanh) -> 2 logits; the greedy action is their argmax
        hidden = np.tanh(weights["net.policy.0.weight"].numpy() @ observation + weights["net.policy.0.bias"].numpy())
        logits = weights["net.policy.2.weight"].numpy() @ hidden + weights["net.policy.2.bias"].numpy()
        assert type(action) is np.int64 and action == int(np.argmax(logits))
        observation, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            observation, _ = env.reset()
            policy.reset()


def test_load_policy_errors_are_one_line(recurrent_run, tmp_path):
    with pytest.raises(alfish.LoadPolicyError, match=r"^no valid checkpoint under .*; train first"):
        alfish.load_policy(tmp_path / "nothing")
    with pytest.raises(alfish.LoadPolicyError, match="best=True and checkpoint_step name different checkpoints"):
        alfish.load_policy(recurrent_run, best=True, checkpoint_step=2)
    with pytest.raises(alfish.LoadPolicyError, match=r"pass \['my_envs'\]"):
        alfish.load_policy(recurrent_run, allow_import="my_envs")
    with pytest.raises(alfish.LoadPolicyError, match=r"epsilon_greedy=1.5 must be a probability"):
        alfish.load_policy(recurrent_run, epsilon_greedy=1.5)
    policy = alfish.load_policy(recurrent_run)
    with pytest.raises(ValueError, match=r"observation has shape \[3\] but the policy's observation space .* has "
                                         r"shape \[2\]"):
        policy.act(np.zeros(3, np.float32))


def test_load_policy_refuses_a_stored_config_that_imports_an_untrusted_module(recurrent_run, tmp_path):
    # A run whose config imports a module (here: a module of the standard library) is played only once trusted.
    (tmp_path / "conf.gin").write_text("import json\n" + TINY)
    alfish.train(tmp_path / "conf.gin", tmp_path / "run", ["TrainerConfig.num_iterations = 1"])
    with pytest.raises(alfish.LoadPolicyError) as caught:
        alfish.load_policy(tmp_path / "run")
    assert "--allow_import json" in str(caught.value) and "\n" not in str(caught.value)
    assert alfish.load_policy(tmp_path / "run", allow_import=["json"]).iteration == 1
    assert json.loads("1") == 1  # (the module the conf imports)
