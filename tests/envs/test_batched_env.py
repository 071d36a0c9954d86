"""BatchedEnv speaks the time-step convention of DESIGN.md §3.5 on real gymnasium envs.

FIRST (reward 0, discount 1, prev_action zeros) / MID / LAST (discount 0 on termination, 1 on truncation), then FIRST
again with the action ignored (next-step autoreset). Expected values are worked out from the envs' rules by hand.
"""
import gymnasium as gym
import numpy as np
import pytest
import torch

import alfish.envs.toy  # noqa: F401  (registers alfish/*)
from alfish.data import nest
from alfish.data.types import StepType
from alfish.envs.batched_env import BatchedEnv, create_environment

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST


@pytest.fixture
def make_env():
    envs = []

    def make(*args, **kwargs):
        env = BatchedEnv(*args, **kwargs)
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()


def one_hot(i, n=5):
    x = [0.0] * n
    x[i] = 1.0
    return x


# ------------------------------------------------------------------------------------------- Chain: termination ---

def test_chain_termination_and_truncation_step_types(make_env):
    """env 0 always moves right: reaches the goal (cell 4) on its 4th step -> LAST, discount 0, reward 1.
    env 1 always moves left: stays in cell 0 and is cut by the 10-step time limit -> LAST, discount 1."""
    env = make_env("alfish/Chain-v0", 2, seed=0)
    assert env.discrete and env.action_shape == () and env.observation_space.shape == (5,)
    action = torch.tensor([1, 0])
    ts = env.reset()
    steps = [ts]
    for _ in range(12):
        steps.append(env.step(action))
    st = torch.stack([s.step_type for s in steps])
    rew = torch.stack([s.reward for s in steps])
    disc = torch.stack([s.discount for s in steps])
    for s in steps:
        assert s.env_id.tolist() == [0, 1]
        assert s.step_type.dtype == torch.int8 and s.reward.dtype == torch.float32
        assert s.observation.dtype == torch.float32 and s.observation.shape == (2, 5)
    # env 0: reset FIRST; steps 1-3 MID (-0.1); step 4 LAST (goal, +1, discount 0); step 5 FIRST (autoreset: reward 0,
    # the action is ignored, cell 0); steps 6-8 MID; step 9 LAST; step 10 FIRST; steps 11, 12 MID.
    assert st[:, 0].tolist() == [F, M, M, M, L, F, M, M, M, L, F, M, M]
    assert rew[:, 0].tolist() == pytest.approx([0, -.1, -.1, -.1, 1, 0, -.1, -.1, -.1, 1, 0, -.1, -.1])
    assert disc[:, 0].tolist() == [1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1]
    assert [s.observation[0].tolist() for s in steps[:7]] == [one_hot(i) for i in (0, 1, 2, 3, 4, 0, 1)]
    # env 1: reset FIRST, 9 MID steps, the 10th step is LAST by the time limit with discount 1, then FIRST.
    assert st[:, 1].tolist() == [F] + [M] * 9 + [L, F, M]
    assert rew[:, 1].tolist() == pytest.approx([0] + [-.1] * 10 + [0, -.1])
    assert disc[:, 1].tolist() == [1] * 13
    assert all(s.observation[1].tolist() == one_hot(0) for s in steps)
    # prev_action is the action that led here, and zeros at FIRST (the action given at LAST was not taken).
    assert steps[0].prev_action.tolist() == [0, 0]
    assert steps[1].prev_action.tolist() == [1, 0]
    assert steps[5].prev_action.tolist() == [0, 0]  # env 0 FIRST after LAST: zero although action 1 was given
    assert steps[11].prev_action.tolist() == [1, 0]  # env 1 FIRST -> 0 (it was 0 anyway); env 0 MID -> 1
    assert steps[10].prev_action.tolist() == [0, 0]  # env 0 FIRST, env 1 LAST (its action 0 led there)


# ------------------------------------------------------------------------------------------ PointGoal: truncation ---

def test_point_goal_truncation_has_discount_one(make_env):
    """Action -1 every step: x_k = 0.8 - 0.25 k, reward -|x_k|; the 10-step time limit gives LAST with discount 1."""
    env = make_env("alfish/PointGoal-v0", 1, seed=3)
    assert not env.discrete and env.action_shape == (1,)
    steps = [env.reset()] + [env.step(torch.full((1, 1), -1.0)) for _ in range(11)]
    assert [int(s.step_type) for s in steps] == [F] + [M] * 9 + [L, F]
    assert [float(s.discount) for s in steps] == [1.0] * 12
    xs = [0.8 - 0.25 * k for k in range(1, 11)]  # 0.55, 0.30, 0.05, -0.20, ..., -1.70
    assert [float(s.observation) for s in steps[1:11]] == pytest.approx(xs, abs=1e-6)
    assert [float(s.reward) for s in steps[1:11]] == pytest.approx([-abs(x) for x in xs], abs=1e-6)
    assert float(steps[11].reward) == 0.0 and float(steps[11].observation) == pytest.approx(0.8)
    assert float(steps[11].prev_action) == 0.0


def test_out_of_bounds_box_action_moves_as_the_bound(make_env):
    # x = 0.8 + 0.25 * clip(a, -1, 1): a = 7 -> 1.05 ; a = -0.5 -> 0.675
    env = make_env("alfish/PointGoal-v0", 2, seed=0)
    env.reset()
    ts = env.step(torch.tensor([[7.0], [-0.5]]))
    assert ts.observation[:, 0].tolist() == pytest.approx([1.05, 0.675])


# ------------------------------------------------------------------------------ classic control: real gymnasium ---

def test_cartpole_matches_plain_gymnasium_env_through_termination_and_autoreset(make_env):
    """Every step of BatchedEnv equals a plain gym.make('CartPole-v1') seeded the same way (env i: seed + i), with
    terminated -> LAST/discount 0 and the plain env's reset() -> FIRST/reward 0."""
    seed, n = 11, 2
    env = make_env("CartPole-v1", n, seed=seed)
    plain = [gym.make("CartPole-v1") for _ in range(n)]
    try:
        ts = env.reset()
        expected_obs = [p.reset(seed=seed + i)[0] for i, p in enumerate(plain)]
        assert np.allclose(ts.observation.numpy(), np.stack(expected_obs))
        pending_reset = [False] * n
        saw = {"term": 0, "first_after": 0}
        for _ in range(40):  # pushing left always: the pole falls in ~10 steps, several episodes each
            ts = env.step(torch.zeros(n, dtype=torch.int64))
            for i, p in enumerate(plain):
                if pending_reset[i]:
                    obs, _ = p.reset()
                    exp_type, exp_rew, exp_disc = F, 0.0, 1.0
                    pending_reset[i] = False
                    saw["first_after"] += 1
                else:
                    obs, rew, term, trunc, _ = p.step(0)
                    assert not trunc
                    exp_type, exp_rew = (L if term else M), rew
                    exp_disc = 0.0 if term else 1.0
                    pending_reset[i] = term
                    saw["term"] += int(term)
                assert int(ts.step_type[i]) == exp_type
                assert float(ts.reward[i]) == exp_rew
                assert float(ts.discount[i]) == exp_disc
                assert np.allclose(ts.observation[i].numpy(), obs)
        assert saw["term"] >= 4 and saw["first_after"] >= 3
    finally:
        for p in plain:
            p.close()


def test_pendulum_is_truncated_at_200_steps_with_discount_one(make_env):
    env = make_env("Pendulum-v1", 1, seed=0)
    env.reset()
    steps = [env.step(torch.zeros(1, 1)) for _ in range(201)]
    assert [int(s.step_type) for s in steps] == [M] * 199 + [L, F]
    assert all(float(s.discount) == 1.0 for s in steps)  # truncation is never a termination


# ---------------------------------------------------------------------------------------------- action errors ---

def step_error(env, action) -> str:
    with pytest.raises(ValueError) as info:
        env.step(action)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_wrong_action_shape_names_both_shapes(make_env):
    chain = make_env("alfish/Chain-v0", 2, seed=0)
    chain.reset()
    assert step_error(chain, torch.zeros(3, dtype=torch.int64)) == (
        "action has shape [3] but env 'alfish/Chain-v0' (Discrete(2)) with 2 envs expects [2]")
    assert step_error(chain, torch.zeros(2, 1, dtype=torch.int64)) == (
        "action has shape [2, 1] but env 'alfish/Chain-v0' (Discrete(2)) with 2 envs expects [2]")
    point = make_env("alfish/PointGoal-v0", 2, seed=0)
    point.reset()
    message = step_error(point, torch.zeros(2))
    assert message.startswith("action has shape [2] but env 'alfish/PointGoal-v0' (Box(")
    assert message.endswith(") with 2 envs expects [2, 1]")


def test_wrong_action_dtype_names_both_dtypes(make_env):
    chain = make_env("alfish/Chain-v0", 2, seed=0)
    chain.reset()
    assert step_error(chain, torch.zeros(2)) == (
        "action has dtype torch.float32 but env 'alfish/Chain-v0' (Discrete(2)) expects an integer dtype "
        "(e.g. torch.int64)")
    point = make_env("alfish/PointGoal-v0", 2, seed=0)
    point.reset()
    message = step_error(point, torch.zeros(2, 1, dtype=torch.int64))
    assert message.startswith("action has dtype torch.int64 but env 'alfish/PointGoal-v0' (Box(")
    assert message.endswith(" expects a floating dtype (e.g. torch.float32)")


def test_numpy_action_of_right_shape_is_accepted_or_named_as_wrong_type(make_env):
    point = make_env("alfish/PointGoal-v0", 2, seed=0)
    point.reset()
    try:
        ts = point.step(np.zeros((2, 1), dtype=np.float32))
    except ValueError as err:
        message = str(err)
        assert "ndarray" in message or "Tensor" in message, message
    else:
        assert ts.observation[:, 0].tolist() == pytest.approx([0.8, 0.8])


def test_unknown_vectorization_is_a_value_error():
    with pytest.raises(ValueError, match=r"vectorization='threads' is not one of \('sync', 'async', 'envpool'\)"):
        create_environment(env_name="alfish/Chain-v0", vectorization="threads")


# ---------------------------------------------------------------------------------------------- sync vs async ---

@pytest.mark.timeout(60)
def test_async_gives_the_same_time_steps_as_sync(make_env):
    """Same seed, same actions: AsyncVectorEnv (subprocess workers) reproduces SyncVectorEnv step for step."""
    gen = torch.Generator().manual_seed(5)
    actions = [torch.randint(0, 2, (3,), generator=gen) for _ in range(40)]
    runs = []
    for vectorization in ("sync", "async"):
        env = make_env("CartPole-v1", 3, seed=21, vectorization=vectorization, step_timeout_s=20.0)
        steps = [env.reset()] + [env.step(a) for a in actions]
        env.close()
        runs.append(steps)
    assert any(int(s.step_type[i]) == L for s in runs[0] for i in range(3))  # episodes did end on the way
    for s_sync, s_async in zip(*runs):
        for field in s_sync._fields:
            sync_leaves, async_leaves = nest.flatten(getattr(s_sync, field)), nest.flatten(getattr(s_async, field))
            assert len(sync_leaves) == len(async_leaves), field
            assert all(torch.equal(a, b) for a, b in zip(sync_leaves, async_leaves)), field


def test_dict_observations_come_back_as_dicts_of_tensors():
    env = create_environment(env_name="alfish/BitFlipping-v0", env_kwargs={"num_bits": 5},
                             num_parallel_environments=3, seed=4)
    first = env.reset()
    assert set(first.observation) == {"observation", "achieved_goal", "desired_goal"}
    assert all(v.shape == (3, 5) and v.dtype == torch.float32 for v in first.observation.values())
    assert torch.equal(first.observation["observation"], first.observation["achieved_goal"])
    assert bool((first.observation["achieved_goal"] != first.observation["desired_goal"]).any(-1).all())
    before = first.observation["achieved_goal"].clone()
    after = env.step(torch.tensor([0, 1, 4])).observation["achieved_goal"]
    assert (after != before).sum(-1).tolist() == [1, 1, 1]  # each action flipped exactly one bit
    env.close()


class _Uint8Frames(gym.Env):
    observation_space = gym.spaces.Box(0, 255, shape=(2, 2), dtype=np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full((2, 2), 200, dtype=np.uint8), {}

    def step(self, action):
        return np.full((2, 2), 7, dtype=np.uint8), 0.0, False, False, {}


def test_integer_observations_keep_their_dtype():
    if "alfish-test/Uint8Frames-v0" not in gym.registry:
        gym.register(id="alfish-test/Uint8Frames-v0", entry_point=_Uint8Frames, max_episode_steps=5)
    env = create_environment(env_name="alfish-test/Uint8Frames-v0", num_parallel_environments=2)
    obs = env.reset().observation
    assert obs.dtype == torch.uint8 and int(obs[0, 0, 0]) == 200  # stored compactly; ImageScaleTransformer scales
    env.close()
