"""HindsightExperienceTransformer: relabelled goals come from the same episode, at or after the sequence's last step
in it; rewards and discounts are recomputed; the buffer's episode ends match a naive scan."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.data import nest
from alfish.data.types import BatchInfo, Experience, StepType
from alfish.replay.ring_buffer import RingBuffer
from alfish.transforms import HindsightExperienceTransformer, sparse_goal_reward

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
GOALS = gym.spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)
SPACE = gym.spaces.Dict({"achieved_goal": GOALS, "desired_goal": GOALS, "observation": GOALS})
# env 0: episodes of 5, 3, 6, ... steps; env 1: 4, 7, ...; the last episode of each is still running.
LENGTHS = [[5, 3, 6, 2, 4, 5, 3, 6], [4, 7, 2, 6, 3, 5, 4, 2]]
STEPS = 30
DESIRED = torch.tensor([-1.0, -1.0])  # the env's own goal: never achieved


def episodes_of(env: int) -> tuple[list[int], list[int]]:
    """Step types and episode numbers of env's first STEPS steps."""
    types, episode = [], []
    for k, n in enumerate(LENGTHS[env]):
        types += [F] + [M] * (n - 2) + [L]
        episode += [k] * n
    return types[:STEPS], episode[:STEPS]


def fill(capacity: int) -> RingBuffer:
    """achieved_goal of step t of env e = (t, episode number): each stored goal says where it came from."""
    buffer = RingBuffer(2, capacity, track_episode_ends=True)
    info = [episodes_of(e) for e in range(2)]
    for t in range(STEPS):
        step_type = torch.tensor([info[e][0][t] for e in range(2)], dtype=torch.int8)
        achieved = torch.tensor([[float(t), float(info[e][1][t])] for e in range(2)])
        obs = {"achieved_goal": achieved, "desired_goal": DESIRED.expand(2, 2).clone(), "observation": achieved}
        buffer.add(Experience(step_type, torch.where(step_type == F, 0.0, -1.0), torch.ones(2), obs,
                              torch.zeros(2, dtype=torch.long), torch.arange(2)))
    return buffer


def naive_episode_end(env: int, t: int) -> int:
    types, _ = episodes_of(env)
    while t < STEPS - 1 and types[t] != L:
        t += 1
    return t


@pytest.mark.parametrize("capacity", [64, 20])  # 20: the ring has wrapped
def test_episode_end_matches_a_naive_scan(capacity):
    buffer = fill(capacity)
    for e in range(2):
        for t in range(int(buffer.oldest_index()[e]), STEPS):
            assert int(buffer.episode_end(torch.tensor(e), torch.tensor(t))) == naive_episode_end(e, t), (e, t)


def test_relabelled_goals_come_from_the_same_episode_and_later_steps():
    torch.manual_seed(0)
    buffer = fill(20)
    her = HindsightExperienceTransformer(SPACE, her_proportion=1.0)
    length, num = 3, 2000
    env_ids = torch.randint(0, 2, (num,))
    oldest = buffer.oldest_index()[env_ids]
    positions = oldest + torch.randint(0, STEPS - length + 1 - int(oldest[0]), (num,))
    exp = buffer.gather(env_ids, positions, length)
    out = her.transform_sample(exp, BatchInfo(env_ids, positions), buffer)
    offsets_seen = set()
    for n in range(num):
        e, p = int(env_ids[n]), int(positions[n])
        _, episode = episodes_of(e)
        end = naive_episode_end(e, p)
        goal_t, goal_episode = out.observation["desired_goal"][n, 0].tolist()
        assert goal_episode == episode[p], "goal from another episode"
        assert min(p + length - 1, end) <= goal_t <= end, "goal from an earlier step"
        offsets_seen.add(int(goal_t) - min(p + length - 1, end))
        for i in range(length):
            t = p + i
            desired = out.observation["desired_goal"][n, i]
            if t <= end:  # relabelled: reward from this step's achieved goal, terminal where reached
                assert desired.tolist() == [goal_t, goal_episode]
                reached = t == goal_t
                first = exp.step_type[n, i] == F
                assert float(out.reward[n, i]) == (0.0 if (reached or first) else -1.0)
                assert float(out.discount[n, i]) == (0.0 if reached and not first else 1.0)
            else:  # the next episode keeps its own goal and reward
                assert torch.equal(desired, DESIRED)
                assert float(out.reward[n, i]) == float(exp.reward[n, i])
    assert len(offsets_seen) >= 4  # the future step is drawn over the rest of the episode, not always the same


def test_her_proportion_sets_the_share_of_relabelled_sequences():
    torch.manual_seed(1)
    buffer = fill(64)
    num = 4000
    env_ids, positions = torch.zeros(num, dtype=torch.long), torch.zeros(num, dtype=torch.long)  # episode 0
    exp = buffer.gather(env_ids, positions, 2)
    out = HindsightExperienceTransformer(SPACE, her_proportion=0.3).transform_sample(
        exp, BatchInfo(env_ids, positions), buffer)
    relabelled = (out.observation["desired_goal"][:, 0] != DESIRED).any(-1).float().mean()
    assert abs(float(relabelled) - 0.3) < 0.03
    unchanged = HindsightExperienceTransformer(SPACE, her_proportion=0.0).transform_sample(
        exp, BatchInfo(env_ids, positions), buffer)
    assert torch.equal(unchanged.observation["desired_goal"], exp.observation["desired_goal"])


def test_sparse_goal_reward_by_hand():
    reward, reached = sparse_goal_reward(torch.tensor([[0.0, 1.0], [0.0, 1.0]]), torch.tensor([[0.0, 1.0], [0.1, 1.0]]))
    assert reward.tolist() == [0.0, -1.0] and reached.tolist() == [True, False]
    reward, _ = sparse_goal_reward(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.1, 1.0]]), tolerance=0.2)
    assert reward.tolist() == [0.0]


def test_needs_goal_fields_and_a_valid_proportion():
    with pytest.raises(ValueError, match="needs dict observations with 'achieved_goal' and 'desired_goal'"):
        HindsightExperienceTransformer(GOALS)
    with pytest.raises(ValueError, match=r"her_proportion=1.5 must be in \[0, 1\]"):
        HindsightExperienceTransformer(SPACE, her_proportion=1.5)


def test_episode_ends_survive_a_checkpoint_round_trip():
    buffer = fill(20)
    restored = RingBuffer(2, 20, track_episode_ends=True)
    example = buffer.gather(torch.tensor([0]), buffer.oldest_index()[:1], 1)
    restored.load_state_dict(buffer.state_dict(), nest.map_nest(lambda x: x[:, 0], example))
    for e in range(2):
        for t in range(int(buffer.oldest_index()[e]), STEPS):
            index = (torch.tensor(e), torch.tensor(t))
            assert int(restored.episode_end(*index)) == int(buffer.episode_end(*index))
