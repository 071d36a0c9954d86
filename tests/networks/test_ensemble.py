"""VmapEnsemble: E copies of any network as one vmap; EnsembleCritic: the MLP critics over [obs, action]."""
import copy

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from alfish.networks.ensemble import EnsembleCritic, VmapEnsemble
from alfish.networks.heads import CriticNetwork


class SmallCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(5, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, obs, action):
        return self.body(torch.cat([obs, action], -1))


def member(ensemble: VmapEnsemble, e: int) -> SmallCritic:
    """Member e as a plain module, built from the stacked parameters."""
    one = SmallCritic()
    params = {name: ensemble.members[name.replace(".", "__")][e] for name, _ in one.named_parameters()}
    one.load_state_dict(params)
    return one


def test_members_are_independent_and_the_vmap_equals_each_member_alone():
    torch.manual_seed(0)
    ens = VmapEnsemble(SmallCritic, 3)
    assert ens.members["body__0__weight"].shape == (3, 8, 5)
    assert not torch.equal(ens.members["body__0__weight"][0], ens.members["body__0__weight"][1])
    obs, act = torch.randn(7, 3), torch.randn(7, 2)
    out = ens(obs, act)
    assert out.shape == (3, 7, 1)
    for e in range(3):
        torch.testing.assert_close(out[e], member(ens, e)(obs, act))


def test_members_slice_and_detached_parameters():
    torch.manual_seed(0)
    ens = VmapEnsemble(SmallCritic, 2)
    obs, act = torch.randn(4, 3), torch.randn(4, 2, requires_grad=True)
    first = ens(obs, act, members=slice(0, 1))
    assert first.shape == (1, 4, 1)
    torch.testing.assert_close(first[0], ens(obs, act)[0])
    ens(obs, act, detach_params=True).sum().backward()
    assert act.grad is not None and all(p.grad is None for p in ens.parameters())
    ens(obs, act).sum().backward()
    assert all(p.grad is not None for p in ens.parameters())


def test_copies_follow_the_state_dict_and_polyak_updates():
    torch.manual_seed(0)
    ens = VmapEnsemble(SmallCritic, 2)
    target = copy.deepcopy(ens).requires_grad_(False)
    with torch.no_grad():
        for p in ens.parameters():
            p.add_(1.0)
        torch._foreach_lerp_(list(target.parameters()), list(ens.parameters()), 1.0)
    obs, act = torch.randn(3, 3), torch.randn(3, 2)
    torch.testing.assert_close(target(obs, act), ens(obs, act))
    fresh = VmapEnsemble(SmallCritic, 2)
    fresh.load_state_dict(ens.state_dict())
    torch.testing.assert_close(fresh(obs, act), ens(obs, act))


def test_conv_critics_of_a_pixel_observation_form_one_ensemble():
    torch.manual_seed(0)
    space = gym.spaces.Box(0, 255, (1, 6, 6), np.uint8)
    import functools

    from alfish.networks.encoding import EncodingNetwork
    enc = functools.partial(EncodingNetwork, conv_layers=((2, 3, 1),))
    ens = VmapEnsemble(lambda: CriticNetwork(space, 2, hidden_sizes=(8,), encoding_network_ctor=enc), 2)
    obs = torch.randint(0, 256, (5, 1, 6, 6), dtype=torch.uint8)
    act = torch.randn(5, 2)
    out = ens(obs, act)
    assert out.shape == (2, 5, 1)
    names = [n for n, _ in CriticNetwork(space, 2, hidden_sizes=(8,), encoding_network_ctor=enc).named_parameters()]
    for e in range(2):
        params = {n: ens.members[n.replace(".", "__")][e] for n in names}
        torch.testing.assert_close(out[e], functional_call(ens._template.to_empty(device="cpu"), params, (obs, act)))


def test_ensemble_critic_concatenates_observation_and_action():
    torch.manual_seed(0)
    critic = EnsembleCritic(2, 5, 1, (8,))
    obs, act = torch.randn(4, 3), torch.randn(4, 2)
    torch.testing.assert_close(critic(obs, act), super(EnsembleCritic, critic).forward(torch.cat([obs, act], -1)))
    assert set(critic.state_dict()) == {"weights.0", "weights.1", "biases.0", "biases.1"}  # EnsembleMLP's keys
