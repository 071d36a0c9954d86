"""Mixed actions at the env boundary (alfish/envs/mixed_actions.py): a Tuple or Dict of one Discrete and one Box
reaches alfish as one packed float vector ``[1 + d]``, each env gets back the Tuple or Dict its space holds, uniform
random packed actions are uniform choices, the episode log keeps packed actions, and any other composition is one
``EnvContractError`` line. Also the toy env's known optimum."""
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import alfish.envs.toy  # noqa: F401  (registers alfish/*)
from alfish.envs.batched_env import BatchedEnv
from alfish.envs.contract import EnvContractError
from alfish.envs.mixed_actions import MixedActionBox, choice_of
from alfish.envs.mixed_toy import MatchChoiceAndValue
from alfish.envs.spec import action_layout

PROBE = "alfish-test/MixedActionProbe-v0"
BOX = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 4.0], np.float32))
TUPLE = gym.spaces.Tuple((gym.spaces.Discrete(4), BOX))
DICT = gym.spaces.Dict({"move": BOX, "tool": gym.spaces.Discrete(4)})


class MixedActionProbe(gym.Env):
    """Its observation is the last action it received, flattened as ``[choice, *box]`` (-1s before the first)."""

    metadata = {"render_modes": []}

    def __init__(self, action_space: gym.Space, render_mode: Any = None):
        self.render_mode, self.action_space = render_mode, action_space
        self.observation_space = gym.spaces.Box(-10.0, 10.0, shape=(3,), dtype=np.float32)
        self.received: list = []

    def reset(self, *, seed: Any = None, options: Any = None):
        super().reset(seed=seed)
        return np.full(3, -1.0, np.float32), {}

    def step(self, action: Any):
        assert self.action_space.contains(action), action  # the right container, dtypes, shapes and bounds
        choice, box = (action[0], action[1]) if isinstance(action, tuple) else (action["tool"], action["move"])
        return np.concatenate([[float(choice)], box]).astype(np.float32), 0.0, False, False, {}


if PROBE not in gym.registry:
    gym.register(id=PROBE, entry_point=MixedActionProbe)


@pytest.mark.parametrize("space", [TUPLE, DICT], ids=["Tuple", "Dict"])
def test_packed_actions_reach_each_env_as_its_own_tuple_or_dict(space):
    env = BatchedEnv(PROBE, 2, 0, env_kwargs={"action_space": space})
    try:
        assert isinstance(env.action_space, MixedActionBox) and env.action_space.original == space
        assert action_layout(env.action_space) == (torch.float32, (3,)) and env.action_shape == (3,)
        env.reset()
        packed = torch.tensor([[3.0, -0.5, 2.5], [0.0, 1.0, 0.0]])
        step = env.step(packed)
        assert torch.equal(step.observation, packed)  # the env got (3, [-0.5, 2.5]) and (0, [1, 0])
        assert torch.equal(step.prev_action, packed)
        # out-of-bounds values are clipped, as Box actions are: the choice to 0..n-1, the Box part to its bounds
        step = env.step(torch.tensor([[7.0, -3.0, 9.0], [-2.0, 0.25, 1.0]]))
        assert torch.equal(step.observation, torch.tensor([[3.0, -1.0, 4.0], [0.0, 0.25, 1.0]]))
        logged = env.resume_states()[0]["actions"]
        assert logged.shape == (2, 3) and logged.dtype == np.float32  # the episode log keeps the packed form
    finally:
        env.close()


def test_unpack_and_pack_are_inverse_and_rounding_is_the_algorithms():
    space = MixedActionBox(DICT)
    action = space.unpack(np.array([2.4, 0.5, 3.0], np.float32))
    assert action["tool"] == 2 and action["tool"].dtype == np.int64 and np.array_equal(action["move"], [0.5, 3.0])
    assert list(action) == ["move", "tool"]  # the space's own key order
    assert np.array_equal(space.pack_one(action), [2.0, 0.5, 3.0])
    assert space.low[0] == -0.5 and space.high[0] == 3.5 and np.array_equal(space.high[1:], [1.0, 4.0])
    packed = torch.tensor([[-0.5, 0, 0], [0.49, 0, 0], [0.5, 0, 0], [2.51, 0, 0], [3.5, 0, 0]])
    assert choice_of(packed, 4).tolist() == [0, 0, 1, 3, 3]
    assert [space.unpack(row.numpy())["tool"] for row in packed] == [0, 0, 1, 3, 3]  # the env reads the same


def test_uniform_random_packed_actions_are_uniform_choices():
    env = BatchedEnv(PROBE, 1, 0, env_kwargs={"action_space": TUPLE})
    try:
        env.reset()
        draws = torch.cat([env.random_action() for _ in range(4000)])
    finally:
        env.close()
    freq = torch.bincount(choice_of(draws, 4), minlength=4).float() / len(draws)
    assert torch.allclose(freq, torch.full((4,), 0.25), atol=0.03), freq  # the end choices are not halved


@pytest.mark.parametrize("space", [
    gym.spaces.Tuple((gym.spaces.Box(-1, 1, (1,)), gym.spaces.Box(-1, 1, (1,)))),
    gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3))),
    gym.spaces.Tuple((gym.spaces.Discrete(2), BOX, gym.spaces.Discrete(3))),
    gym.spaces.Dict({"a": gym.spaces.MultiDiscrete([2, 2]), "b": BOX}),
], ids=["two-boxes", "two-discretes", "three-parts", "multi-discrete"])
def test_other_compositions_are_one_contract_error_line(space):
    with pytest.raises(EnvContractError) as err:
        BatchedEnv(PROBE, 1, 0, env_kwargs={"action_space": space})
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"env '{PROBE}' has action space {type(space).__name__}(")
    assert message.endswith("and mixed ones: a gymnasium Tuple or Dict of exactly one Discrete and one Box part")


def test_each_part_is_checked_as_a_lone_one():
    bad_box = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-np.inf, np.inf, (1,))))
    with pytest.raises(EnvContractError, match="infinite bounds"):
        BatchedEnv(PROBE, 1, 0, env_kwargs={"action_space": bad_box})
    shifted = gym.spaces.Tuple((gym.spaces.Discrete(2, start=1), BOX))
    with pytest.raises(EnvContractError, match="discrete actions are 0..n-1"):
        BatchedEnv(PROBE, 1, 0, env_kwargs={"action_space": shifted})


@pytest.mark.parametrize("env_name", ["alfish/MatchChoiceAndValue-v0", "alfish/MatchChoiceAndValueDict-v0"])
def test_toy_env_answering_the_target_earns_the_optimum(env_name):
    env = BatchedEnv(env_name, 3, 0)
    try:
        step, total = env.reset(), torch.zeros(3)
        for _ in range(3):
            obs = step.observation
            answer = torch.stack([obs[:, :3].argmax(-1).float(), obs[:, 3]], -1)
            step = env.step(answer)
            total += step.reward
        assert step.step_type.tolist() == [2, 2, 2] and step.discount.tolist() == [0.0, 0.0, 0.0]  # LAST, terminal
        assert torch.allclose(total, torch.full((3,), MatchChoiceAndValue.OPTIMAL_RETURN), atol=1e-6)
        step = env.step(torch.zeros(3, 2))  # (the autoreset step)
        obs = step.observation
        step = env.step(torch.stack([obs[:, :3].argmax(-1).float(), -obs[:, 3]], -1))
        assert torch.allclose(step.reward, 1.0 - 2 * obs[:, 3].abs(), atol=1e-6)  # the right class, minus |v - target|
    finally:
        env.close()


def test_an_episode_just_begun_resumes_exactly():
    # Its action log is empty, ``zeros((0, 1 + d))``, whose numpy strides are (0, 0): not a broadcast array (this
    # was once refused as damaged, for every action of more than one number: packed mixed actions, Multi*)
    env = BatchedEnv("alfish/MatchChoiceAndValue-v0", 2, 0)
    again = BatchedEnv("alfish/MatchChoiceAndValue-v0", 2, 5)
    try:
        first = env.reset()
        states = env.resume_states()
        assert states[0]["actions"].shape == (0, 2)
        assert again.restore(states, np.zeros(2, dtype=bool)) == [True, True]
        step = again.step(torch.tensor([[0.0, 0.0], [1.0, 0.5]]))
        assert torch.equal(env.step(torch.tensor([[0.0, 0.0], [1.0, 0.5]])).reward, step.reward)
        assert first.observation.shape == (2, 4)
    finally:
        env.close()
        again.close()
