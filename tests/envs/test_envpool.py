"""``create_environment.vectorization = 'envpool'``: EnvPool's pool behind the same TimeStep contract (next-step
autoreset, truncation bootstrapped, seeds per env), Atari names with make_atari's protocol; one-line errors without
EnvPool or with a setting it does not take. Skipped unless ``pip install envpool``."""
import builtins

import numpy as np
import pytest
import torch

from alfish.data.types import StepType
from alfish.envs import create_environment
from alfish.envs.envpool_vector import MISSING, EnvpoolVectorEnv, envpool_task

PONG = "ALE/Pong-v5"


@pytest.fixture
def envpool():
    pytest.importorskip("envpool")


def test_atari_names_get_make_atari_settings_in_envpool_terms():
    task, options = envpool_task(PONG, {"terminal_on_life_loss": True, "screen_size": 64, "max_episode_steps": None})
    assert task == "Pong-v5"
    assert options["episodic_life"] is True and options["img_height"] == options["img_width"] == 64
    assert options["repeat_action_probability"] == 0.25 and options["stack_num"] == 1
    assert options["use_fire_reset"] is False and options["reward_clip"] is False
    assert options["max_episode_steps"] >= 10 ** 9
    with pytest.raises(ValueError, match="env_kwargs 'mode' is not an Atari setting alfish passes to EnvPool"):
        envpool_task(PONG, {"mode": 1})
    assert envpool_task("CartPole-v1", {"x": 1}) == ("CartPole-v1", {"x": 1})


def test_missing_envpool_is_one_line(monkeypatch):
    real_import = builtins.__import__

    def no_envpool(name, *args, **kwargs):
        if name == "envpool":
            raise ImportError("No module named 'envpool'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_envpool)
    with pytest.raises(ImportError, match=f"^{MISSING}$"):
        EnvpoolVectorEnv(PONG, 1, 0)


def test_pong_steps_with_the_timestep_contract(envpool):
    env = create_environment(env_name=PONG, num_parallel_environments=2, vectorization="envpool",
                             env_kwargs={"max_episode_steps": 5})
    try:
        first = env.reset()
        assert first.observation.shape == (2, 1, 84, 84) and first.observation.dtype == torch.uint8
        assert env.action_space.n == 6
        types, discounts = [first.step_type.tolist()], []
        for _ in range(7):
            step = env.step(env.random_action())
            types.append(step.step_type.tolist())
            discounts.append(step.discount.tolist())
        # 5-step cap: steps 1-4 MID, step 5 LAST (truncated: discount 1, bootstrapped), step 6 FIRST (autoreset)
        assert [t[0] for t in types] == [StepType.FIRST] + [StepType.MID] * 4 + [StepType.LAST, StepType.FIRST,
                                                                                 StepType.MID]
        assert discounts[4] == [1.0, 1.0]
    finally:
        env.close()


def trajectory(seed: int, actions: list) -> list:
    env = create_environment(env_name=PONG, num_parallel_environments=2, vectorization="envpool", seed=seed)
    try:
        out = [env.reset().observation]
        out += [env.step(torch.tensor(a)).observation for a in actions]
        return out
    finally:
        env.close()


def test_the_same_seed_replays_the_same_frames(envpool):
    actions = [[i % 6, (3 * i) % 6] for i in range(60)]
    a, b = trajectory(0, actions), trajectory(0, actions)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_reset_with_other_seeds_makes_a_new_pool(envpool):
    env = create_environment(env_name=PONG, num_parallel_environments=1, vectorization="envpool", seed=0)
    try:
        env.reset()
        pool = env._venv._pool
        env.reset(seed=0)
        assert env._venv._pool is pool and env._venv._seeds == [0]
        env.reset(seed=7)
        assert env._venv._pool is not pool and env._venv._seeds == [7]
    finally:
        env.close()


def test_a_render_mode_falls_back_to_gymnasium(envpool):
    pytest.importorskip("ale_py")
    env = create_environment(env_name=PONG, num_parallel_environments=1, vectorization="envpool",
                             render_mode="rgb_array")
    try:
        env.reset()
        assert np.asarray(env.render()[0]).shape == (210, 160, 3)
    finally:
        env.close()


def test_dqn_pong_trains_and_evaluates_on_envpool(envpool, tmp_path):
    from tests.integration.inprocess import CONFS, eval_log, run_trainer_from_text

    conf = f"""include '{CONFS / "dqn_pong.gin"}'
create_environment.vectorization = 'envpool'
create_environment.num_parallel_environments = 2
create_environment.env_kwargs = {{'max_episode_steps': 30}}
TrainerConfig.num_env_steps = 120
TrainerConfig.initial_collect_steps = 40
TrainerConfig.replay_buffer_length = 200
TrainerConfig.eval_interval = 5
TrainerConfig.num_eval_episodes = 2
TrainerConfig.num_eval_environments = 2
TrainerConfig.num_checkpoints = 0
"""
    log = eval_log(run_trainer_from_text(tmp_path, conf))
    assert log and log[-1]["env_steps"] == 120
    assert all(r["average_episode_length"] == 30 for r in log)  # 30-step games, counted whole
