"""MultiDiscrete and MultiBinary actions at the env boundary: BatchedEnv takes int64 ``[B, k]`` actions and hands
each env its space's own dtype (int8 for MultiBinary), refuses wrong shapes and float actions in one line, and the
spec's zero time step has the layout the replay buffer stores."""
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import alfish.envs.toy  # noqa: F401  (registers alfish/*)
from alfish.envs.batched_env import BatchedEnv
from alfish.envs.spec import EnvSpec, action_layout

DTYPE_PROBE = "alfish-test/ActionDtypeProbe-v0"


class ActionDtypeProbe(gym.Env):
    """Reward 1 when the action it receives is a numpy array of its action space's dtype and shape, else 0."""

    metadata = {"render_modes": []}

    def __init__(self, action_space: gym.Space, render_mode: Any = None):
        self.render_mode = render_mode
        self.action_space = action_space
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)

    def reset(self, *, seed: Any = None, options: Any = None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any):
        ok = (isinstance(action, np.ndarray) and action.dtype == self.action_space.dtype
              and action.shape == self.action_space.shape and self.action_space.contains(action))
        return np.zeros(1, np.float32), float(ok), False, False, {}


if DTYPE_PROBE not in gym.registry:
    gym.register(id=DTYPE_PROBE, entry_point=ActionDtypeProbe)


@pytest.fixture
def make_env():
    envs = []

    def make(env_name: str, num_envs: int = 2, **env_kwargs):
        env = BatchedEnv(env_name, num_envs, seed=0, env_kwargs=env_kwargs or None)
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()


@pytest.mark.parametrize("space", [gym.spaces.MultiBinary(3), gym.spaces.MultiDiscrete([3, 2, 4])],
                         ids=["MultiBinary", "MultiDiscrete"])
def test_env_receives_its_own_dtype_from_int64_actions(make_env, space):
    env = make_env(DTYPE_PROBE, action_space=space)
    first = env.reset()
    assert first.prev_action.shape == (2, 3) and first.prev_action.dtype == torch.int64
    action = torch.tensor([[1, 0, 1], [0, 1, 1]], dtype=torch.int64)
    assert env.step(action).reward.tolist() == [1.0, 1.0]
    random = env.random_action()
    assert random.shape == (2, 3) and random.dtype == torch.int64
    assert env.step(random).reward.tolist() == [1.0, 1.0]


def test_wrong_shape_and_float_actions_are_one_line(make_env):
    env = make_env("alfish/MatchSubActions-v0")
    env.reset()
    with pytest.raises(ValueError, match=r"^action has shape \[2\] but env 'alfish/MatchSubActions-v0' "
                                         r"\(MultiDiscrete\(\[3 2 4\]\)\) with 2 envs expects \[2, 3\]$"):
        env.step(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^action has dtype torch.float32 but .* expects an integer dtype"):
        env.step(torch.zeros(2, 3))


def test_match_sub_actions_rewards_the_fraction_right(make_env):
    env = make_env("alfish/MatchSubActions-v0", num_envs=1)
    obs = env.reset().observation[0]
    target = [int(part.argmax()) for part in torch.split(obs, [3, 2, 4])]
    wrong_last = target[:2] + [(target[2] + 1) % 4]
    assert env.step(torch.tensor([wrong_last])).reward.tolist() == pytest.approx([2 / 3])


@pytest.mark.parametrize("space, dtype, shape", [
    (gym.spaces.Discrete(3), torch.int64, ()),
    (gym.spaces.MultiDiscrete([3, 2]), torch.int64, (2,)),
    (gym.spaces.MultiBinary(4), torch.int64, (4,)),
    (gym.spaces.Box(-1.0, 1.0, shape=(2, 3), dtype=np.float32), torch.float32, (2, 3)),
])
def test_action_layout_and_the_specs_zero_time_step(space, dtype, shape):
    assert action_layout(space) == (dtype, shape)
    obs = gym.spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
    prev_action = EnvSpec(obs, space, num_envs=5).zero_time_step().prev_action
    assert prev_action.dtype == dtype and prev_action.shape == (5,) + shape
