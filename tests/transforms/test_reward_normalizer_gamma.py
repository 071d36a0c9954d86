"""RewardNormalizer.gamma: SB3 VecNormalize's return-based reward scaling, by hand and against SB3 itself."""
import io

import numpy as np
import pytest
import torch

from alfish.data.types import StepType, TimeStep
from alfish.errors import OneLineValueError
from alfish.transforms import RewardNormalizer, RunningMeanStd

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
PRIOR = 1e-4  # SB3's RunningMeanStd starts as 1e-4 values of mean 0 and variance 1


def step(kinds, rewards, discounts=None):
    n = len(kinds)
    return TimeStep(torch.tensor(kinds, dtype=torch.int8), torch.tensor(rewards, dtype=torch.float32),
                    torch.tensor(discounts or [1.0] * n), torch.zeros(n, 1), torch.zeros(n, 1), torch.arange(n))


def run(normalizer, steps, state=None, update_stats=True):
    """The scaled rewards ``[T, B]`` of ``steps`` through one rollout stream, and the stream's last state."""
    out = []
    for kinds, rewards in steps:
        seen, state = normalizer.transform_timestep(step(kinds, rewards), state, update_stats)
        out.append(seen.reward)
    return torch.stack(out), state


def pooled_std(returns, epsilon=1e-8):
    """sqrt(var + eps) of every return seen so far pooled with SB3's prior (1e-4 values of mean 0, variance 1)."""
    values = np.asarray(returns, np.float64)
    count = PRIOR + len(values)
    mean = values.sum() / count
    m2 = PRIOR * (1.0 + mean ** 2) + ((values - mean) ** 2).sum()
    return np.sqrt(m2 / count + epsilon)


# Two envs, gamma 0.5; env 0's episode ends at step 2 (LAST), its FIRST step follows (reward 0, not counted).
STEPS = [([F, F], [0.0, 0.0]), ([M, M], [1.0, 2.0]), ([L, M], [2.0, 2.0]), ([F, M], [0.0, 2.0]),
         ([M, M], [4.0, 2.0])]
# The running returns counted at each step, by hand: ret = 0.5 * ret + reward, restarted after env 0's LAST.
RETURNS_SEEN = [[], [1.0, 2.0], [2.5, 3.0], [3.5], [4.0, 3.75]]


def test_rewards_are_divided_by_the_running_std_of_the_discounted_return_by_hand():
    scaled, state = run(RewardNormalizer(gamma=0.5), STEPS)
    seen_so_far = []
    for t, ((_, rewards), returns) in enumerate(zip(STEPS, RETURNS_SEEN)):
        seen_so_far += returns
        expected = np.clip(np.asarray(rewards) / pooled_std(seen_so_far), -10.0, 10.0)
        np.testing.assert_allclose(scaled[t].numpy(), expected, rtol=1e-6, err_msg=f"step {t}")
    assert state.dtype == torch.float64 and state.tolist() == [4.0, 3.75]  # env 0's return restarted after LAST
    _, state = run(RewardNormalizer(gamma=0.5), STEPS[:3])
    assert state.tolist() == [0.0, 3.0]  # zeroed right after the LAST step (VecNormalize's returns[dones] = 0)


def test_matches_sb3_vec_normalize_fed_the_same_rewards():
    pytest.importorskip("stable_baselines3")
    import gymnasium as gym
    from stable_baselines3.common.vec_env import VecEnv, VecNormalize

    # env 0 terminates and env 1 is truncated at step 3: both are VecNormalize's dones, both restart the return
    rewards = np.array([[0.5, -3.0], [2.0, 1.0], [-1.0, 7.0], [0.25, 0.0], [3.0, -2.0], [1.0, 1.0]], np.float32)
    dones = [False, False, True, False, False, False]

    class Scripted(VecEnv):
        def __init__(self):
            box = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
            super().__init__(2, box, box)
            self.t = 0

        def reset(self):
            return np.zeros((2, 1), np.float32)

        def step_async(self, actions):
            pass

        def step_wait(self):
            reward, done = rewards[self.t], np.full(2, dones[self.t])
            self.t += 1
            return np.zeros((2, 1), np.float32), reward, done, [{}, {}]

        def close(self): pass
        def get_attr(self, name, indices=None): return [None, None]
        def set_attr(self, name, value, indices=None): pass
        def env_method(self, name, *args, indices=None, **kwargs): return [None, None]
        def env_is_wrapped(self, wrapper, indices=None): return [False, False]

    vec = VecNormalize(Scripted(), norm_obs=False, norm_reward=True, gamma=0.9, clip_reward=10.0)
    vec.reset()
    expected = np.stack([vec.step(np.zeros((2, 1), np.float32))[1] for _ in rewards])
    # alfish's stream: FIRST, then the same rewards, with the FIRST step after the episode ends (next-step autoreset)
    kinds = [[M, M]] * len(rewards)
    kinds[2] = [L, L]
    steps = [([F, F], [0.0, 0.0])] + [(k, r.tolist()) for k, r in zip(kinds[:3], rewards[:3])] + [
        ([F, F], [0.0, 0.0])] + [(k, r.tolist()) for k, r in zip(kinds[3:], rewards[3:])]
    scaled, _ = run(RewardNormalizer(gamma=0.9), steps)
    counted = [t for t, (k, _) in enumerate(steps) if k[0] != F]
    np.testing.assert_allclose(scaled[counted].numpy(), expected, rtol=1e-6)
    assert float(vec.ret_rms.count) == pytest.approx(float(RewardNormalizer(gamma=0.9).stats.count) + 2 * len(rewards))


def test_gamma_none_keeps_the_rewards_own_std_and_no_state():
    normalizer = RewardNormalizer()
    scaled, state = run(normalizer, STEPS)
    assert state is None
    reference = RunningMeanStd(())
    for _, rewards in STEPS:  # every step's rewards, FIRST steps' zeros included, no prior
        reference.update(torch.tensor(rewards))
    assert torch.equal(normalizer.stats.count, reference.count) and torch.equal(normalizer.stats.m2, reference.m2)
    last = torch.tensor(STEPS[-1][1]) / torch.sqrt(reference.variance() + 1e-8).float()
    assert torch.equal(scaled[-1], last)


def test_evaluation_neither_moves_the_statistics_nor_keeps_a_state():
    normalizer = RewardNormalizer(gamma=0.99)
    run(normalizer, STEPS[:3])
    before = {k: v.clone() for k, v in normalizer.state_dict().items()}
    scaled, state = run(normalizer, STEPS, update_stats=False)
    assert state is None and all(torch.equal(v, normalizer.state_dict()[k]) for k, v in before.items())
    std = torch.sqrt(normalizer.stats.variance() + 1e-8).float()
    assert torch.equal(scaled[1], torch.tensor(STEPS[1][1]) / std)


def test_resume_continues_the_statistics_and_the_running_returns_exactly():
    whole, _ = run(RewardNormalizer(gamma=0.9), STEPS)
    first = RewardNormalizer(gamma=0.9)
    _, state = run(first, STEPS[:2])
    buffer = io.BytesIO()
    torch.save({"transformer": first.state_dict(), "transform_state": state}, buffer)  # as a checkpoint does
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = RewardNormalizer(gamma=0.9)
    resumed.load_state_dict(saved["transformer"])
    rest, _ = run(resumed, STEPS[2:], saved["transform_state"])
    assert torch.equal(rest, whole[2:])


def test_a_merge_across_ranks_counts_the_prior_once():
    """Two ranks' deltas folded into the prior give the statistics of one process that saw both ranks' returns."""
    ranks = [RewardNormalizer(gamma=0.5), RewardNormalizer(gamma=0.5)]
    for normalizer in ranks:
        normalizer.stats.tracks_rank_deltas = True  # as built inside a multi-rank job
    run(ranks[0], STEPS[:3])
    run(ranks[1], STEPS[3:])
    deltas = [n.stats.delta_vector() for n in ranks]
    ranks[0].stats.fold_rank_deltas(deltas)
    # rank 1's stream starts with no state: its env 1 (MID) counts 2, then 0.5 * 2 + 2; its env 0 restarts at FIRST
    returns = [1.0, 2.0, 2.5, 3.0] + [2.0, 4.0, 3.0]
    assert float(ranks[0].stats.count) == pytest.approx(PRIOR + len(returns), rel=1e-12)
    std = torch.sqrt(ranks[0].stats.variance() + 1e-8).item()
    assert std == pytest.approx(pooled_std(returns), rel=1e-12)


def test_offline_data_feeds_the_running_returns_across_chunks():
    kinds = np.array([F, M, M, L, F, M, L], np.int8)
    rewards = np.array([0.0, 1.0, 2.0, 3.0, 0.0, 4.0, 5.0], np.float32)
    whole, chunked = RewardNormalizer(gamma=0.5), RewardNormalizer(gamma=0.5)
    assert whole.update_from_episodes(kinds, rewards) == 7.0  # 0.5 * 4 + 5, the last episode's return
    carried = chunked.update_from_episodes(kinds[:2], rewards[:2])
    chunked.update_from_episodes(kinds[2:], rewards[2:], carried)
    returns = [1.0, 2.5, 4.25, 4.0, 7.0]
    for normalizer in (whole, chunked):
        std = torch.sqrt(normalizer.stats.variance() + 1e-8).item()
        assert std == pytest.approx(pooled_std(returns), rel=1e-12)


@pytest.mark.parametrize("gamma", [0.0, -0.5, 1.5])
def test_a_bad_gamma_is_a_one_line_error(gamma):
    with pytest.raises(OneLineValueError, match=rf"^RewardNormalizer.gamma={gamma} must be a discount in \(0, 1\]"):
        RewardNormalizer(gamma=gamma)
