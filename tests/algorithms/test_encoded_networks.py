"""Every algorithm on image and dict observations: raw mode (networks see uint8 images and dicts), an update on the
``meta`` device (no host sync, every tensor where its inputs live), gradients where they belong, conv critics as one
``VmapEnsemble``; and a user's network classes given under ALF's parameter names."""
from __future__ import annotations

import gin
import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from alfish.algorithms import (
    A2cAlgorithm,
    BcAlgorithm,
    DdpgAlgorithm,
    DqnAlgorithm,
    IqlAlgorithm,
    PpoAlgorithm,
    SacAlgorithm,
    Td3Algorithm,
)
from alfish.algorithms.ppo import PpoExperienceInfo
from alfish.data.types import Experience, StepType, TimeStep
from alfish.networks.encoding import EncodingNetwork
from alfish.networks.ensemble import EnsembleCritic, VmapEnsemble
from alfish.networks.heads import FeedForwardNetwork

META = torch.device("meta")
IMAGE = gym.spaces.Box(0, 255, (1, 6, 6), np.uint8)
DICT = gym.spaces.Dict({"image": IMAGE, "goal": gym.spaces.Box(-1, 1, (2,), np.float32)})
BOX = gym.spaces.Box(-1.0, 1.0, (2,))
DISCRETE = gym.spaces.Discrete(3)
L_, B_ = 2, 4


@pytest.fixture(autouse=True)
def small_convs():
    with gin.unlock_config():
        gin.bind_parameter("EncodingNetwork.conv_layers", ((2, 3, 1),))
    yield
    gin.clear_config()


def observations(space: gym.Space, *shape: int, device: torch.device = META):
    if isinstance(space, gym.spaces.Dict):
        return {k: observations(s, *shape, device=device) for k, s in space.spaces.items()}
    return torch.empty(shape + space.shape, dtype=torch.uint8 if space.dtype == np.uint8 else torch.float32,
                       device=device)


def experience(space: gym.Space, action_space: gym.Space, *shape: int, rollout_info=()) -> Experience:
    action = (torch.zeros(shape, dtype=torch.int64, device=META) if isinstance(action_space, gym.spaces.Discrete)
              else torch.empty(shape + action_space.shape, device=META))
    return Experience(step_type=torch.full(shape, StepType.MID, dtype=torch.int8, device=META),
                      reward=torch.empty(shape, device=META), discount=torch.ones(shape, device=META),
                      observation=observations(space, *shape), action=action,
                      env_id=torch.zeros(shape, dtype=torch.int64, device=META), rollout_info=rollout_info)


def update_on_meta(alg, exp: Experience) -> None:
    loss = alg.calc_loss(exp, alg.train_step(exp).info).loss.mean()
    loss.backward()
    assert loss.device == META


@pytest.mark.parametrize("space", [IMAGE, DICT], ids=["image", "dict"])
@pytest.mark.parametrize("cls", [SacAlgorithm, Td3Algorithm, DdpgAlgorithm, IqlAlgorithm])
def test_actor_critic_algorithms_train_from_pixels_on_meta(cls, space):
    torch.manual_seed(0)
    alg = cls(space, BOX, hidden_sizes=(8,)).to(META)
    assert alg.raw_observations and isinstance(alg.critics, VmapEnsemble)
    assert isinstance(alg.actor, FeedForwardNetwork) and isinstance(alg.actor.encoder, EncodingNetwork)
    update_on_meta(alg, experience(space, BOX, L_, B_))
    assert all(p.grad is not None for p in alg.critics.parameters())
    actor_trained = cls is not Td3Algorithm  # TD3's first update is not an actor update (policy_delay 2)
    assert all((p.grad is not None) == actor_trained for p in alg.actor.parameters())
    assert all(p.grad is None for p in alg.target_critics.parameters())
    action = alg.predict_step(TimeStep(torch.ones(3, dtype=torch.int8, device=META), torch.empty(3, device=META),
                                       torch.ones(3, device=META), observations(space, 3), torch.empty(3, 2,
                                                                                                      device=META),
                                       torch.arange(3, device=META))).output
    assert action.shape == (3, 2) and action.device == META


@pytest.mark.parametrize("space", [IMAGE, DICT], ids=["image", "dict"])
def test_dqn_trains_from_pixels_on_meta(space):
    alg = DqnAlgorithm(space, DISCRETE, hidden_sizes=(8,)).to(META)
    update_on_meta(alg, experience(space, DISCRETE, 2, B_))
    assert all(p.grad is not None for p in alg.q_net.parameters())
    assert all(p.grad is None for p in alg.target_q_net.parameters())


@pytest.mark.parametrize("cls", [PpoAlgorithm, A2cAlgorithm])
def test_policy_gradient_algorithms_share_one_encoder_between_policy_and_value(cls):
    alg = cls(IMAGE, DISCRETE, hidden_sizes=(8,))
    assert isinstance(alg.net.encoder, EncodingNetwork)
    names = {n.split(".")[1] for n, _ in alg.named_parameters()}
    assert names == {"encoder", "policy", "value_net"}
    out = alg.net.act(torch.randint(0, 256, (5, 1, 6, 6), dtype=torch.uint8), greedy=False)
    (out.log_prob.sum() + out.value.sum()).backward()
    assert all(p.grad is not None for p in alg.parameters())  # the encoder learns from both heads


def test_ppo_trains_from_dicts_on_meta():
    alg = PpoAlgorithm(DICT, BOX, hidden_sizes=(8,)).to(META)
    info = PpoExperienceInfo(*(torch.empty(L_, B_, device=META) for _ in range(4)))
    update_on_meta(alg, experience(DICT, BOX, L_, B_, rollout_info=info))
    assert all(p.grad is not None for p in alg.parameters())


def test_vector_observations_without_constructors_keep_the_flat_mlp_path():
    alg = SacAlgorithm(gym.spaces.Box(-1, 1, (3,)), BOX, hidden_sizes=(8,))
    assert not alg.raw_observations and isinstance(alg.critics, EnsembleCritic)
    assert set(alg.state_dict()) >= {"actor.0.weight", "critics.weights.0", "target_critics.biases.1"}


class UserQ(nn.Module):
    def __init__(self, observation_space, num_actions):
        super().__init__()
        self.observation_space = observation_space
        self.layer = nn.Linear(int(np.prod(observation_space.shape)), num_actions)

    def forward(self, obs):
        return self.layer(obs.flatten(1).float())


class UserCritic(nn.Module):
    def __init__(self, observation_space, action_dim):
        super().__init__()
        self.layer = nn.Linear(observation_space.shape[0] + action_dim, 1)

    def forward(self, obs, action):
        return self.layer(torch.cat([obs, action], -1))


def test_user_networks_are_called_with_the_space_and_output_size_and_see_raw_observations():
    alg = DqnAlgorithm(IMAGE, DISCRETE, q_network_cls=UserQ)
    assert isinstance(alg.q_net, UserQ) and alg.q_net.observation_space is IMAGE and alg.raw_observations
    obs = torch.randint(0, 256, (2, 1, 6, 6), dtype=torch.uint8)
    assert alg.network_input(obs) is obs  # uint8, unflattened
    sac = SacAlgorithm(gym.spaces.Box(-1, 1, (3,)), BOX, critic_network_cls=UserCritic, num_critics=3)
    assert isinstance(sac.critics, VmapEnsemble) and sac.critics.num_members == 3
    assert sac.critics.members["layer__weight"].shape == (3, 1, 5)
    q = sac.critics(torch.randn(4, 3), torch.randn(4, 2))
    assert q.shape == (3, 4, 1)


@pytest.mark.parametrize("cls", [DqnAlgorithm, SacAlgorithm, BcAlgorithm])
def test_a_recurrent_encoder_is_refused_where_no_recurrent_training_exists(cls):
    with gin.unlock_config():
        gin.bind_parameter("EncodingNetwork.rnn", "gru")
    action_space = BOX if cls is SacAlgorithm else DISCRETE
    with pytest.raises(ValueError, match=r"a recurrent encoder \(EncodingNetwork.rnn\) is trained only as"):
        cls(IMAGE, action_space, hidden_sizes=(8,))


def test_ppo_with_a_recurrent_default_encoder_is_recurrent():
    with gin.unlock_config():
        gin.bind_parameter("EncodingNetwork.rnn", "gru")
        gin.bind_parameter("EncodingNetwork.rnn_size", 8)
    alg = PpoAlgorithm(IMAGE, DISCRETE, hidden_sizes=(8,))
    assert alg.recurrent and alg.initial_state(3).shape == (3, 8)


def test_a_binding_the_default_network_would_ignore_is_an_error():
    with gin.unlock_config():
        gin.bind_parameter("FeedForwardNetwork.hidden_sizes", (32,))
    with pytest.raises(ValueError, match=r"FeedForwardNetwork.hidden_sizes is bound, but DqnAlgorithm builds its "
                                         r"default FeedForwardNetwork with its own hidden_sizes: set "
                                         r"DqnAlgorithm.hidden_sizes instead"):
        DqnAlgorithm(IMAGE, DISCRETE)
    # named as the constructor, the binding applies
    alg = DqnAlgorithm(IMAGE, DISCRETE, q_network_cls=FeedForwardNetwork)
    assert [m.out_features for m in alg.q_net.head if isinstance(m, nn.Linear)] == [32, 3]
