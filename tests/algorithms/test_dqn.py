"""DqnAlgorithm: n-step targets by hand, double Q, masking, gradient isolation, target updates, exploration."""
import gymnasium as gym
import pytest
import torch
from torch import nn

from alfish.algorithms.dqn import DqnAlgorithm, n_step_targets
from alfish.data.types import Experience, StepType, TimeStep

F_, M_, L_ = StepType.FIRST, StepType.MID, StepType.LAST
OBS = gym.spaces.Box(-1.0, 1.0, shape=(3,))


def steps(*columns):
    """[L, B] int8 step types from per-sample columns."""
    return torch.tensor(columns, dtype=torch.int8).T


def cols(*columns):
    return torch.tensor(columns, dtype=torch.float32).T


# ------------------------------------------------------------------------------------------------ n_step_targets --
def test_n_step_targets_by_hand():
    gamma = 0.5
    # Columns: no end in the window; termination at step 2; truncation at step 2; termination at step 1;
    # step 0 is LAST (invalid).
    step_type = steps([M_, M_, M_, M_], [M_, M_, L_, F_], [M_, M_, L_, F_], [F_, L_, F_, M_], [L_, F_, M_, M_])
    reward = cols([9, 1, 2, 4], [9, 1, 2, 100], [9, 1, 2, 100], [9, 3, 100, 100], [9, 1, 1, 1])
    discount = cols([1, 1, 1, 1], [1, 1, 0, 1], [1, 1, 1, 1], [1, 0, 1, 1], [0, 1, 1, 1])
    value = cols([99, 10, 20, 8], [99, 10, 20, 30], [99, 10, 20, 30], [99, 10, 20, 30], [99, 1, 1, 1])
    target, valid = n_step_targets(reward, discount, step_type, value, gamma, n_step=3)
    expected = [
        1 + 0.5 * 2 + 0.25 * 4 + 0.125 * 8,  # 4: three rewards, bootstrap from step 3 with gamma^3
        1 + 0.5 * 2,                        # 2: terminated at step 2: no bootstrap, step 3's reward ignored
        1 + 0.5 * 2 + 0.25 * 20,            # 7: truncated at step 2: bootstrap from step 2 with gamma^2
        3,                                  # terminated at once
    ]
    assert target[:4].tolist() == pytest.approx(expected)
    assert valid.tolist() == [True, True, True, True, False]
    assert torch.isfinite(target).all()


def test_one_step_targets_by_hand():
    gamma = 0.5
    step_type = steps([M_, M_], [M_, L_], [F_, L_], [L_, F_])
    reward = cols([0, 1], [0, 1], [0, 1], [0, 7])
    discount = cols([1, 1], [1, 0], [1, 1], [1, 1])
    value = cols([50, 4], [50, 4], [50, 4], [50, 4])
    target, valid = n_step_targets(reward, discount, step_type, value, gamma, n_step=1)
    assert target[:3].tolist() == pytest.approx([1 + 0.5 * 4, 1, 1 + 0.5 * 4])  # MID, terminated, truncated
    assert valid.tolist() == [True, True, True, False]


def test_n_step_targets_needs_n_plus_one_steps():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="n_step \\+ 1 = 3"):
        n_step_targets(x, x, x.to(torch.int8), x, 0.9, n_step=2)


# -------------------------------------------------------------------------------------------------- algorithm --
def linear(weight_rows, bias):
    layer = nn.Linear(len(weight_rows[0]), len(bias))
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight_rows, dtype=torch.float32))
        layer.bias.copy_(torch.tensor(bias, dtype=torch.float32))
    return layer


def experience(obs, action, reward, discount, step_type):
    L, B = step_type.shape
    return Experience(step_type=step_type, reward=reward, discount=discount, observation=obs, action=action,
                      env_id=torch.arange(B).expand(L, B))


def one_step_batch(B=4, gen=None):
    gen = gen or torch.Generator().manual_seed(0)
    return experience(torch.randn(2, B, 3, generator=gen), torch.randint(2, (2, B), generator=gen),
                      torch.randn(2, B, generator=gen), torch.ones(2, B), torch.full((2, B), M_, dtype=torch.int8))


@pytest.mark.parametrize("double_q, expected", [(True, 0.5 + 0.9 * 2.0), (False, 0.5 + 0.9 * 5.0)])
def test_double_q_values_the_online_argmax_with_the_target_net(double_q, expected):
    alg = DqnAlgorithm(OBS, gym.spaces.Discrete(2), gamma=0.9, double_q=double_q)
    zero = [[0.0, 0.0, 0.0]] * 2
    alg.q_net = linear(zero, [0.0, 1.0])            # online prefers action 1
    alg.target_q_net = linear(zero, [5.0, 2.0]).requires_grad_(False)  # target prefers action 0
    exp = one_step_batch()
    exp = exp._replace(reward=torch.full((2, 4), 0.5))
    info = alg.train_step(exp).info
    assert info.target.tolist() == pytest.approx([expected] * 4)
    # Q(obs_0, action_0) is read from the online net.
    assert info.q.tolist() == pytest.approx([[0.0, 1.0][a] for a in exp.action[0].tolist()])


def test_loss_is_masked_for_sequences_starting_at_last_and_reaches_only_the_q_network():
    alg = DqnAlgorithm(OBS, gym.spaces.Discrete(2))
    exp = one_step_batch()
    exp = exp._replace(step_type=steps([M_, M_], [L_, F_], [M_, L_], [L_, F_]))
    loss_info = alg.calc_loss(exp, alg.train_step(exp).info)
    assert loss_info.loss.shape == (1, 4)
    assert loss_info.loss[0, 1] == 0 and loss_info.loss[0, 3] == 0
    assert bool((loss_info.loss[0, [0, 2]] > 0).all())
    assert loss_info.priority.shape == (4,)
    assert loss_info.priority[1] == 0 and loss_info.priority[3] == 0
    extra = loss_info.extra()
    assert set(extra) == {"td_loss", "q_mean", "epsilon"}
    assert float(extra["td_loss"]) == pytest.approx(float(loss_info.loss.detach().sum()) / 2)
    target_before = [p.clone() for p in alg.target_q_net.parameters()]
    loss_info.loss.sum().backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in alg.q_net.parameters())
    assert all(p.grad is None for p in alg.target_q_net.parameters())
    assert all(torch.equal(a, b) for a, b in zip(target_before, alg.target_q_net.parameters()))
    assert [g["name"] for g in alg.param_groups()] == ["q"]
    assert set(map(id, alg.param_groups()[0]["params"])) == set(map(id, alg.q_net.parameters()))


@pytest.mark.parametrize("huber", [True, False])
def test_td_loss_is_huber_or_half_squared_error(huber):
    alg = DqnAlgorithm(OBS, gym.spaces.Discrete(2), huber_loss=huber)
    alg.q_net = linear([[0.0, 0.0, 0.0]] * 2, [0.0, 0.0])
    alg.target_q_net = linear([[0.0, 0.0, 0.0]] * 2, [0.0, 0.0]).requires_grad_(False)
    exp = one_step_batch()._replace(reward=cols([0, 0.5], [0, 3.0], [0, -2.0], [0, 0.0]))
    loss = alg.calc_loss(exp, alg.train_step(exp).info).loss[0]
    expected = [0.5 * 0.25, 2.5, 1.5, 0.0] if huber else [0.125, 4.5, 2.0, 0.0]
    assert loss.tolist() == pytest.approx(expected)


def test_train_step_rejects_sequences_of_the_wrong_length():
    alg = DqnAlgorithm(OBS, gym.spaces.Discrete(2), n_step=3)
    with pytest.raises(ValueError, match="mini_batch_length = 4"):
        alg.train_step(one_step_batch())


def test_hard_target_update_every_period():
    alg = DqnAlgorithm(OBS, gym.spaces.Discrete(2), target_update_period=3, target_update_tau=1.0)
    with torch.no_grad():
        for p in alg.q_net.parameters():
            p.add_(1.0)
    original = [p.clone() for p in alg.target_q_net.parameters()]
    for _ in range(2):
        alg.after_update()
        assert all(torch.equal(a, b) for a, b in zip(original, alg.target_q_net.parameters()))
    alg.after_update()
    assert all(torch.equal(a, b) for a, b in zip(alg.q_net.parameters(), alg.target_q_net.parameters()))


def test_soft_target_update():
    alg = DqnAlgorithm(OBS, gym.spaces.Discrete(2), target_update_period=1, target_update_tau=0.25)
    with torch.no_grad():
        for p in alg.q_net.parameters():
            p.add_(4.0)
    before = [p.clone() for p in alg.target_q_net.parameters()]
    alg.after_update()
    for old, new, online in zip(before, alg.target_q_net.parameters(), alg.q_net.parameters()):
        torch.testing.assert_close(new, old + 0.25 * (online - old))


def time_step(B, gen):
    return TimeStep(step_type=torch.full((B,), M_, dtype=torch.int8), reward=torch.zeros(B), discount=torch.ones(B),
                    observation=torch.randn(B, 3, generator=gen), prev_action=torch.zeros(B, dtype=torch.int64),
                    env_id=torch.arange(B))


def test_epsilon_greedy_frequencies():
    torch.manual_seed(0)
    B, A = 8000, 4
    ts = time_step(B, torch.Generator().manual_seed(1))
    alg = DqnAlgorithm(OBS, gym.spaces.Discrete(A), epsilon_greedy=1.0)
    greedy = alg.q_net(ts.observation).argmax(-1)
    # epsilon = 1: uniform over the actions, whatever the Q-values.
    action = alg.rollout_step(ts).output
    assert action.dtype == torch.int64 and action.shape == (B,)
    freq = torch.bincount(action, minlength=A).float() / B
    assert torch.allclose(freq, torch.full((A,), 1 / A), atol=0.03), freq
    # predict_step is greedy, whatever the exploration epsilon ...
    assert torch.equal(alg.predict_step(ts).output, greedy)
    # ... and with an eval epsilon e takes a uniformly random action with probability e.
    action = alg.predict_step(ts, epsilon_greedy=1.0).output
    freq = torch.bincount(action, minlength=A).float() / B
    assert torch.allclose(freq, torch.full((A,), 1 / A), atol=0.03), freq
    action = alg.predict_step(ts, epsilon_greedy=0.4).output
    assert float((action != greedy).float().mean()) == pytest.approx(0.4 * (A - 1) / A, abs=0.03)
    # epsilon = 0: greedy.
    alg0 = DqnAlgorithm(OBS, gym.spaces.Discrete(A), epsilon_greedy=0.0)
    assert torch.equal(alg0.rollout_step(ts).output, alg0.q_net(ts.observation).argmax(-1))
    # in between: random with probability epsilon, so off the greedy action with epsilon * (A - 1) / A.
    alg.epsilon = DqnAlgorithm(OBS, gym.spaces.Discrete(A), epsilon_greedy=0.2).epsilon
    action = alg.rollout_step(ts).output
    assert float((action != greedy).float().mean()) == pytest.approx(0.2 * (A - 1) / A, abs=0.03)


def test_box_action_space_is_an_error():
    with pytest.raises(ValueError, match="Discrete action space"):
        DqnAlgorithm(OBS, gym.spaces.Box(-1.0, 1.0, shape=(2,)))
