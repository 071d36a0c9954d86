"""A2C unrolls without gradients and recomputes its rollout infos in one batched forward pass
(``OnPolicyAlgorithm.recompute_rollout_info``): the trajectory, the loss and the gradients are those of the unroll with
gradients it replaces, for discrete and continuous actions."""
import pytest
import torch

import alfish.envs  # noqa: F401  (registers alfish/PointGoal-v0)
from alfish.algorithms.a2c import A2cAlgorithm
from alfish.collect.unroller import Unroller
from alfish.envs.batched_env import BatchedEnv


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
