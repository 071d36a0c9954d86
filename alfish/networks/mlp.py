"""Multi-layer perceptrons: a plain one and an ensemble computed as one batched matmul per layer."""
from __future__ import annotations

import functools
import math
from typing import Callable, Iterator, Optional, Sequence

import gin
import torch
import torch.nn.functional as F
from torch import nn

# ReLU runs in place: the preceding matmul's backward needs its inputs, not its output, so overwriting the output is
# safe and saves an allocation and a memory pass per layer.
# 'leaky_relu' is SB3's nn.LeakyReLU (negative slope 0.01).
ACTIVATIONS = {"relu": functools.partial(nn.ReLU, inplace=True), "tanh": nn.Tanh, "elu": nn.ELU, "gelu": nn.GELU,
               "silu": nn.SiLU, "leaky_relu": nn.LeakyReLU}


def activation_class(name: str) -> Callable[[], nn.Module]:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation '{name}'; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def fc_stack(in_size: int, sizes: Sequence[int], activation: str, layer_norm: bool = False,
             dropout: float = 0.0) -> nn.Sequential:
    """Linear layers of ``sizes``, each followed by LayerNorm (option), the activation and dropout (option)."""
    act = activation_class(activation)
    layers: list[nn.Module] = []
    for size in sizes:
        layers.append(nn.Linear(in_size, size))
        if layer_norm:
            layers.append(nn.LayerNorm(size))
        layers.append(act())
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        in_size = size
    return nn.Sequential(*layers)


@gin.configurable
class MLP(nn.Sequential):
    """``[N, in_dim] -> [N, out_dim]`` through ``hidden_sizes`` with ``activation`` between layers.

    layer_norm: a LayerNorm after each hidden Linear, before its activation (RLPD's critics); dropout: the probability
    of a Dropout after each hidden activation (0: none).
    """

    def __init__(self, in_dim: int, out_dim: int, hidden_sizes: Sequence[int] = (256, 256),
                 activation: str = "relu", output_gain: float | None = None, layer_norm: bool = False,
                 dropout: float = 0.0):
        layers: list[nn.Module] = list(fc_stack(in_dim, hidden_sizes, activation, layer_norm, dropout))
        layers.append(nn.Linear(hidden_sizes[-1] if hidden_sizes else in_dim, out_dim))
        super().__init__(*layers)
        if output_gain is not None:  # e.g. a small policy head, as SB3/CleanRL initialise PPO
            nn.init.orthogonal_(layers[-1].weight, gain=output_gain)
            nn.init.zeros_(layers[-1].bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[*, in_dim] -> [*, out_dim]``, the layers' computations called directly.

        ``nn.Sequential.forward`` goes through every layer's ``nn.Module.__call__`` (hook bookkeeping) and, for ReLU,
        ``F.relu``'s argument handling: together ~25% of a small MLP's forward on the CPU, where a small layer's
        matmul costs a few microseconds. Hooks registered on the MLP itself still run, hooks on its inner layers do
        not.
        """
        for layer in self._modules.values():
            if type(layer) is nn.Linear:
                x = F.linear(x, layer.weight, layer.bias)
            elif type(layer) is nn.ReLU and layer.inplace:
                x = torch.relu_(x)
            else:
                x = layer.forward(x)
        return x

    def parameter_list(self) -> list[nn.Parameter]:
        """``list(self.parameters())``, read from the layers' parameter dicts (a quarter of the time: ``parameters()``
        walks the module tree through generators, ~15 us per call on the CPU; target-network updates call this
        every step). Always the current parameters: nothing is cached."""
        return [p for layer in self._modules.values() for p in layer._parameters.values() if p is not None]


class EnsembleMLP(nn.Module):
    """``num_members`` independent MLPs evaluated together.

    Weights are stored as ``[E, in, out]`` so a layer is one ``torch.baddbmm`` for all members (twin critics cost one
    matmul, not two); a layer with one output unit is a broadcast multiply and a sum instead (see ``forward``).
    Input ``[N, in_dim]`` (shared by all members) or ``[E, N, in_dim]``; output ``[E, N, out_dim]``. ``weights`` and
    ``biases`` (``[E, 1, out]``) are ``ParameterList``s: checkpoints name them ``weights.<layer>`` and
    ``biases.<layer>``.
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

    def layers(self) -> Iterator[tuple[nn.Parameter, nn.Parameter]]:
        """``(weight [E, in, out], bias [E, 1, out])`` of each layer, first to last.

        Read from the lists' parameter dicts rather than by iterating the ``ParameterList``s, whose ``__iter__`` goes
        through ``__getitem__``/``getattr`` per element (about 4 us per layer on the CPU, per forward); the dicts
        always hold the current parameters, whatever ``load_state_dict``, ``.to()`` or an assignment did.
        """
        return zip(self.weights._parameters.values(), self.biases._parameters.values())

    def parameter_list(self) -> list[nn.Parameter]:
        """``list(self.parameters())`` (the weights, then the biases), read from the lists' parameter dicts: a third
        of the time of ``parameters()``'s walk of the module tree. Always the current parameters: nothing is
        cached."""
        return [*self.weights._parameters.values(), *self.biases._parameters.values()]

    def forward(self, x: torch.Tensor, detach_params: bool = False, members: Optional[slice] = None) -> torch.Tensor:
        """``[N, in_dim]`` (shared by the members) or ``[E', N, in_dim]`` -> ``[E', N, out_dim]``.

        detach_params: evaluate with detached weights: gradients flow to ``x`` but not to the ensemble (how SAC's
            actor loss reads the critics without training them).
        members: evaluate only these members (``E'`` of them; all by default), e.g. ``slice(0, 1)`` for TD3's actor
            loss, which reads the first critic only: the others then cost neither forward nor backward matmuls.
        """
        params = self._params(detach_params, members)
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(params[0][0].shape[0], -1, -1)
        last = len(params) - 1
        # Not through __call__ (hook bookkeeping per layer), and ReLU straight to the aten op (as in MLP.forward).
        activation = torch.relu_ if type(self.activation) is nn.ReLU and self.activation.inplace \
            else self.activation.forward
        for i, (w, b) in enumerate(params):
            if w.shape[-1] == 1:
                # One output unit (a critic's Q): a broadcast multiply and a sum over the inputs, the same value as
                # the matmul. The matmul's backward is a rank-1 bmm ([E, N, 1] x [E, 1, H]) and a matrix-vector bmm,
                # both slow on the CPU; this one's is broadcast multiplies (measured: SAC and TD3 updates 3-6% faster).
                x = (x * w.transpose(1, 2)).sum(-1, keepdim=True).add_(b)
            else:
                x = torch.baddbmm(b, x, w)
            if i < last:
                x = activation(x)
        return x

    def _params(self, detach: bool, members: Optional[slice]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The ``(weight, bias)`` pairs ``forward`` multiplies with: the parameters, or detached views of them, of all
        members or of ``members``; one aten op per tensor at most."""
        if members is None:
            return [(w.detach(), b.detach()) for w, b in self.layers()] if detach else list(self.layers())
        # Slices taken without grad mode carry no autograd history: the same as slicing and then detaching.
        with torch.set_grad_enabled(torch.is_grad_enabled() and not detach):
            return [(w[members], b[members]) for w, b in self.layers()]


def parameter_list(module: nn.Module) -> list[nn.Parameter]:
    """``list(module.parameters())``: read from the parameter dicts for an ``MLP`` or ``EnsembleMLP`` (their
    ``parameter_list``), walked with ``parameters()`` for any other module (e.g. one a test swapped in)."""
    if isinstance(module, (MLP, EnsembleMLP)):
        return module.parameter_list()
    return list(module.parameters())


def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """``target <- target + tau * (source - target)`` for every parameter, in one fused op, without autograd (target
    networks; ``tau = 1`` copies)."""
    with torch.no_grad():
        torch._foreach_lerp_(parameter_list(target), parameter_list(source), tau)
