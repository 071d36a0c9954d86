"""Multi-layer perceptrons: a plain one and an ensemble computed as one batched matmul per layer."""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import gin
import torch
from torch import nn

# ReLU runs in place: the preceding matmul's backward needs its inputs, not its output, so overwriting the output is
# safe and saves an allocation and a memory pass per layer.
ACTIVATIONS = {"relu": functools.partial(nn.ReLU, inplace=True), "tanh": nn.Tanh, "elu": nn.ELU, "gelu": nn.GELU,
               "silu": nn.SiLU}


def activation_class(name: str) -> Callable[[], nn.Module]:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation '{name}'; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


@gin.configurable
class MLP(nn.Sequential):
    """``[N, in_dim] -> [N, out_dim]`` through ``hidden_sizes`` with ``activation`` between layers."""

    def __init__(self, in_dim: int, out_dim: int, hidden_sizes: Sequence[int] = (256, 256),
                 activation: str = "relu", output_gain: float | None = None):
        act = activation_class(activation)
        layers: list[nn.Module] = []
        dims = [in_dim, *hidden_sizes]
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), act()]
        layers.append(nn.Linear(dims[-1], out_dim))
        super().__init__(*layers)
        if output_gain is not None:  # e.g. a small policy head, as SB3/CleanRL initialise PPO
            nn.init.orthogonal_(layers[-1].weight, gain=output_gain)
            nn.init.zeros_(layers[-1].bias)


class EnsembleMLP(nn.Module):
    """``num_members`` independent MLPs evaluated together.

    Weights are stored as ``[E, in, out]`` so a layer is one ``torch.baddbmm`` for all members (twin critics cost one
    matmul, not two). Input ``[N, in_dim]`` (shared by all members) or ``[E, N, in_dim]``; output ``[E, N, out_dim]``.
    """

    def __init__(self, num_members: int, in_dim: int, out_dim: int, hidden_sizes: Sequence[int] = (256, 256),
                 activation: str = "relu"):
        super().__init__()
        self.num_members = num_members
        dims = [in_dim, *hidden_sizes, out_dim]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for a, b in zip(dims[:-1], dims[1:]):
            # Same init as nn.Linear, drawn independently per member.
            bound = 1.0 / math.sqrt(a)
            w = torch.empty(num_members, a, b)
            for e in range(num_members):
                nn.init.kaiming_uniform_(w[e].T, a=math.sqrt(5))
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.empty(num_members, 1, b).uniform_(-bound, bound)))
        self.activation = activation_class(activation)()

    def forward(self, x: torch.Tensor, detach_params: bool = False) -> torch.Tensor:
        """``detach_params=True`` evaluates with detached weights: gradients flow to ``x`` but not to the ensemble
        (how SAC's actor loss reads the critics without training them)."""
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.num_members, -1, -1)
        n_layers = len(self.weights)
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if detach_params:
                w, b = w.detach(), b.detach()
            x = torch.baddbmm(b, x, w)
            if i < n_layers - 1:
                x = self.activation(x)
        return x
