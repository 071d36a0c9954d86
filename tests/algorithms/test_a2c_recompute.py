"""A2C unrolls without gradients and recomputes its rollout infos in one batched forward pass
(``OnPolicyAlgorithm.recompute_rollout_info``): the trajectory, the loss and the gradients are those of the unroll with
gradients it replaces, for discrete and continuous actions."""
import pytest
import torch

import alfish.envs  # noqa: F401  (registers alfish/PointGoal-v0)
from alfish.algorithms.a2c import A2cAlgorithm
from alfish.collect.unroller import Unroller
from alfish.envs.batched_env import BatchedEnv
from alfish.losses.vtrace import VTraceSettings, vtrace_returns


def loss_and_gradients(env_name: str, recompute: bool):
    """One 6-step unroll of 4 envs and A2C's loss on it: (actions, mean loss, gradients), from fixed seeds."""
    torch.manual_seed(0)
    env = BatchedEnv(env_name, 4, seed=3)
    algorithm = A2cAlgorithm(env.observation_space, env.action_space, hidden_sizes=(16,), entropy_coef=0.01,
                             gae_lambda=0.95)
    trajectory = Unroller(env, algorithm, seed=3).unroll_on_policy(6, with_grad=not recompute)
    if recompute:
        assert not trajectory.rollout_info.log_prob.requires_grad  # the unroll itself kept no graph
        trajectory = algorithm.recompute_rollout_info(trajectory)
    loss = algorithm.calc_loss(trajectory).loss.mean()
    grads = torch.autograd.grad(loss, [p for p in algorithm.parameters() if p.requires_grad])
    env.close()
    return trajectory.action, loss.detach(), grads


@pytest.mark.parametrize("env_name", ["CartPole-v1", "alfish/PointGoal-v0"])
def test_recomputed_rollout_infos_give_the_loss_and_gradients_of_the_unroll_with_gradients(env_name):
    actions, loss, grads = loss_and_gradients(env_name, recompute=False)
    actions_r, loss_r, grads_r = loss_and_gradients(env_name, recompute=True)
    assert torch.equal(actions, actions_r)  # the same random draws: the same trajectory
    assert torch.allclose(loss, loss_r, rtol=1e-6, atol=1e-7)
    assert len(grads) == len(grads_r) and any(g.abs().sum() > 0 for g in grads)
    for g, g_r in zip(grads, grads_r):  # (one batched matmul against one per step: float rounding only)
        assert torch.allclose(g, g_r, rtol=1e-5, atol=1e-7)


def test_a2c_says_it_recomputes_and_the_on_policy_default_does_not():
    from alfish.algorithms.base import OnPolicyAlgorithm

    assert A2cAlgorithm.recomputes_rollout_info and not OnPolicyAlgorithm.recomputes_rollout_info


def vtrace_loss(env_name: str, behaviour_shift: float = 0.0, **kwargs):
    """As ``loss_and_gradients`` (recomputed), the stored (acting) log-probs moved by ``behaviour_shift``. Returns
    (loss terms, the recomputed trajectory)."""
    torch.manual_seed(0)
    env = BatchedEnv(env_name, 4, seed=3)
    algorithm = A2cAlgorithm(env.observation_space, env.action_space, hidden_sizes=(16,), **kwargs)
    trajectory = Unroller(env, algorithm, seed=3).unroll_on_policy(6, with_grad=False)
    env.close()
    info = trajectory.rollout_info
    trajectory = trajectory._replace(rollout_info=info._replace(log_prob=info.log_prob + behaviour_shift))
    recomputed = algorithm.recompute_rollout_info(trajectory)
    return algorithm.loss_terms(recomputed), recomputed


@pytest.mark.parametrize("env_name", ["CartPole-v1", "alfish/PointGoal-v0"])
def test_vtrace_on_its_own_unroll_is_the_uncorrected_loss(env_name):
    # gae_lambda = 1 (A2C's default): V-trace's policy-gradient advantage and targets are GAE(1)'s on own data
    plain, _ = vtrace_loss(env_name)
    corrected, _ = vtrace_loss(env_name, off_policy_correction="vtrace")
    for term in ("policy_loss", "value_loss", "advantage", "value_target"):
        torch.testing.assert_close(corrected[term], plain[term], rtol=1e-5, atol=1e-6, msg=term)


def test_vtrace_weighs_the_policy_gradient_by_the_truncated_ratio():
    # The acting policy gave each taken action e^-1 of the current probability (rho = e): with rho-bar 1 the
    # policy-gradient weight and the TD errors are truncated to 1 (as on-policy); with rho-bar 2 they are V-trace's
    # at rho = 2 everywhere.
    plain, _ = vtrace_loss("CartPole-v1")
    clipped, _ = vtrace_loss("CartPole-v1", -1.0, off_policy_correction="vtrace")
    torch.testing.assert_close(clipped["advantage"], plain["advantage"], rtol=1e-5, atol=1e-6)
    loose, trajectory = vtrace_loss("CartPole-v1", -1.0, off_policy_correction="vtrace", vtrace_clip_rho=2.0,
                                    vtrace_clip_c=2.0)
    info = trajectory.rollout_info
    torch.testing.assert_close(info.log_prob.detach() - info.behaviour_log_prob, torch.ones_like(info.log_prob))
    expected = vtrace_returns(torch.ones_like(info.log_prob), trajectory.reward, info.value.detach(),
                              trajectory.step_type, trajectory.discount, VTraceSettings(0.99, 1.0, 2.0, 2.0, 2.0))
    torch.testing.assert_close(loose["advantage"], expected.pg_advantage)
    torch.testing.assert_close(loose["value_target"], expected.value_target)
    assert not torch.allclose(loose["advantage"], plain["advantage"])
