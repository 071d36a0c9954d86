"""The trainer's optimizer settings: gradient clipping against torch's reference implementation."""
import pytest
import torch

from alfish.learn.optim import OptimizerConfig


def _grads(seed: int) -> list[torch.nn.Parameter]:
    torch.manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in ((3, 4), (4,), (5,))]
    for p in params:
        p.grad = 3.0 * torch.randn_like(p)
    return params


@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_matches_torch_clip_grad_norm(max_norm):
    ours, ref = _grads(0), _grads(0)
    norm = OptimizerConfig(max_grad_norm=max_norm).clip(ours)
    ref_norm = torch.nn.utils.clip_grad_norm_(ref, max_norm)
    assert torch.allclose(norm, ref_norm)
    for a, b in zip(ours, ref):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)
    # after clipping, the global norm is at most max_norm (hand check of the definition)
    assert float(torch.sqrt(sum((p.grad ** 2).sum() for p in ours))) <= max_norm + 1e-4


def test_no_clipping_and_bad_value():
    assert OptimizerConfig().clip(_grads(1)) is None
    with pytest.raises(ValueError, match="max_grad_norm=-1 must be positive"):
        OptimizerConfig(max_grad_norm=-1)


def test_build_uses_the_algorithm_learning_rates_per_group():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = OptimizerConfig(eps=1e-5).build([{"name": "actor", "params": [a], "lr": 1e-3}, {"params": [b], "lr": 3e-4}])
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 3e-4]
    assert [g["name"] for g in opt.param_groups] == ["actor", "default"]
    assert opt.param_groups[0]["eps"] == 1e-5
