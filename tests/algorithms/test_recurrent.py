"""Recurrent policies: the state is reset at FIRST steps inside training sequences and by the Unroller, training
sequences reproduce the rollout, and the combinations that cannot train a state are refused."""
import functools
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import alfish.envs.toy  # noqa: F401  (registers alfish/MemoryCue-v0 and alfish/MemoryCueContinuous-v0)
from alfish.algorithms.actor_critic import ActorCriticNetworks
from alfish.algorithms.base import reset_state_at_first
from alfish.algorithms.ppo import PpoAlgorithm
from alfish.algorithms.sac import LOG_STD_MAX, LOG_STD_MIN, SacAlgorithm, SacRolloutInfo
from alfish.collect.unroller import Unroller
from alfish.data import nest
from alfish.data.types import EMPTY, Experience, StepType, TimeStep
from alfish.envs.batched_env import BatchedEnv
from alfish.envs.toy import MemoryCue
from alfish.networks.distributions import tanh_gaussian_sample
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


# ---------------------------------------------------------------------------------------------- recurrent SAC ---
BOX = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)


def recurrent_sac(use_rollout_state: bool = True, burn_in: int = 0, rnn: str = "gru", length: int = 6, seed: int = 0,
                  **kwargs) -> SacAlgorithm:
    torch.manual_seed(seed)
    alg = SacAlgorithm(OBS, BOX, hidden_sizes=(8,), burn_in=burn_in,
                       encoding_network_ctor=functools.partial(EncodingNetwork, rnn=rnn, rnn_size=4), **kwargs)
    alg.configure_recurrence(use_rollout_state, None, length)
    return alg


def sac_rollout(alg: SacAlgorithm, steps: int):
    """``steps`` steps of 3 MemoryCueContinuous envs (episodes of 7 steps: FIRST at t = 0, 7, 14), time-major."""
    env = BatchedEnv("alfish/MemoryCueContinuous-v0", 3, seed=0)
    taken = []
    Unroller(env, alg).unroll(steps, taken.append)
    env.close()
    return nest.stack(taken)


def q_of(alg: SacAlgorithm, features: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """The online critics at ``features [T, B, F]`` and env-scale ``action [T, B, 1]``: ``[E, T, B]``."""
    q = alg.critics(features.flatten(0, 1), alg.unscale_action(action.flatten(0, 1)))
    return q.view(q.shape[0], *features.shape[:2])


def test_recurrent_sac_trains_every_step_after_burn_in_from_the_stored_state():
    alg = recurrent_sac(True, burn_in=2)
    exp = sac_rollout(alg, 9)
    seq = nest.map_nest(lambda x: x[3:9], exp)  # 6 steps from mid-episode, across the FIRST at t = 7 (index 4)
    assert seq.step_type[:, 0].tolist() == [1, 1, 1, 2, 0, 1]  # MID x3, LAST, FIRST, MID
    with torch.no_grad():
        info = alg.train_step(seq).info
        # by hand: the features along the rollout, each step from the state it was acted from
        features = torch.stack([alg.encoder(seq.observation[t], seq.rollout_info.state[t])[0] for t in range(6)])
        expected = q_of(alg, features[2:5], seq.action[2:5])       # trained: steps 2, 3, 4 (burn-in 2, last 5 not)
    assert info.q.shape == (2, 3 * 3)
    torch.testing.assert_close(info.q.view(2, 3, 3), expected)
    loss = alg.calc_loss(seq, info)
    assert loss.loss.shape == (3, 3) and loss.priority.shape == (3,)
    assert (loss.loss[1] == 0).all() and (loss.loss[[0, 2]] != 0).all()  # step 3 is LAST: its transition is masked

    # From zeros instead: different before the episode boundary, the same from the FIRST on (the state is reset).
    alg.use_rollout_state = False
    with torch.no_grad():
        zeros = alg.train_step(seq).info.q.view(2, 3, 3)
    assert not torch.allclose(zeros[:, :2], expected[:, :2])
    torch.testing.assert_close(zeros[:, 2], expected[:, 2])


def constant_ensemble(ensemble, values):
    """Every member outputs its constant, whatever the input: zero weights and hidden biases, output bias = value."""
    with torch.no_grad():
        for w in ensemble.weights:
            w.zero_()
        for b in ensemble.biases:
            b.zero_()
        ensemble.biases[-1].copy_(torch.tensor(values).view(-1, 1, 1))


def test_recurrent_sac_td_targets_and_r2d2_priorities_by_hand():
    """Critics set to constants (target: 2 and 3, online: 1 and 1.5), alpha = 0, gamma = 0.9: the TD target of the
    transition out of step t is r[t+1] + 0.9 * discount[t+1] * 2."""
    alg = recurrent_sac(False, burn_in=1, length=5, gamma=0.9, initial_log_alpha=-1e4)
    constant_ensemble(alg.target_critics, [2.0, 3.0])
    constant_ensemble(alg.critics, [1.0, 1.5])
    mid, first, last = StepType.MID, StepType.FIRST, StepType.LAST
    # env 0 terminates at step 2 (discount 0) and restarts at step 3; env 1 runs on
    step_type = torch.tensor([[mid, mid], [mid, mid], [last, mid], [first, mid], [mid, mid]], dtype=torch.int8)
    reward = torch.tensor([[0.0, 0.0], [0.1, 0.2], [1.0, 0.3], [0.0, 0.4], [0.5, 0.6]])
    discount = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    exp = Experience(step_type=step_type, reward=reward, discount=discount, observation=torch.randn(5, 2, 2),
                     action=torch.rand(5, 2, 1) * 2 - 1, env_id=torch.tensor([[0, 1]] * 5))
    info = alg.train_step(exp).info
    # trained: the transitions out of steps 1, 2, 3 (burn-in 1; step 4 has no successor in the sequence)
    target = torch.tensor([[1.0 + 0.0, 0.3 + 1.8],     # out of step 1: env 0 terminates at step 2
                           [0.0 + 1.8, 0.4 + 1.8],     # out of step 2: env 0's is out of a LAST step (masked)
                           [0.5 + 1.8, 0.6 + 1.8]])
    torch.testing.assert_close(info.td_target.view(3, 2), target)
    abs_td = ((1.0 - target).abs() + (1.5 - target).abs()) / 2
    valid = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    torch.testing.assert_close(info.critic_loss.view(3, 2), 0.5 * ((1.0 - target) ** 2 + (1.5 - target) ** 2))
    loss = alg.calc_loss(exp, info)
    assert loss.loss.shape == (3, 2) and (loss.loss[1, 0] == 0)
    masked = abs_td * valid
    torch.testing.assert_close(loss.priority, 0.9 * masked.amax(0) + 0.1 * masked.mean(0))


def test_recurrent_sac_td_target_reads_the_target_encoder_and_draws_the_next_action_from_the_online_one():
    """``r[t+1] + gamma * discount[t+1] * (min_i Q'_i(target features[t+1], a') - alpha * log pi(a'))`` with ``a'``
    drawn from the actor on the online features of step t+1, recomputed from the same random draws."""
    alg = recurrent_sac(False, length=5, gamma=0.9, initial_log_alpha=-0.5)
    with torch.no_grad():  # a target encoder that lags behind: its features differ from the online ones
        for p in alg.target_encoder.parameters():
            p.mul_(0.5)
    length, batch = 5, 3
    step_type = torch.full((length, batch), StepType.MID, dtype=torch.int8)
    obs, reward = torch.randn(length, batch, 2), torch.randn(length, batch)
    discount = (torch.rand(length, batch) > 0.3).float()
    exp = Experience(step_type=step_type, reward=reward, discount=discount, observation=obs,
                     action=torch.rand(length, batch, 1) * 2 - 1, env_id=torch.arange(batch).expand(length, batch))
    torch.manual_seed(3)
    with torch.no_grad():
        info = alg.train_step(exp).info
    torch.manual_seed(3)  # a' is the first draw of train_step
    with torch.no_grad():
        online, _ = alg.encoder.unroll(obs, step_type, alg.initial_state(batch))
        target, _ = alg.target_encoder.unroll(obs, step_type, alg.initial_state(batch))
        mean, log_std = alg.actor(online[1:].flatten(0, 1)).chunk(2, dim=-1)
        next_action, log_prob = tanh_gaussian_sample(mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX))
        alpha = math.exp(-0.5)

        def expected(features):
            next_q = alg.target_critics(features[1:].flatten(0, 1), next_action).amin(0).squeeze(-1)
            return reward[1:].flatten() + 0.9 * discount[1:].flatten() * (next_q - alpha * log_prob)

    torch.testing.assert_close(info.td_target, expected(target))
    assert not torch.allclose(info.td_target, expected(online))


@pytest.mark.parametrize("rnn", ["lstm", "gru"])
def test_recurrent_sac_resets_the_state_at_first_inside_a_sequence(rnn):
    """Env 0 restarts at step 3: from there on, its critic values and TD targets are those of a fresh start, whatever
    the state before; env 1 (no boundary) carries its state through."""
    alg = recurrent_sac(True, rnn=rnn)
    length, batch, boundary = 6, 2, 3
    step_type = torch.full((length, batch), StepType.MID, dtype=torch.int8)
    step_type[boundary - 1, 0], step_type[boundary, 0] = StepType.LAST, StepType.FIRST
    obs, reward = torch.randn(length, batch, 2), torch.randn(length, batch)
    action = torch.rand(length, batch, 1) * 2 - 1

    def train(step_type, start):
        exp = Experience(step_type=step_type, reward=reward, discount=torch.ones(length, batch),
                         observation=obs, action=action, env_id=torch.tensor([[0, 1]] * length),
                         rollout_info=SacRolloutInfo(nest.map_nest(lambda x: x.expand(length, *x.shape), start)))
        torch.manual_seed(1)  # the same draws of a' in each call
        with torch.no_grad():
            info = alg.train_step(exp).info
        return info.q.view(2, length - 1, batch), info.td_target.view(length - 1, batch)

    q_a, target_a = train(step_type, random_state(alg, batch))
    q_b, target_b = train(step_type, random_state(alg, batch))
    torch.testing.assert_close(q_a[:, boundary:, 0], q_b[:, boundary:, 0])
    torch.testing.assert_close(target_a[boundary - 1:, 0], target_b[boundary - 1:, 0])  # out of the LAST on
    assert not torch.allclose(q_a[:, :boundary], q_b[:, :boundary])
    assert not torch.allclose(q_a[:, :, 1], q_b[:, :, 1]) and not torch.allclose(target_a[:, 1], target_b[:, 1])
    with torch.no_grad():  # by hand: the steps from the boundary on, from the initial state
        fresh, _ = alg.encoder.unroll(obs[boundary:], step_type[boundary:], alg.initial_state(batch))
        fresh_q = q_of(alg, fresh[:-1], action[boundary:-1])
    torch.testing.assert_close(q_a[:, boundary:, 0], fresh_q[:, :, 0])
    # without the boundary the state before it leaks through
    q_c, _ = train(torch.full_like(step_type, StepType.MID), random_state(alg, batch))
    assert not torch.allclose(q_c[:, boundary:, 0], q_a[:, boundary:, 0])


def params_reached(alg: SacAlgorithm, loss: torch.Tensor) -> set[str]:
    """The top-level modules (and log_alpha) that get a non-zero gradient from ``loss`` alone."""
    alg.zero_grad(set_to_none=True)
    loss.backward(retain_graph=True)
    reached = {name.split(".")[0] for name, p in alg.named_parameters() if p.grad is not None and p.grad.any()}
    alg.zero_grad(set_to_none=True)
    return reached


def test_recurrent_sac_trains_the_encoder_by_the_critic_loss_only_and_not_in_the_burn_in():
    alg = recurrent_sac(False, burn_in=2, length=7)
    length, batch = 7, 3
    obs = torch.randn(length, batch, 2, requires_grad=True)  # flat float observations reach the encoder as they are
    exp = Experience(step_type=torch.full((length, batch), StepType.MID, dtype=torch.int8),
                     reward=torch.randn(length, batch), discount=torch.ones(length, batch), observation=obs,
                     action=torch.rand(length, batch, 1) * 2 - 1, env_id=torch.arange(batch).expand(length, batch))
    info = alg.train_step(exp).info
    assert params_reached(alg, info.critic_loss.sum()) == {"encoder", "critics"}
    assert params_reached(alg, info.actor_loss.sum()) == {"actor"}
    assert params_reached(alg, info.alpha_loss.sum()) == {"log_alpha"}
    alg.calc_loss(exp, info).loss.sum().backward()
    reached = obs.grad.abs().sum(-1) > 0                                     # [L, B]
    # steps 0-1 (burn-in) and 6 (the last: read only by the detached actor for a' and the target encoder) get none
    assert reached.all(1).tolist() == [False, False, True, True, True, True, False]
    assert not reached[[0, 1, 6]].any()
    assert all(p.grad is None for p in alg.target_encoder.parameters())


def test_recurrent_sac_acts_from_the_state_it_is_given_and_stores_it():
    alg = recurrent_sac(True)
    obs = torch.randn(3, 2)
    step = TimeStep(step_type=torch.ones(3, dtype=torch.int8), reward=torch.zeros(3), discount=torch.ones(3),
                    observation=obs, prev_action=torch.zeros(3, 1), env_id=torch.arange(3))
    with torch.no_grad():
        empty = alg.predict_step(step)
        initial = alg.predict_step(step, alg.initial_state(3))
        other = alg.predict_step(step, random_state(alg, 3))
        rolled = alg.rollout_step(step, empty.state)
    torch.testing.assert_close(empty.output, initial.output)   # EMPTY: an episode start
    torch.testing.assert_close(empty.state, initial.state)
    assert not torch.allclose(empty.output, other.output)
    assert empty.output.shape == (3, 1) and empty.state.shape == (3, 4)
    torch.testing.assert_close(rolled.info.state, empty.state)  # the state acted from, as rollout info
    assert not torch.allclose(rolled.state, empty.state)
    alg.use_rollout_state = False
    with torch.no_grad():
        assert alg.rollout_step(step).info is EMPTY


def test_recurrent_sac_acts_with_only_the_tensors_async_unroll_ships():
    from alfish.collect.shared_params import rollout_state

    alg, child = recurrent_sac(seed=0), recurrent_sac(seed=1)
    assert alg.rollout_module_names == ("encoder", "actor")
    shipped = {k[len("algorithm."):]: v for k, v in rollout_state(alg, torch.nn.Module()).items()}
    assert not any(k.startswith(("critics", "target_")) for k in shipped)
    child.load_state_dict(shipped, strict=False)
    step = TimeStep(step_type=torch.ones(3, dtype=torch.int8), reward=torch.zeros(3), discount=torch.ones(3),
                    observation=torch.randn(3, 2), prev_action=torch.zeros(3, 1), env_id=torch.arange(3))
    state = random_state(alg, 3)
    with torch.no_grad():
        mine, theirs = alg.predict_step(step, state), child.predict_step(step, state)
    torch.testing.assert_close(mine.output, theirs.output)
    torch.testing.assert_close(mine.state, theirs.state)


def test_recurrent_sac_target_encoder_follows_with_the_target_critics():
    alg = recurrent_sac(True, target_update_tau=0.25)
    before = [p.clone() for p in alg.target_encoder.parameters()]
    with torch.no_grad():
        for p in alg.encoder.parameters():
            p.add_(1.0)
    alg.after_update()
    for old, new, source in zip(before, alg.target_encoder.parameters(), alg.encoder.parameters()):
        torch.testing.assert_close(new, old + 0.25 * (source - old))
    groups = {g["name"]: g["params"] for g in alg.param_groups()}
    assert {id(p) for p in alg.encoder.parameters()} <= {id(p) for p in groups["critic"]}


def test_recurrent_sac_refusals():
    gru = functools.partial(EncodingNetwork, rnn="gru", rnn_size=4)
    with pytest.raises(ValueError, match=r"SacAlgorithm.burn_in=2 warms up a recurrent state; this SAC has none"):
        SacAlgorithm(OBS, BOX, hidden_sizes=(8,), burn_in=2)
    with pytest.raises(ValueError, match=r"SacAlgorithm.burn_in=2 warms up a recurrent state"):
        SacAlgorithm(OBS, BOX, hidden_sizes=(8,), burn_in=2, encoding_network_ctor=EncodingNetwork)  # rnn = None
    with pytest.raises(ValueError, match=r"SacAlgorithm.burn_in=-1 must be >= 0"):
        SacAlgorithm(OBS, BOX, burn_in=-1, encoding_network_ctor=gru)
    for option in ("actor_network_cls", "critic_network_cls"):
        with pytest.raises(ValueError, match=r"encoding_network_ctor \(a shared encoder\) and actor_network_cls / "
                                             r"critic_network_cls are exclusive"):
            SacAlgorithm(OBS, BOX, encoding_network_ctor=gru, **{option: object()})
    with pytest.raises(ValueError, match=r"SacAlgorithm needs a Box action space"):
        SacAlgorithm(OBS, gym.spaces.Discrete(2), encoding_network_ctor=gru)
    with pytest.raises(ValueError, match=r"burn_in \+ 2 = 4 steps, got 3; set TrainerConfig.mini_batch_length"):
        recurrent_sac(burn_in=2, length=3)
    alg = recurrent_sac(burn_in=2, length=4)
    exp = Experience(step_type=torch.ones(3, 2, dtype=torch.int8), reward=torch.zeros(3, 2),
                     discount=torch.ones(3, 2), observation=torch.zeros(3, 2, 2), action=torch.zeros(3, 2, 1),
                     env_id=torch.zeros(3, 2, dtype=torch.long), rollout_info=SacRolloutInfo(torch.zeros(3, 2, 4)))
    with pytest.raises(ValueError, match=r"burn_in \+ 2 = 4 steps, got 3"):
        alg.train_step(exp)


def test_eval_uncertainty_leaves_out_critics_that_read_features():
    from alfish.evaluate.evaluator import has_critic_ensemble

    assert has_critic_ensemble(SacAlgorithm(OBS, BOX, hidden_sizes=(8,)))
    assert not has_critic_ensemble(recurrent_sac())


def test_memory_cue_continuous_pays_the_cue_times_the_action():
    env = MemoryCue(delay=1, continuous=True)
    assert env.action_space == BOX
    for seed, answer in ((0, 0.5), (1, -2.0), (2, 1.0), (3, -0.25)):
        obs, _ = env.reset(seed=seed)
        cue = obs[0]
        env.step(np.zeros(1, dtype=np.float32))                 # the blank step
        obs, reward, terminated, _, _ = env.step(np.array([0.3], dtype=np.float32))  # reaches the query
        assert obs.tolist() == [0.0, 1.0] and reward == 0.0 and not terminated
        _, reward, terminated, _, _ = env.step(np.array([answer], dtype=np.float32))
        assert reward == pytest.approx(cue * max(-1.0, min(1.0, answer))) and terminated


@pytest.mark.parametrize("algorithm", ["dqn", "sac"])
def test_sequence_replay_algorithms_refuse_training_recurrent_steps_alone(algorithm):
    """temporally_independent_train_step=True would be silently ignored by DQN and SAC (they train sequences)."""
    from alfish.algorithms.dqn import DqnAlgorithm
    from alfish.algorithms.sac import SacAlgorithm
    from alfish.networks.encoding import EncodingNetwork

    def encoder(space):
        return EncodingNetwork(space, rnn="gru", rnn_size=4)

    if algorithm == "dqn":
        alg = DqnAlgorithm(OBS, gym.spaces.Discrete(2), hidden_sizes=(8,), encoding_network_ctor=encoder)
    else:
        alg = SacAlgorithm(OBS, gym.spaces.Box(-1, 1, (1,)), hidden_sizes=(8,), encoding_network_ctor=encoder)
    with pytest.raises(ValueError, match=r"over whole sequences .* "
                                         r"TrainerConfig.temporally_independent_train_step=True would change nothing"):
        alg.configure_recurrence(True, True, 8)
    alg.configure_recurrence(True, None, 8)
    assert alg.temporally_independent_train_step is False
