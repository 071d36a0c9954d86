"""SB3's ``net_arch=dict(pi=[...], qf=[...])`` and ``activation_fn`` for SAC and DDPG/TD3: ``actor_hidden_sizes``,
``critic_hidden_sizes`` (``None``: ``hidden_sizes``) and ``activation`` reach the default networks, flat or raw."""
import gin
import gymnasium as gym
import pytest
import torch
from torch import nn

from alfish.algorithms.ddpg import DdpgAlgorithm, Td3Algorithm
from alfish.algorithms.ppo import PpoAlgorithm
from alfish.algorithms.sac import SacAlgorithm
from alfish.config import load_conf
from alfish.networks.heads import CriticNetwork

BOX = gym.spaces.Box(-1.0, 1.0, shape=(3,))
ACTION = gym.spaces.Box(-1.0, 1.0, shape=(2,))
ALGS = [SacAlgorithm, DdpgAlgorithm, Td3Algorithm]


def linear_sizes(mlp):
    return [layer.out_features for layer in mlp if isinstance(layer, nn.Linear)]


@pytest.mark.parametrize("cls", ALGS)
def test_actor_and_critic_get_their_own_sizes_and_the_activation(cls):
    alg = cls(BOX, ACTION, hidden_sizes=(4,), actor_hidden_sizes=(8, 6), critic_hidden_sizes=(5, 7, 3),
              activation="tanh")
    out = 2 * 2 if cls is SacAlgorithm else 2  # SAC's actor gives mean and log-std
    assert linear_sizes(alg.actor) == [8, 6, out]
    assert all(type(layer) is not nn.ReLU for layer in alg.actor) and sum(type(m) is nn.Tanh for m in alg.actor) == 2
    assert [tuple(w.shape[1:]) for w in alg.critics.weights] == [(3 + 2, 5), (5, 7), (7, 3), (3, 1)]
    assert type(alg.critics.activation) is nn.Tanh
    # one member by hand: tanh between the layers, none after the last
    x = torch.randn(6, 5)
    w, b = alg.critics.weights, alg.critics.biases
    h = x
    for i in range(4):
        h = h @ w[i][0] + b[i][0]
        h = torch.tanh(h) if i < 3 else h
    torch.testing.assert_close(alg.critics(x[:, :3], x[:, 3:])[0], h)


@pytest.mark.parametrize("cls", ALGS)
def test_unset_parts_take_hidden_sizes_and_relu_as_today(cls):
    alg = cls(BOX, ACTION, hidden_sizes=(9, 9), critic_hidden_sizes=(4,))
    assert linear_sizes(alg.actor)[:-1] == [9, 9]
    assert [tuple(w.shape[1:]) for w in alg.critics.weights] == [(5, 4), (4, 1)]
    assert type(alg.critics.activation) is nn.ReLU and alg.critics.activation.inplace


def test_raw_mode_critics_read_the_sizes_and_activation():
    obs = gym.spaces.Box(-1.0, 1.0, shape=(2, 3))  # rank 2: raw mode (EncodingNetwork + MLP heads)
    sac = SacAlgorithm(obs, ACTION, hidden_sizes=(4,), critic_hidden_sizes=(6,), activation="elu")
    template = sac.critics._template  # the structure every member of the VmapEnsemble is called with
    assert isinstance(template, CriticNetwork)
    assert linear_sizes(template.head)[:-1] == [6] and any(type(m) is nn.ELU for m in template.head)
    assert any(type(m) is nn.ELU for m in sac.actor.head) and linear_sizes(sac.actor.head)[:-1] == [4]


@pytest.mark.parametrize("cls, ctor_arg", [(SacAlgorithm, "actor_network_cls"), (DdpgAlgorithm, "actor_network_ctor")])
def test_own_sizes_beside_a_network_constructor_are_refused(cls, ctor_arg):
    with pytest.raises(ValueError, match=rf"{cls.__name__}.actor_hidden_sizes=\(8,\) sizes the default actor network, "
                                         "but an? actor network constructor is given"):
        cls(BOX, ACTION, actor_hidden_sizes=(8,), **{ctor_arg: lambda space, dim: nn.Linear(3, dim)})


def test_ppo_net_arch_pi_vf_is_two_scoped_feed_forward_networks(tmp_path, monkeypatch):
    # SB3 net_arch=dict(pi=[32, 16], vf=[64]) for PPO/A2C: scoped FeedForwardNetworks (as the report's translation)

    monkeypatch.chdir(tmp_path)
    load_conf(None, ["pi/FeedForwardNetwork.hidden_sizes = (32, 16)", "vf/FeedForwardNetwork.hidden_sizes = (64,)",
                     "PpoAlgorithm.actor_network_ctor = @pi/FeedForwardNetwork",
                     "PpoAlgorithm.value_network_ctor = @vf/FeedForwardNetwork", "PpoAlgorithm.ortho_init = True"])
    try:
        ppo = PpoAlgorithm(BOX, ACTION)
    finally:
        gin.clear_config()
    assert linear_sizes(ppo.net.policy.head) == [32, 16, 2] and linear_sizes(ppo.net.value_net.head) == [64, 1]
