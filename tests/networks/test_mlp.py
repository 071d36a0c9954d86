"""MLP and EnsembleMLP: the direct forward paths equal the module-by-module ones, member selection and detached
evaluation, the fast parameter lists, and checkpoint keys that old checkpoints load into."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from alfish.networks.mlp import MLP, EnsembleMLP, parameter_list


@pytest.mark.parametrize("activation", ["relu", "tanh", "elu", "gelu", "silu"])
def test_mlp_forward_equals_the_sequential_forward(activation):
    torch.manual_seed(0)
    mlp = MLP(5, 3, (16, 8), activation)
    for shape in [(7, 5), (2, 7, 5)]:
        x = torch.randn(shape)
        torch.testing.assert_close(mlp(x), nn.Sequential.forward(mlp, x), rtol=0, atol=0)


def test_mlp_gradients_equal_the_sequential_ones():
    torch.manual_seed(0)
    mlp = MLP(5, 3, (16, 8))
    x = torch.randn(7, 5, requires_grad=True)
    mlp(x).square().sum().backward()
    ours = [p.grad.clone() for p in mlp.parameters()] + [x.grad.clone()]
    mlp.zero_grad()
    x.grad = None
    nn.Sequential.forward(mlp, x).square().sum().backward()
    for a, b in zip(ours, [p.grad for p in mlp.parameters()] + [x.grad]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_mlp_state_dict_keys_are_those_of_the_sequential():
    assert list(MLP(3, 2, (4, 4)).state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight",
                                                    "4.bias"]


def ensemble_ref(ensemble: EnsembleMLP, x: torch.Tensor, e: int) -> torch.Tensor:
    n = len(ensemble.weights)
    for i in range(n):
        x = x @ ensemble.weights[i][e] + ensemble.biases[i][e]
        if i < n - 1:
            x = torch.relu(x)
    return x


def test_ensemble_keys_and_shapes_are_unchanged():
    ensemble = EnsembleMLP(2, 4, 1, (8, 6))
    assert {k: tuple(v.shape) for k, v in ensemble.state_dict().items()} == {
        "weights.0": (2, 4, 8), "weights.1": (2, 8, 6), "weights.2": (2, 6, 1),
        "biases.0": (2, 1, 8), "biases.1": (2, 1, 6), "biases.2": (2, 1, 1)}


@pytest.mark.parametrize("shared", [True, False])
def test_ensemble_forward_is_each_member_by_hand(shared):
    torch.manual_seed(0)
    ensemble = EnsembleMLP(3, 4, 2, (8, 6))
    x = torch.randn(5, 4) if shared else torch.randn(3, 5, 4)
    out = ensemble(x)
    assert out.shape == (3, 5, 2)
    for e in range(3):
        torch.testing.assert_close(out[e], ensemble_ref(ensemble, x if shared else x[e], e))


@pytest.mark.parametrize("detach", [False, True])
def test_ensemble_members_evaluates_only_the_selected_members(detach):
    torch.manual_seed(0)
    ensemble = EnsembleMLP(3, 4, 1, (8, 8))
    x = torch.randn(5, 4, requires_grad=True)
    out = ensemble(x, detach_params=detach, members=slice(1, 3))
    assert out.shape == (2, 5, 1)
    torch.testing.assert_close(out, ensemble(x)[1:3])
    out.sum().backward()
    assert x.grad is not None
    if detach:  # gradients reach the input only
        assert all(p.grad is None for p in ensemble.parameters())
    else:  # only the selected members' slices get gradients
        for p in ensemble.parameters():
            assert bool(p.grad[0].eq(0).all()) and bool(p.grad[1:].ne(0).any())


def test_ensemble_detach_params_passes_gradients_to_the_input_only():
    torch.manual_seed(0)
    ensemble = EnsembleMLP(2, 4, 1, (8,))
    x = torch.randn(5, 4, requires_grad=True)
    ensemble(x, detach_params=True).sum().backward()
    assert x.grad is not None and bool(x.grad.ne(0).any())
    assert all(p.grad is None for p in ensemble.parameters())


@pytest.mark.parametrize("make", [lambda: MLP(3, 2, (4, 4)), lambda: EnsembleMLP(2, 3, 1, (4, 4)),
                                  lambda: nn.Linear(3, 2)], ids=["mlp", "ensemble", "other"])
def test_parameter_list_is_the_current_parameters_after_moves_and_loads(make):
    """Nothing is cached: after ``.to()`` (Parameters kept, data replaced), ``load_state_dict`` (copied in place)
    and ``load_state_dict(assign=True)`` (Parameters replaced) the list is exactly ``list(parameters())``."""
    torch.manual_seed(0)
    module = make()

    def check() -> None:
        fast, slow = parameter_list(module), list(module.parameters())
        assert len(fast) == len(slow) and all(a is b for a, b in zip(fast, slow))

    check()
    module.to(torch.float64)
    check()
    module.load_state_dict(copy.deepcopy(module.state_dict()))
    check()
    module.load_state_dict({k: v.clone() for k, v in module.state_dict().items()}, assign=True)
    check()
    module.to("meta")
    check()
