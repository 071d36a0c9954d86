"""SAC with a mixed action (a Discrete and a Box part, ALF's design, alfish/algorithms/sac_mixed.py): the losses and
each part's temperature against hand computations, the discrete policy softmax(Q / alpha_d), the greedy action,
the one-line refusals, and a checkpoint round trip.

Critics are constants per (member, choice) (``constant_q``), so every Q value below is known by hand:
critics [[1, 2, 0.5], [1.5, 1, 0]] (min over members: [1, 1, 0]), target critics [[2, 3, 1], [3, 2, 4]] (min:
[2, 2, 1]).
"""
import math

import gin
import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.algorithms import DqnAlgorithm, PpoAlgorithm, SacAlgorithm, Td3Algorithm
from alfish.algorithms.sac_mixed import MixedSacAlgorithm, default_discrete_entropy
from alfish.data.types import Experience, StepType, TimeStep
from alfish.envs.mixed_actions import MixedActionBox
from alfish.errors import OneLineValueError

GAMMA = 0.9
OBS = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
MIXED = MixedActionBox(gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (1,), np.float32))))
E = math.e
LOG_Z = math.log(2 * E + 1)  # log-normaliser of softmax([1, 1, 0])


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def constant_q(ensemble, values):
    """Member ``i`` outputs ``values[i]`` ``[n]`` whatever the input."""
    with torch.no_grad():
        for w in ensemble.weights:
            w.zero_()
        for b in ensemble.biases:
            b.zero_()
        ensemble.biases[-1].copy_(torch.tensor(values).unsqueeze(1))


def mixed_sac(**kwargs) -> MixedSacAlgorithm:
    sac = SacAlgorithm(observation_space=OBS, action_space=MIXED, hidden_sizes=(4,), gamma=GAMMA, **kwargs)
    constant_q(sac.critics, [[1.0, 2.0, 0.5], [1.5, 1.0, 0.0]])
    constant_q(sac.target_critics, [[2.0, 3.0, 1.0], [3.0, 2.0, 4.0]])
    return sac


def batch() -> Experience:
    """``[L=2, B=2]``: env 0 took choice 1 (value 0), reward 1; env 1 choice 2 (value 0.5), reward 0.5."""
    mid = StepType.MID
    return Experience(step_type=torch.full((2, 2), mid, dtype=torch.int8),
                      reward=torch.tensor([[0.0, 0.0], [1.0, 0.5]]), discount=torch.ones(2, 2),
                      observation=torch.zeros(2, 2, 1), action=torch.tensor([[[1.0, 0.0], [2.0, 0.5]]] * 2),
                      env_id=torch.tensor([[0, 1], [0, 1]]))


def time_step(obs: torch.Tensor) -> TimeStep:
    n = obs.shape[0]
    return TimeStep(step_type=torch.full((n,), StepType.MID, dtype=torch.int8), reward=torch.zeros(n),
                    discount=torch.ones(n), observation=obs, prev_action=torch.zeros(n, 2), env_id=torch.arange(n))


def test_sac_builds_the_mixed_class_for_a_mixed_space_only():
    assert type(SacAlgorithm(OBS, MIXED, hidden_sizes=(4,))) is MixedSacAlgorithm
    assert type(SacAlgorithm(OBS, gym.spaces.Box(-1.0, 1.0, (2,)), hidden_sizes=(4,))) is SacAlgorithm
    sac = mixed_sac()
    assert (sac.num_actions, sac.action_dim) == (3, 1)
    assert sac.critics(torch.zeros(5, 1), torch.zeros(5, 1)).shape == (2, 5, 3)  # [E, N, n]: one Q per choice


def test_default_target_entropies_per_part():
    sac = mixed_sac()
    assert sac.target_entropy.value() == -1.0  # -dim of the Box part, as SB3
    # ALF's default: the peak has 0.9, the other 2 choices share 0.1: -(0.9 log 0.9 + 2 * 0.05 log 0.05)
    by_hand = -(0.9 * math.log(0.9) + 2 * 0.05 * math.log(0.05))
    assert sac.discrete_target_entropy.value() == pytest.approx(by_hand, abs=1e-12)
    assert default_discrete_entropy(2) == pytest.approx(-(0.9 * math.log(0.9) + 0.1 * math.log(0.1)), abs=1e-12)
    assert default_discrete_entropy(1) == 0.0
    assert mixed_sac(discrete_target_entropy=0.5, target_entropy=-3.0).discrete_target_entropy.value() == 0.5


def test_losses_match_the_hand_computation_with_alpha_c_zero():
    sac = mixed_sac()
    with torch.no_grad():
        sac.log_alpha.fill_(-1e4)         # alpha_c = 0: no continuous entropy term anywhere
        sac.discrete_log_alpha.fill_(0.0)  # alpha_d = 1
    info = sac.train_step(batch()).info
    # pi_d = softmax([1, 1, 0]); V(s') = sum_k pi_k (Q'_k - log pi_k) = 1 + log(2e + 1) (Q' - log pi = 1 + log Z each)
    value = 1.0 + LOG_Z
    expected_target = torch.tensor([1.0 + GAMMA * value, 0.5 + GAMMA * value])
    assert torch.allclose(info.td_target, expected_target, atol=1e-5)
    q = torch.tensor([[2.0, 0.5], [1.0, 0.0]])  # [E, N]: member i's Q of the replayed choice (1 for env 0, 2 for env 1)
    assert torch.allclose(info.q, q)
    assert torch.allclose(info.critic_loss, 0.5 * ((q - expected_target) ** 2).sum(0), atol=1e-5)
    # actor: -(sum_k pi_k min_i Q_ik) = -(2e / (2e + 1)); discrete entropy: log Z - sum_k pi_k Q_k
    expected_q_term = 2 * E / (2 * E + 1)
    assert torch.allclose(info.actor_loss, torch.full((2,), -expected_q_term), atol=1e-5)
    assert torch.allclose(info.discrete_entropy, torch.full((2,), LOG_Z - expected_q_term), atol=1e-5)


def test_the_continuous_entropy_enters_the_td_target_with_alpha_c():
    sac = mixed_sac()
    with torch.no_grad():
        sac.log_alpha.fill_(math.log(0.5))
        sac.discrete_log_alpha.fill_(0.0)
    torch.manual_seed(3)
    info = sac.train_step(batch()).info
    torch.manual_seed(3)  # the first draw of the losses: the Box action at the next steps
    _, next_log_prob = sac._policy(torch.zeros(2, 1), greedy=False)
    expected = torch.tensor([1.0, 0.5]) + GAMMA * (1.0 + LOG_Z - 0.5 * next_log_prob)
    assert torch.allclose(info.td_target, expected, atol=1e-5)


def test_each_part_has_its_own_alpha_and_target_entropy():
    sac = mixed_sac(initial_log_alpha=0.3, discrete_target_entropy=0.2)
    assert [g["name"] for g in sac.param_groups()][-1] == "alpha"
    assert sac.param_groups()[-1]["params"] == [sac.log_alpha, sac.discrete_log_alpha]
    info = sac.train_step(batch()).info
    info.alpha_loss.sum().backward()
    # d/d log_alpha_c = sum(-target_c - log pi_c); d/d log_alpha_d = sum(H_d - target_d)
    assert sac.log_alpha.grad.item() == pytest.approx((1.0 - info.log_prob).sum().item(), abs=1e-5)
    alpha_d = math.exp(0.3)
    probs = torch.softmax(torch.tensor([1.0, 1.0, 0.0]) / alpha_d, -1)
    entropy = -(probs * probs.log()).sum().item()
    assert sac.discrete_log_alpha.grad.item() == pytest.approx(2 * (entropy - 0.2), abs=1e-5)
    # entropy above its target: a gradient step lowers alpha_d (less exploration), as for the Box part
    assert sac.discrete_log_alpha.grad.item() > 0
    assert all(p.grad is None for p in list(sac.actor.parameters()) + list(sac.critics.parameters()))


def test_summaries_report_each_part_and_mask_transitions_out_of_last_steps():
    sac = mixed_sac()
    sac.debug_summaries = True
    exp = batch()
    exp = exp._replace(step_type=torch.tensor([[StepType.MID, StepType.LAST], [StepType.MID, StepType.FIRST]],
                                              dtype=torch.int8))
    info = sac.train_step(exp).info
    with torch.no_grad():
        info = info._replace(discrete_entropy=torch.tensor([0.25, 99.0]))  # env 1's transition is out of a LAST step
    loss_info = sac.calc_loss(exp, info)
    extra = loss_info.extra()
    assert extra["discrete_entropy"].item() == pytest.approx(0.25)
    assert extra["discrete_alpha"].item() == pytest.approx(1.0) and extra["alpha"].item() == pytest.approx(1.0)
    assert extra["entropy"].item() == pytest.approx(-info.log_prob[0].item(), abs=1e-6)
    assert loss_info.loss[0, 1].item() == 0.0 and loss_info.loss.shape == (1, 2)
    assert extra["debug/q.mean"].item() == pytest.approx(1.5)  # env 0 replayed choice 1: the members' Q 2 and 1
    assert extra["debug/discrete_target_entropy"].item() == pytest.approx(default_discrete_entropy(3))


def test_each_loss_term_reaches_only_its_parameters():
    for term, owners in (("critic_loss", {"critics"}), ("actor_loss", {"actor"})):
        sac = SacAlgorithm(OBS, MIXED, hidden_sizes=(4,))
        exp = batch()
        exp = exp._replace(observation=torch.rand(2, 2, 1))
        getattr(sac.train_step(exp).info, term).sum().backward()
        touched = {name.split(".")[0] for name, p in sac.named_parameters() if p.grad is not None and p.grad.any()}
        assert touched == owners, term


def test_discrete_policy_is_softmax_of_q_over_alpha_d():
    torch.manual_seed(0)
    sac = mixed_sac()
    with torch.no_grad():
        sac.discrete_log_alpha.fill_(math.log(0.7))
    with torch.no_grad():
        actions = sac.rollout_step(time_step(torch.zeros(20000, 1))).output
    counts = torch.bincount(actions[:, 0].long(), minlength=3).float() / 20000
    expected = torch.softmax(torch.tensor([1.0, 1.0, 0.0]) / 0.7, -1)  # over the members' minimum
    assert torch.allclose(counts, expected, atol=0.015), (counts, expected)
    assert actions[:, 0].eq(actions[:, 0].round()).all() and actions[:, 1].abs().le(1.0).all()


def test_greedy_action_is_the_argmax_of_q_at_the_box_mean():
    torch.manual_seed(0)
    sac = SacAlgorithm(OBS, MIXED, hidden_sizes=(8,))
    obs = torch.rand(64, 1) * 2 - 1
    with torch.no_grad():
        greedy = sac.predict_step(time_step(obs)).output
        mean = torch.tanh(sac.actor(obs).chunk(2, -1)[0])  # the Box bounds are [-1, 1]: no scaling
        choice = sac.critics(obs, mean).amin(0).argmax(-1)
    assert torch.allclose(greedy[:, 1:], mean) and torch.equal(greedy[:, 0].long(), choice)
    with torch.no_grad():
        again = sac.predict_step(time_step(obs)).output
    assert torch.equal(again, greedy)  # greedy: no sampling


def test_fixed_ent_coef_fixes_both_alphas():
    sac = mixed_sac(ent_coef=0.2)
    assert [g["name"] for g in sac.param_groups()] == ["actor", "critic"]
    assert {"log_alpha", "discrete_log_alpha"} <= set(sac.state_dict()) and not sac.learns_alpha
    assert sac.discrete_log_alpha.exp().item() == pytest.approx(0.2) == sac.log_alpha.exp().item()
    assert torch.equal(sac.train_step(batch()).info.alpha_loss, torch.zeros(2))


@pytest.mark.parametrize("make", [lambda: PpoAlgorithm(OBS, MIXED), lambda: DqnAlgorithm(OBS, MIXED),
                                  lambda: Td3Algorithm(OBS, MIXED)], ids=["ppo", "dqn", "td3"])
def test_algorithms_that_cannot_drive_mixed_actions_refuse_them_in_one_line(make):
    with pytest.raises(OneLineValueError, match=r"cannot drive mixed actions \(Tuple\(Discrete\(3\), Box") as err:
        make()
    assert "\n" not in str(err.value) and "SacAlgorithm can" in str(err.value)


@pytest.mark.parametrize("kwargs, match", [
    (dict(use_sde=True), "use_sde unset"),
    (dict(critic_network_cls=lambda obs, n: None), "critic_network_cls"),
    (dict(discrete_target_entropy=1.2), r"above log\(3\) = 1.0986"),
])
def test_mixed_sac_refuses_what_it_does_not_support(kwargs, match):
    with pytest.raises(OneLineValueError, match=match):
        SacAlgorithm(OBS, MIXED, hidden_sizes=(4,), **kwargs)


def test_box_sac_refuses_a_discrete_target_entropy():
    with pytest.raises(OneLineValueError, match="discrete_target_entropy=0.3 is the target of a mixed action"):
        SacAlgorithm(OBS, OBS, hidden_sizes=(4,), discrete_target_entropy=0.3)


def test_checkpoint_round_trip_restores_both_alphas_and_the_policy():
    torch.manual_seed(0)
    sac = SacAlgorithm(OBS, MIXED, hidden_sizes=(8,))
    with torch.no_grad():
        sac.discrete_log_alpha.fill_(-0.7)
        sac.log_alpha.fill_(0.4)
    state = sac.state_dict()
    torch.manual_seed(1)
    fresh = SacAlgorithm(OBS, MIXED, hidden_sizes=(8,))
    obs = torch.rand(32, 1) * 2 - 1
    with torch.no_grad():
        assert not torch.equal(fresh.predict_step(time_step(obs)).output, sac.predict_step(time_step(obs)).output)
        fresh.load_state_dict(state)
        assert torch.equal(fresh.predict_step(time_step(obs)).output, sac.predict_step(time_step(obs)).output)
    assert (fresh.discrete_log_alpha.item(), fresh.log_alpha.item()) == pytest.approx((-0.7, 0.4))
