"""SB3's ``ortho_init`` (orthogonal weights of the given gains, zero biases; or PyTorch's default init) on built
networks, and on PPO/A2C's actor-critic networks, whose default (``None``) stays alfish's own init; SB3's
``log_std_init`` as ``ActorCriticNetworks.initial_log_std``."""
import math

import gin
import gymnasium as gym
import pytest
import torch
from torch import nn

from alfish.algorithms.a2c import A2cAlgorithm
from alfish.algorithms.ppo import PpoAlgorithm
from alfish.networks.initialization import default_init_, orthogonal_init_
from alfish.networks.mlp import MLP

OBS = gym.spaces.Box(-1.0, 1.0, shape=(4,))
ACTION = gym.spaces.Box(-1.0, 1.0, shape=(2,))


def is_orthogonal(weight: torch.Tensor, gain: float) -> bool:
    """Rows (or columns, whichever are fewer) orthonormal times ``gain``: ``W W^T = gain^2 I`` or ``W^T W``."""
    w = weight.detach()
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    return torch.allclose(gram, gain ** 2 * torch.eye(gram.shape[0]), atol=1e-5)


def linears(module):
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def within_default_bound(layer: nn.Linear) -> bool:
    """PyTorch's default: weights and biases uniform in +-1/sqrt(fan_in)."""
    bound = 1.0 / math.sqrt(layer.in_features)
    return bool(layer.weight.abs().max() <= bound and layer.bias.abs().max() <= bound)


def test_orthogonal_init_gives_each_layer_its_gain_and_zero_biases():
    torch.manual_seed(0)
    mlp = MLP(4, 2, (8, 6))
    orthogonal_init_(mlp, math.sqrt(2.0), 0.01)
    first, second, out = linears(mlp)
    assert is_orthogonal(first.weight, math.sqrt(2.0)) and is_orthogonal(second.weight, math.sqrt(2.0))
    assert is_orthogonal(out.weight, 0.01)
    assert all(torch.equal(layer.bias, torch.zeros_like(layer.bias)) for layer in (first, second, out))


def test_default_init_undoes_it():
    torch.manual_seed(0)
    mlp = MLP(4, 2, (8,))
    orthogonal_init_(mlp, 3.0, 3.0)  # far outside the default bounds
    default_init_(mlp)
    assert all(within_default_bound(layer) for layer in linears(mlp))
    assert not is_orthogonal(linears(mlp)[-1].weight, 3.0)


@pytest.mark.parametrize("cls", [PpoAlgorithm, A2cAlgorithm])
def test_default_is_alfish_init_true_is_sb3s_false_is_pytorchs(cls):
    torch.manual_seed(0)
    today = cls(OBS, ACTION, hidden_sizes=(8, 8))
    policy_hidden, policy_out = linears(today.net.policy)[0], linears(today.net.policy)[-1]
    assert within_default_bound(policy_hidden) and not is_orthogonal(policy_hidden.weight, math.sqrt(2.0))
    assert is_orthogonal(policy_out.weight, 0.01) and is_orthogonal(linears(today.net.value_net)[-1].weight, 1.0)

    sb3 = cls(OBS, ACTION, hidden_sizes=(8, 8), ortho_init=True)
    *hidden, policy_out = linears(sb3.net.policy)
    assert all(is_orthogonal(layer.weight, math.sqrt(2.0)) for layer in hidden)
    assert is_orthogonal(policy_out.weight, 0.01) and is_orthogonal(linears(sb3.net.value_net)[-1].weight, 1.0)
    assert all(not layer.bias.any() for layer in linears(sb3.net))

    plain = cls(OBS, ACTION, hidden_sizes=(8, 8), ortho_init=False)
    assert all(within_default_bound(layer) for layer in linears(plain.net))
    assert not is_orthogonal(linears(plain.net.policy)[-1].weight, 0.01)


def test_log_std_init_is_actor_critic_networks_initial_log_std():
    gin.clear_config()
    try:
        gin.bind_parameter("ActorCriticNetworks.initial_log_std", -2.0)
        ppo = PpoAlgorithm(OBS, ACTION, hidden_sizes=(8,))
    finally:
        gin.clear_config()
    assert torch.equal(ppo.net.log_std.detach(), torch.full((2,), -2.0))
