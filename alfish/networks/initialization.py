"""SB3's ``ortho_init`` for policy-gradient networks: orthogonal weights and zero biases (``ortho_init=True``), or
PyTorch's default initialisation (``ortho_init=False``), applied to the Linear and convolution layers of modules
already built. Recurrent cores (LSTM/GRU) are left as they were built."""
from __future__ import annotations

import math
from typing import Iterable, Optional

from torch import nn

HIDDEN_GAIN = math.sqrt(2.0)  # SB3's gain for the feature extractor and the hidden layers (ReLU's He gain)
POLICY_GAIN = 0.01            # SB3's action_net gain: a near-uniform initial policy
VALUE_GAIN = 1.0              # SB3's value_net gain

_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _layers(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, _LAYERS)]


def orthogonal_init_(module: nn.Module, hidden_gain: float, output_gain: Optional[float]) -> None:
    """Every Linear/conv layer of ``module``: orthogonal weight, zero bias; gain ``hidden_gain``, except the last layer
    registered (an MLP's or a head's output layer), which gets ``output_gain`` (``None``: ``hidden_gain`` too)."""
    layers = _layers(module)
    for i, layer in enumerate(layers):
        last = i == len(layers) - 1 and output_gain is not None
        nn.init.orthogonal_(layer.weight, gain=output_gain if last else hidden_gain)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)


def default_init_(module: nn.Module) -> None:
    """PyTorch's default initialisation (``reset_parameters``) of every Linear/conv layer of ``module``."""
    for layer in _layers(module):
        layer.reset_parameters()


def init_policy_value(ortho_init: Optional[bool], policy: nn.Module, value: nn.Module,
                      encoder: Optional[nn.Module] = None) -> None:
    """SB3's ``ortho_init`` on an actor-critic's networks, after they are built.

    ``True``: orthogonal init, zero biases: gain sqrt(2) for the shared ``encoder`` and the hidden layers, 0.01 for
    the policy's output layer, 1 for the value's. ``False``: PyTorch's default init everywhere (SB3's
    ``ortho_init=False``: no orthogonal output layers either). ``None``: nothing changes (alfish's own init: PyTorch's
    default for the hidden layers, orthogonal output layers of gain 0.01 and 1).
    """
    if ortho_init is None:
        return
    parts: Iterable[tuple[nn.Module, Optional[float]]] = [(policy, POLICY_GAIN), (value, VALUE_GAIN)]
    if encoder is not None:
        parts = [(encoder, None), *parts]
    for module, output_gain in parts:
        if ortho_init:
            orthogonal_init_(module, HIDDEN_GAIN, output_gain)
        else:
            default_init_(module)
