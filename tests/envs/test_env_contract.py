"""Env contract checks at the batched-env boundary: each misbehaving env (tests/envs/misbehaving_envs.py) gives one
``EnvContractError`` line naming the env, the field, what was expected and what came; tolerated variants (another
float width, a numpy scalar reward, a 0-d reward array, a list observation) pass and are cast. Most run in-process
(``sync``); the last tests show the same one line under ``vectorization='async'``, where the check runs in the worker
before gymnasium's shared-memory batching would silently cast the observation.
"""
import logging
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.envs.batched_env import BatchedEnv
from alfish.envs.contract import EnvContractError

from . import misbehaving_envs
from .misbehaving_envs import BOX3

SCRIPTED = "alfish-test/Scripted-v0"
FIX_STEP = "fix the env's observation_space or its step()"
FIX_RESET = "fix the env's observation_space or its reset()"
U8 = gym.spaces.Box(0, 255, shape=(2, 2), dtype=np.uint8)
DICT = gym.spaces.Dict({"a": BOX3, "b": gym.spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)})


@pytest.fixture
def make_env():
    envs = []

    def make(vectorization="sync", num_envs=2, env_name=SCRIPTED, **env_kwargs):
        env = BatchedEnv(env_name, num_envs, seed=0, vectorization=vectorization, env_kwargs=env_kwargs,
                         step_timeout_s=30.0)
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()


def run(env, steps=3):
    """reset, then ``steps`` steps with action 0; returns the last TimeStep."""
    ts = env.reset()
    for _ in range(steps):
        ts = env.step(torch.zeros(env.num_envs, dtype=torch.int64))
    return ts


def contract_error(make_env, steps=3, **env_kwargs) -> str:
    with pytest.raises(EnvContractError) as info:
        run(make_env(**env_kwargs), steps)
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------------------------- observations ---

def test_integer_observation_from_a_float_box_names_both_dtypes(make_env):
    assert contract_error(make_env, step_obs=np.zeros(3, np.int64)) == (
        f"env '{SCRIPTED}' returned observation of dtype int64 from step(), expected float32 (or another float dtype) "
        f"(its observation_space is Box(-1.0, 1.0, (3,), float32)); {FIX_STEP}")


def test_float_observation_from_a_uint8_box_is_refused_at_the_first_reset(make_env):
    assert contract_error(make_env, observation_space=U8, reset_obs=np.zeros((2, 2))) == (
        f"env '{SCRIPTED}' returned observation of dtype float64 from reset(), expected uint8 (or another unsigned "
        f"integer dtype) (its observation_space is Box(0, 255, (2, 2), uint8)); {FIX_RESET}")
    assert "returned observation of dtype int32 from step(), expected uint8 (or another unsigned integer dtype)" in \
        contract_error(make_env, observation_space=U8, step_obs=np.zeros((2, 2), np.int32))


def test_wrong_observation_shape_at_reset_names_both_shapes(make_env):
    assert contract_error(make_env, reset_obs=np.zeros(4, np.float32)) == (
        f"env '{SCRIPTED}' returned observation of shape [4] from reset(), expected shape [3] (its observation_space "
        f"is Box(-1.0, 1.0, (3,), float32)); {FIX_RESET}")


def test_wrong_observation_shape_long_after_the_first_step_is_still_caught(make_env):
    env = make_env(step_obs=np.zeros((3, 1), np.float32), bad_from_step=40)
    env.reset()
    for _ in range(39):
        env.step(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(EnvContractError, match=re.escape("returned observation of shape [3, 1] from step(), expected "
                                                         "shape [3]")):
        env.step(torch.zeros(2, dtype=torch.int64))


@pytest.mark.parametrize("obs, message", [
    ("abc", "returned observation of type str from step(), expected a numpy array of dtype float32 and shape [3]"),
    (None, "returned observation of type NoneType from step(), expected a numpy array of dtype float32 and shape "
           "[3]"),
    ({"a": np.zeros(3)}, "returned observation of type dict from step(), expected a numpy array"),
    ([1.0, [2.0]], "returned observation of type list from step(), expected a numpy array"),
])
def test_observation_that_is_not_an_array_names_its_type(make_env, obs, message):
    assert f"env '{SCRIPTED}' {message}" in contract_error(make_env, step_obs=obs)


def test_other_widths_of_the_same_kind_and_lists_are_accepted_and_cast(make_env):
    # float64 from a float32 Box (common: numpy math in float64) -> float32 tensors
    ts = run(make_env(reset_obs=np.full(3, 0.5), step_obs=np.full(3, 0.25)))
    assert ts.observation.dtype == torch.float32 and ts.observation.tolist() == [[0.25] * 3] * 2
    # uint16 from a uint8 Box -> uint8 (values are not checked against the bounds)
    ts = run(make_env(observation_space=U8, step_obs=np.full((2, 2), 7, np.uint16)))
    assert ts.observation.dtype == torch.uint8 and int(ts.observation[1, 1, 1]) == 7
    # a list of floats
    assert run(make_env(step_obs=[0.5, 0.5, 0.5])).observation.tolist() == [[0.5] * 3] * 2


def test_dict_observation_with_missing_and_extra_keys_names_them(make_env):
    obs = {"a": np.zeros(3, np.float32), "c": np.zeros(2, np.float32)}
    assert contract_error(make_env, observation_space=DICT, reset_obs=obs) == (
        f"env '{SCRIPTED}' returned observation with keys ['a', 'c'] from reset() (missing ['b']; unexpected ['c']), "
        f"expected exactly ['a', 'b'] (its observation_space is {DICT}); {FIX_RESET}")


def test_dict_observation_leaf_and_non_dict_are_named(make_env):
    obs = {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float32)}
    assert contract_error(make_env, observation_space=DICT, step_obs=obs) == (
        f"env '{SCRIPTED}' returned observation['b'] of shape [3] from step(), expected shape [2] (its "
        f"observation_space['b'] is Box(0.0, 1.0, (2,), float32)); {FIX_STEP}")
    assert contract_error(make_env, observation_space=DICT, step_obs=np.zeros(3, np.float32)) == (
        f"env '{SCRIPTED}' returned observation of type ndarray from step(), expected a dict with keys ['a', 'b'] "
        f"(its observation_space is {DICT}); {FIX_STEP}")


# ----------------------------------------------------------------------------------------------- reward, flags ---

@pytest.mark.parametrize("reward, bad_from_step, shown", [
    (float("nan"), 1, "nan"), (np.float32("inf"), 1, "inf"), (-np.inf, 25, "-inf")])
def test_non_finite_reward_is_refused_on_any_step(make_env, reward, bad_from_step, shown):
    assert contract_error(make_env, steps=bad_from_step, reward=reward, bad_from_step=bad_from_step) == (
        f"env '{SCRIPTED}' returned reward {shown} from step(), expected a finite number (one NaN or infinite reward "
        "poisons every value estimate); fix the env's step()")


@pytest.mark.parametrize("reward, shown", [
    (np.array([1.0]), "array([1.]) (type ndarray, shape [1])"),
    (None, "None (type NoneType)"),
    ("1.0", "'1.0' (type str)"),
])
def test_reward_that_is_not_a_number_names_its_type(make_env, reward, shown):
    assert contract_error(make_env, reward=reward) == (
        f"env '{SCRIPTED}' returned reward {shown} from step(), expected a number (a Python or numpy scalar); fix the "
        "env's step()")


@pytest.mark.parametrize("reward", [np.float32(0.5), np.array(0.5), 1, np.int16(1), np.float16(0.5), True])
def test_numeric_scalar_rewards_of_any_kind_are_accepted(make_env, reward):
    assert run(make_env(reward=reward)).reward.tolist() == [float(reward)] * 2


@pytest.mark.parametrize("field, value, shown", [
    ("terminated", 0, "0 (type int)"), ("truncated", None, "None (type NoneType)"),
    ("terminated", np.array([True]), "array([ True]) (type ndarray)")])
def test_done_flags_must_be_bools(make_env, field, value, shown):
    assert contract_error(make_env, **{field: value}) == (
        f"env '{SCRIPTED}' returned {field} {shown} from step(), expected a bool; fix the env's step()")


def test_numpy_bools_are_accepted(make_env):
    ts = run(make_env(terminated=np.bool_(True)), steps=1)
    assert ts.discount.tolist() == [0.0, 0.0]


def test_old_gym_api_returns_are_named(make_env):
    assert contract_error(make_env, reset_result=np.zeros(3, np.float32)) == (
        f"env '{SCRIPTED}' returned array([0., 0., 0.], dtype=float32) from reset(), expected a tuple (observation, "
        "info) as gymnasium >= 0.26 requires; fix the env's reset()")
    assert contract_error(make_env, step_result=(np.zeros(3, np.float32), 0.0, False, {})) == (
        f"env '{SCRIPTED}' returned 4 values from step(), expected the 5 values (observation, reward, terminated, "
        "truncated, info) gymnasium >= 0.26 requires; fix the env's step()")


# ------------------------------------------------------------------------------------------------------ spaces ---

def space_error(make_env, **env_kwargs) -> str:
    with pytest.raises(EnvContractError) as info:
        make_env(**env_kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unbounded_box_action_space_names_the_fix(make_env):
    space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
    assert space_error(make_env, action_space=space) == (
        f"env '{SCRIPTED}' has action space Box(-inf, inf, (2,), float32) with infinite bounds; alfish scales "
        "continuous actions into the bounds, so they must be finite: give the env's action_space the finite low/high "
        "its actions really have (a gymnasium.ActionWrapper can; gymnasium.wrappers.RescaleAction and ClipAction keep "
        "infinite bounds)")
    half = gym.spaces.Box(np.array([0.0, -1.0], np.float32), np.array([np.inf, 1.0], np.float32), dtype=np.float32)
    assert "with infinite bounds" in space_error(make_env, action_space=half)


@pytest.mark.parametrize("space, message", [
    (gym.spaces.Discrete(3, start=1), "has action space Discrete(3, start=1); alfish's discrete actions are 0..n-1: "
                                      "give the env's action_space start=0 (a gymnasium.ActionWrapper that adds 1 to "
                                      "the action does it)"),
    (gym.spaces.Box(0, 3, shape=(2,), dtype=np.int64), "has action space Box(0, 3, (2,), int64) of dtype int64; "
                                                       "alfish drives Box actions as floats: give the env a float Box "
                                                       "(or a Discrete for a few choices)"),
    (gym.spaces.MultiDiscrete([[3, 3], [2, 2]]), "has action space MultiDiscrete([[3 3] [2 2]]) of shape (2, 2); "
                                                 "alfish drives MultiDiscrete actions as one vector of sub-actions: "
                                                 "give it a 1-D shape"),
    (gym.spaces.MultiBinary([2, 2]), "has action space MultiBinary((2, 2)) of shape (2, 2); alfish drives MultiBinary "
                                     "actions as one vector"),
    (gym.spaces.MultiDiscrete([3, 3], start=[1, 0]), "has action space MultiDiscrete([3 3], start=[1 0]) with "
                                                     "start=[1, 0]; alfish's discrete sub-actions are 0..n-1"),
    (gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(2))), "has action space Tuple(Discrete(2), "
                                                                         "Discrete(2)); alfish supports Box, "
                                                                         "Discrete, MultiDiscrete and MultiBinary "
                                                                         "actions (wrap the env in a gymnasium."
                                                                         "ActionWrapper whose action_space is one "
                                                                         "of them)"),
])
def test_action_spaces_alfish_cannot_drive_are_named(make_env, space, message):
    assert space_error(make_env, action_space=space).startswith(f"env '{SCRIPTED}' {message}")


def test_observation_space_that_is_not_a_box_is_named(make_env):
    assert space_error(make_env, observation_space=gym.spaces.Discrete(4)) == (
        f"env '{SCRIPTED}' has observation space Discrete(4); alfish supports Box observations and Dicts of Boxes "
        "(wrap the env, e.g. gymnasium.wrappers.FlattenObservation)")


# ----------------------------------------------------------------------------------------------------- async ---

@pytest.mark.timeout(60)
def test_async_workers_give_the_same_one_line_errors(make_env):
    """The check runs in each worker: without it the float observation would be cast into the uint8 shared memory
    without a word, and a wrong shape would be a numpy broadcast error with the worker's traceback."""
    env_name = misbehaving_envs.ids(SCRIPTED)
    with pytest.raises(EnvContractError) as info:
        run(make_env("async", env_name=env_name, observation_space=U8, step_obs=np.full((2, 2), 7.0), bad_from_step=2))
    assert str(info.value) == (
        f"env '{env_name}' returned observation of dtype float64 from step(), expected uint8 (or another unsigned "
        f"integer dtype) (its observation_space is Box(0, 255, (2, 2), uint8)); {FIX_STEP}")
    with pytest.raises(EnvContractError) as info:
        run(make_env("async", env_name=env_name, reward=float("nan"), bad_from_step=2))
    assert str(info.value).startswith(f"env '{env_name}' returned reward nan from step(), expected a finite number")


# ------------------------------------------------------------------------------------------- dtype casts ---

@pytest.fixture
def fresh_warnings(monkeypatch):
    from alfish.envs import contract

    monkeypatch.setattr(contract, "_warned", set())  # (an earlier test may have given the same warning)


def test_a_cast_observation_warns_once_for_the_whole_batch(make_env, fresh_warnings, caplog):
    with caplog.at_level(logging.WARNING):
        ts = run(make_env(num_envs=3, reset_obs=np.full(3, 0.5), step_obs=np.full(3, 0.25)), steps=5)
    assert ts.observation.dtype == torch.float32
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [f"env '{SCRIPTED}' returns observation of dtype float64 from reset() but its observation_space "
                        f"is {BOX3}: alfish casts it to float32 (warned once for all its envs); return float32 arrays, "
                        "or declare the space's dtype as float64"]


def test_a_narrowing_integer_cast_is_checked_on_every_observation(make_env, fresh_warnings, caplog):
    int8 = gym.spaces.Box(-100, 100, shape=(2,), dtype=np.int8)
    with caplog.at_level(logging.WARNING):
        ts = run(make_env(observation_space=int8, step_obs=np.array([5, -7], np.int16)))
    assert ts.observation.tolist() == [[5, -7]] * 2 and len(caplog.records) == 1
    # a value that int8 cannot hold, after int16 values that fit (from reset): refused (a cast would wrap 300 to 44)
    message = contract_error(make_env, steps=4, observation_space=int8, reset_obs=np.array([1, 2], np.int16),
                             step_obs=np.array([5, 300], np.int16), bad_from_step=3)
    assert message == (f"env '{SCRIPTED}' returned observation of dtype int16 with values in [5, 300] from step(), "
                       f"expected values that fit int8 ([-128, 127]: a cast would wrap them) (its observation_space "
                       f"is {int8}); {FIX_STEP}")


def test_non_integral_floats_into_an_integer_space_are_refused(make_env):
    int8 = gym.spaces.Box(-100, 100, shape=(2,), dtype=np.int8)
    assert "returned observation of dtype float64 from step(), expected int8 (or another integer dtype)" in \
        contract_error(make_env, observation_space=int8, step_obs=np.array([0.5, 1.0]))
