"""Atari games (``ALE/...`` env names) are made by alfish.envs.atari.make_atari with Machado et al.'s protocol and the
DQN preprocessing, in both vectorizations; without the ``atari`` extra the error is one line saying how to install it.

The tests that step a game need ale-py and opencv (``pip install alfish[atari]``) and are skipped without them.
"""
import sys

import gin
import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.config import load_config_text
from alfish.data.types import StepType
from alfish.envs import create_environment
from alfish.envs.atari import MISSING_EXTRA, AtariDependencyError
from alfish.envs.factory import EnvFactory
from alfish.transforms import FrameStacker, ImageScaleTransformer, RewardClipping
from alfish.transforms.base import SequentialDataTransformer

PONG = "ALE/Pong-v5"


@pytest.fixture
def atari():
    """Skips the test unless the atari extra is installed."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")


@pytest.fixture
def make_env():
    envs = []

    def make(**kwargs):
        env = create_environment(**kwargs)
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()


def wrappers(env: gym.Env) -> dict:
    """Each wrapper of ``env`` (and the ALE env itself) by class name."""
    layers = {}
    while True:
        layers[type(env).__name__] = env
        if not isinstance(env, gym.Wrapper):
            return layers
        env = env.env


def random_steps(env, n):
    steps = [env.reset()]
    for _ in range(n):
        steps.append(env.step(env.random_action()))
    return steps


def test_pong_steps_through_create_environment(atari, make_env):
    env = make_env(env_name=PONG, num_parallel_environments=2, seed=3)
    assert env.discrete and env.action_space == gym.spaces.Discrete(6)
    assert env.observation_space == gym.spaces.Box(0, 255, (1, 84, 84), np.uint8)
    steps = random_steps(env, 20)
    for ts in steps:
        assert ts.observation.dtype == torch.uint8 and ts.observation.shape == (2, 1, 84, 84)
        assert ts.reward.shape == (2,) and ts.env_id.tolist() == [0, 1]
    assert steps[0].step_type.tolist() == [StepType.FIRST] * 2
    assert all(ts.step_type.tolist() == [StepType.MID] * 2 for ts in steps[1:])  # a game of Pong lasts longer
    assert steps[-1].observation.float().std() > 0  # the screen, not a blank frame


def test_the_protocol_of_machado_et_al_reaches_the_ale_env(atari):
    # EnvFactory makes each env of a batch, in this process or in an env worker
    env = EnvFactory.here(PONG, None, None)()
    layers = wrappers(env)
    ale_env = env.unwrapped
    assert ale_env.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)  # sticky actions
    assert ale_env._frameskip == 1  # frames are skipped (and the last two max-pooled) by AtariPreprocessing
    preprocessing = layers["AtariPreprocessing"]
    assert (preprocessing.frame_skip, preprocessing.noop_max, preprocessing.screen_size) == (4, 30, (84, 84))
    assert not preprocessing.terminal_on_life_loss and preprocessing.grayscale_obs and not preprocessing.scale_obs
    assert layers["TimeLimit"]._max_episode_steps == 27_000  # 108,000 frames
    assert ale_env.ale.getInt("max_num_frames_per_episode") == 0  # one cap only, in agent steps
    assert len(ale_env.get_action_meanings()) == 6  # the minimal action set
    env.close()


def test_env_kwargs_change_the_protocol(atari, make_env):
    env = make_env(env_name=PONG, num_parallel_environments=1,
                   env_kwargs={"repeat_action_probability": 0.0, "max_episode_steps": 5, "noop_max": 0,
                               "full_action_space": True, "screen_size": 64})
    assert env.action_space == gym.spaces.Discrete(18) and env.observation_space.shape == (1, 64, 64)
    steps = random_steps(env, 6)
    assert [int(ts.step_type) for ts in steps] == [StepType.FIRST] + [StepType.MID] * 4 + [StepType.LAST,
                                                                                           StepType.FIRST]
    assert float(steps[5].discount) == 1.0  # truncated by the time limit: bootstrapped
    with pytest.raises(ValueError, match="^env_kwargs 'frameskip' is set by alfish's Atari preprocessing for "
                                         "ALE/Pong-v5; use 'frame_skip'$"):
        create_environment(env_name=PONG, env_kwargs={"frameskip": 4})


def test_same_seed_same_game(atari, make_env):
    first, second = (make_env(env_name=PONG, num_parallel_environments=2, seed=7) for _ in range(2))
    actions = torch.tensor([[2, 3], [3, 2], [0, 1]]).repeat(10, 1)
    for env in (first, second):
        env.reset()
    for action in actions:
        assert torch.equal(first.step(action).observation, second.step(action).observation)


def test_the_usual_atari_transformers_on_pong_frames(atari, make_env):
    # the replay buffer stores single (1, 84, 84) frames; FrameStacker rebuilds (4, 84, 84) stacks, oldest first
    env = make_env(env_name=PONG, num_parallel_environments=2, seed=0)
    stacker = FrameStacker(env.observation_space, stack_size=4)
    stacked = stacker.output_observation_space(env.observation_space)
    assert stacked == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    transformer = SequentialDataTransformer([stacker, ImageScaleTransformer(stacked), RewardClipping()])
    assert transformer.output_observation_space(env.observation_space) == gym.spaces.Box(-1.0, 1.0, (4, 84, 84))
    state, frames = None, []
    for ts in random_steps(env, 5):
        frames.append(ts.observation)
        out, state = transformer.transform_timestep(ts._replace(reward=torch.tensor([21.0, -4.0])), state, True)
        assert out.reward.tolist() == [1.0, -1.0]  # DQN's clipping: integer score changes become their sign
    assert out.observation.shape == (2, 4, 84, 84) and out.observation.dtype == torch.float32
    expected = torch.cat(frames[-4:], dim=1).float() * (2 / 255) - 1
    assert torch.allclose(out.observation, expected)


def test_frames_render_for_play(atari):
    from alfish.envs.atari import make_atari

    env = make_atari(PONG, render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (210, 160, 3) and frame.dtype == np.uint8
    env.close()


def test_pong_in_env_workers(atari, make_env):
    env = make_env(env_name=PONG, num_parallel_environments=2, seed=0, vectorization="async",
                   env_kwargs={"max_episode_steps": 3})
    steps = random_steps(env, 4)
    assert all(ts.observation.dtype == torch.uint8 and ts.observation.shape == (2, 1, 84, 84) for ts in steps)
    assert [ts.step_type.tolist() for ts in steps] == [[StepType.FIRST] * 2, [StepType.MID] * 2,
                                                       [StepType.MID] * 2, [StepType.LAST] * 2, [StepType.FIRST] * 2]


@pytest.mark.parametrize("missing", ["ale_py", "cv2"])
def test_missing_extra_is_one_line(missing, monkeypatch):
    monkeypatch.setitem(sys.modules, missing, None)  # `import <missing>` raises ImportError
    with pytest.raises(AtariDependencyError) as info:
        create_environment(env_name=PONG, num_parallel_environments=1)
    assert str(info.value) == MISSING_EXTRA == "Atari envs need ale-py and opencv: pip install alfish[atari]"
    assert isinstance(info.value, ImportError) and isinstance(info.value, ValueError)  # build reports it as one line


def test_ale_env_names_load_from_a_stored_config():
    # not a 'module:EnvId' name: a root_dir's config may name an Atari game without --allow_import
    gin.clear_config()
    try:
        load_config_text(f"create_environment.env_name = '{PONG}'\n"
                         "create_environment.env_kwargs = {'repeat_action_probability': 0.0}\n",
                         "runs/a/meta.json[operative_config]")
        assert gin.query_parameter("create_environment.env_name") == PONG
        assert gin.query_parameter("create_environment.env_kwargs") == {"repeat_action_probability": 0.0}
    finally:
        gin.clear_config()
