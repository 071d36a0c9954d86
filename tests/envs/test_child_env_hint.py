"""An env a notebook or a script registers in its own code is unknown in the run's spawned children (the async
evaluator, unroll processes): their error says where to register it instead of only gymnasium's "not found"."""
import multiprocessing

import gymnasium as gym
import pytest

from alfish.envs.factory import EnvFactory


def _make_in_child(name, replies):
    try:
        EnvFactory.here(name, {}, None)()
    except ValueError as err:
        replies.put(str(err))
    else:
        replies.put("made")


def _register_here(env_id):
    gym.register(id=env_id, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv")


def test_an_env_registered_only_in_the_parent_gets_the_hint_in_a_spawned_child():
    env_id = "alfish-test/NotebookOnly-v0"
    _register_here(env_id)  # as a notebook cell would: in this process only
    try:
        ctx = multiprocessing.get_context("spawn")
        replies = ctx.Queue()
        child = ctx.Process(target=_make_in_child, args=(env_id, replies))
        child.start()
        message = replies.get(timeout=60)
        child.join(timeout=30)
    finally:
        gym.registry.pop(env_id, None)
    assert message.startswith(f"cannot make gymnasium env '{env_id}': ")
    assert message.endswith("register it in a module the conf imports instead (a line `import my_envs`: this child "
                            "process of the run knows only those)")


def test_in_the_trainer_process_an_unknown_env_has_no_child_hint():
    with pytest.raises(ValueError, match=r"^cannot make gymnasium env 'alfish-test/Nowhere-v0'") as raised:
        EnvFactory.here("alfish-test/Nowhere-v0", {}, None)()
    assert "child process" not in str(raised.value)
