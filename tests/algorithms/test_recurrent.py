"""Recurrent policies: the state is reset at FIRST steps inside training sequences and by the Unroller, training
sequences reproduce the rollout, and the combinations that cannot train a state are refused."""
import functools

import gymnasium as gym
import numpy as np
import pytest
import torch

import alfish.envs.toy  # noqa: F401  (registers alfish/MemoryCue-v0)
from alfish.algorithms.actor_critic import ActorCriticNetworks
from alfish.algorithms.base import reset_state_at_first
from alfish.algorithms.ppo import PpoAlgorithm
from alfish.collect.unroller import Unroller
from alfish.data import nest
from alfish.data.types import EMPTY, StepType
from alfish.envs.batched_env import BatchedEnv
from alfish.envs.toy import MemoryCue
from alfish.networks.encoding import EncodingNetwork

OBS = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)


def recurrent_ppo(rnn: str = "lstm", use_rollout_state: bool = True, independent=None, length=6) -> PpoAlgorithm:
    torch.manual_seed(0)
    alg = PpoAlgorithm(OBS, gym.spaces.Discrete(2), hidden_sizes=(8,))
    alg.net = ActorCriticNetworks(alg, (8,), encoding_network_ctor=functools.partial(EncodingNetwork, rnn=rnn,
                                                                                    rnn_size=4))
    alg.configure_recurrence(use_rollout_state, independent, length)
    return alg


def random_state(alg: PpoAlgorithm, batch: int):
    return nest.map_nest(lambda x: torch.randn_like(x), alg.initial_state(batch))


@pytest.mark.parametrize("rnn", ["lstm", "gru"])
def test_state_is_reset_at_first_inside_a_sequence(rnn):
    alg = recurrent_ppo(rnn)
    length, batch, boundary = 6, 2, 3
    obs = torch.randn(length, batch, 2)
    action = torch.randint(0, 2, (length, batch))
    step_type = torch.full((length, batch), StepType.MID, dtype=torch.int8)
    step_type[boundary, 0] = StepType.FIRST  # env 0 starts a new episode inside the sequence
    step_type[boundary - 1, 0] = StepType.LAST
    start = random_state(alg, batch)
    with torch.no_grad():
        whole = alg.net.evaluate_sequence(obs, action, step_type, start)
        # by hand: the part after the boundary, from the initial state
        after = alg.net.evaluate_sequence(obs[boundary:], action[boundary:], step_type[boundary:],
                                          alg.initial_state(batch))
        # and the same sequence without the boundary: the state carried across differs
        carried = alg.net.evaluate_sequence(obs, action, torch.full_like(step_type, StepType.MID), start)
    per_step = lambda out: out.log_prob.view(length, batch)  # noqa: E731
    per_step_after = after.log_prob.view(length - boundary, batch)
    torch.testing.assert_close(per_step(whole)[boundary:, 0], per_step_after[:, 0])
    torch.testing.assert_close(whole.value.view(length, batch)[boundary:, 0],
                               after.value.view(length - boundary, batch)[:, 0])
    assert not torch.allclose(per_step(carried)[boundary:, 0], per_step_after[:, 0])
    # env 1 has no boundary: the same as carrying the state
    torch.testing.assert_close(per_step(whole)[:, 1], per_step(carried)[:, 1])
    # and the steps before the boundary did not change
    torch.testing.assert_close(per_step(whole)[:boundary], per_step(carried)[:boundary])


def test_reset_state_at_first_keeps_the_other_envs_and_leaves_empty_alone():
    state = (torch.ones(3, 2), torch.full((3, 2), 2.0))
    out = reset_state_at_first(state, torch.tensor([1, 0, 2], dtype=torch.int8),
                               lambda b, d: (torch.zeros(b, 2), torch.zeros(b, 2)))
    assert out[0].tolist() == [[1, 1], [0, 0], [1, 1]] and out[1].tolist() == [[2, 2], [0, 0], [2, 2]]
    assert reset_state_at_first(EMPTY, torch.zeros(3, dtype=torch.int8), None) is EMPTY


def unroll(alg: PpoAlgorithm, steps: int):
    env = BatchedEnv("alfish/MemoryCue-v0", 3, seed=0)
    unroller = Unroller(env, alg)
    taken = []
    unroller.unroll(steps, taken.append)
    env.close()
    return nest.stack(taken), unroller


def test_unroller_resets_the_state_at_episode_starts_and_carries_it_otherwise():
    alg = recurrent_ppo("gru")
    exp, unroller = unroll(alg, 15)  # episodes of 7 steps (FIRST, 5 MID, LAST): FIRST at t = 0, 7, 14 (autoresets)
    first = exp.step_type == StepType.FIRST
    assert first[:, 0].nonzero().flatten().tolist() == [0, 7, 14]
    stored = exp.rollout_info.state  # [T, B, 4]: the state each step was acted from
    assert (stored[first] == 0).all()
    assert (stored[~first].abs().sum(-1) > 0).all()  # carried (a GRU state is zero only at a reset)
    # the carried state is the one rollout_step returned at the step before
    with torch.no_grad():
        out = alg.net.evaluate_sequence(exp.observation, exp.action, exp.step_type, stored[0])
    torch.testing.assert_close(out.log_prob.view(15, 3), exp.rollout_info.log_prob)
    torch.testing.assert_close(out.value.view(15, 3), exp.rollout_info.value)
    assert unroller.state.shape == (3, 4)


def test_training_sequences_start_from_the_stored_rollout_state():
    alg = recurrent_ppo("lstm", length=5)
    exp, _ = unroll(alg, 16)
    batch_major = nest.map_nest(lambda x: x.transpose(0, 1), exp)
    processed = alg.preprocess_experience(batch_major)  # [B, 15]
    # a sequence that starts mid-episode (t = 3..7, crossing the FIRST at t = 7)
    seq = nest.map_nest(lambda x: x[:, 3:8].transpose(0, 1).contiguous(), processed)
    with torch.no_grad():
        info = alg.train_step(seq).info
    torch.testing.assert_close(info.log_prob.view(5, 3), seq.rollout_info.log_prob)
    alg.use_rollout_state = False  # from zeros: differs before the episode boundary, equal after it
    with torch.no_grad():
        zeros = alg.train_step(seq).info.log_prob.view(5, 3)
    assert not torch.allclose(zeros[:4], seq.rollout_info.log_prob[:4])
    torch.testing.assert_close(zeros[4:], seq.rollout_info.log_prob[4:])


def test_temporally_independent_training_uses_each_steps_rollout_state():
    alg = recurrent_ppo("gru", independent=True, length=1)
    exp, _ = unroll(alg, 8)
    seq = nest.map_nest(lambda x: x.transpose(0, 1), alg.preprocess_experience(nest.map_nest(
        lambda x: x.transpose(0, 1), exp)))
    with torch.no_grad():
        info = alg.train_step(seq).info
    torch.testing.assert_close(info.log_prob.view(7, 3), seq.rollout_info.log_prob)


def test_stateless_unroll_keeps_an_empty_state():
    alg = PpoAlgorithm(OBS, gym.spaces.Discrete(2), hidden_sizes=(8,))
    alg.configure_recurrence(False, None, None)
    exp, unroller = unroll(alg, 3)
    assert unroller.state is EMPTY and exp.rollout_info.state is EMPTY


def test_combinations_that_cannot_train_a_state_are_refused():
    with pytest.raises(ValueError, match=r"mini_batch_length=1 gives sequences of one step"):
        recurrent_ppo(use_rollout_state=False, length=1)
    with pytest.raises(ValueError, match=r"temporally_independent_train_step=True trains each step alone"):
        recurrent_ppo(use_rollout_state=False, independent=True)
    alg = PpoAlgorithm(OBS, gym.spaces.Discrete(2), hidden_sizes=(8,))
    with pytest.raises(ValueError, match=r"temporally_independent_train_step=False needs a recurrent algorithm"):
        alg.configure_recurrence(False, False, 4)


def test_memory_cue_rewards_the_remembered_cue():
    env = MemoryCue(delay=2)
    for seed in range(4):
        obs, _ = env.reset(seed=seed)
        cue = obs[0]
        assert cue in (-1.0, 1.0) and obs[1] == 0.0
        for _ in range(2):
            obs, reward, terminated, _, _ = env.step(0)
            assert obs.tolist() == [0.0, 0.0] and reward == 0.0 and not terminated
        obs, reward, terminated, _, _ = env.step(0)
        assert obs.tolist() == [0.0, 1.0] and not terminated  # the query
        _, reward, terminated, _, _ = env.step(1 if cue > 0 else 0)
        assert reward == 1.0 and terminated


def recurrent_dqn(use_rollout_state: bool, burn_in: int = 0):
    from alfish.algorithms.dqn import DqnAlgorithm

    torch.manual_seed(0)
    alg = DqnAlgorithm(OBS, gym.spaces.Discrete(2), hidden_sizes=(8,), burn_in=burn_in, epsilon_greedy=0.0,
                       encoding_network_ctor=functools.partial(EncodingNetwork, rnn="gru", rnn_size=4))
    alg.configure_recurrence(use_rollout_state, None, 6)
    return alg


def test_recurrent_dqn_trains_every_step_after_burn_in_from_the_stored_state():
    alg = recurrent_dqn(True, burn_in=2)
    env = BatchedEnv("alfish/MemoryCue-v0", 3, seed=0)
    taken = []
    Unroller(env, alg).unroll(9, taken.append)
    env.close()
    exp = nest.stack(taken)
    seq = nest.map_nest(lambda x: x[3:9], exp)  # 6 steps from mid-episode, across the FIRST at t = 7
    with torch.no_grad():
        info = alg.train_step(seq).info
        # by hand: Q along the rollout, each step from the state it was acted from
        q_rollout = torch.stack([alg.q_net(seq.observation[t], seq.rollout_info.state[t])[0] for t in range(6)])
    assert info.q.shape == (6 - 2 - 1, 3)  # burn-in 2, n_step 1
    expected = q_rollout[2:5].gather(-1, seq.action[2:5].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(info.q, expected)
    assert info.valid.tolist() == (seq.step_type[2:5] != StepType.LAST).tolist()
    loss = alg.calc_loss(seq, info)
    assert loss.loss.shape == (3, 3) and loss.priority.shape == (3,)
    with pytest.raises(ValueError, match=r"burn_in \+ n_step \+ 1 = 4 steps, got 3"):
        alg.train_step(nest.map_nest(lambda x: x[:3], seq))
