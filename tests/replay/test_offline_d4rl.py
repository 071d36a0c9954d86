"""D4RL transitions -> alfish steps, checked by hand on two episodes: one terminated, one timed out."""
import numpy as np
import pytest

from alfish.data.types import StepType
from alfish.replay.offline.d4rl import d4rl_to_steps

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST


def two_episodes(with_next: bool = True) -> dict:
    data = dict(observations=np.array([[0.0], [1.0], [2.0], [3.0], [4.0]], np.float32),
                actions=np.array([[0.0], [0.1], [0.2], [0.3], [0.4]], np.float32),
                rewards=np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32),
                terminals=np.array([0, 0, 1, 0, 0], bool),   # episode A (rows 0-2) terminates
                timeouts=np.array([0, 0, 0, 0, 1], bool))    # episode B (rows 3-4) is cut by the time limit
    if with_next:
        data["next_observations"] = np.array([[1.0], [2.0], [20.0], [4.0], [40.0]], np.float32)
    return data


def test_transitions_become_steps_with_one_last_step_per_episode():
    steps = d4rl_to_steps(two_episodes())
    assert steps.step_type.tolist() == [F, M, M, L, F, M, L]
    assert steps.observation[:, 0].tolist() == [0.0, 1.0, 2.0, 20.0, 3.0, 4.0, 40.0]
    # the reward of row t sits on step t+1: it belongs to the action before
    assert steps.reward.tolist() == [0.0, 1.0, 2.0, 3.0, 0.0, 4.0, 5.0]
    # discount 0 only where A terminated; B's time-out is bootstrapped
    assert steps.discount.tolist() == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert steps.action[:, 0].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.0, 0.3, 0.4, 0.0])
    assert (steps.dropped, steps.num_episodes) == (0, 2)


def test_without_next_observations_the_last_transition_of_each_episode_is_dropped():
    steps = d4rl_to_steps(two_episodes(with_next=False))
    assert steps.step_type.tolist() == [F, M, L, F, L]
    assert steps.observation[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert steps.reward.tolist() == [0.0, 1.0, 2.0, 0.0, 4.0]
    assert steps.discount.tolist() == [1.0] * 5  # the terminal transition was the dropped one
    assert (steps.dropped, steps.num_episodes) == (2, 2)


def test_data_cut_in_the_middle_of_an_episode_ends_it_as_a_truncation():
    data = two_episodes()
    data["timeouts"][4] = False
    steps = d4rl_to_steps(data)
    assert steps.step_type.tolist()[-1] == L and steps.discount.tolist()[-1] == 1.0


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("rewards"), r"dataset: missing field\(s\) \['rewards'\]"),
    (lambda d: d.update(rewards=np.array([1, 2, 3], np.float32)),
     "field 'rewards' has 3 rows but 'observations' has 5"),
    (lambda d: d.update(actions=np.array([None] * 5, dtype=object)), "field 'actions' has dtype object"),
])
def test_malformed_datasets_are_one_line_errors(change, message):
    data = two_episodes()
    change(data)
    with pytest.raises(ValueError, match=message):
        d4rl_to_steps(data)
