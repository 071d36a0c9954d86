"""The networks algorithms are built from, over observations in their own shape and dtype.

Constructor contract (what a user's network class must accept, so gin can hand it to an algorithm in place of these):
  - actor / Q / value / policy networks: ``cls(observation_space, output_dim)``, ``forward(obs [N, *obs]) -> [N,
    output_dim]``;
  - critic networks: ``cls(observation_space, action_dim)``, ``forward(obs [N, *obs], action [N, action_dim]) ->
    [N, 1]`` (the algorithm makes an ensemble of them with ``VmapEnsemble``).
``obs`` is what the algorithm sees after the data transformers: uint8 images stay uint8, dicts stay dicts.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import gin
import gymnasium as gym
import torch
from torch import nn

from alfish.networks.encoding import EncodingNetwork
from alfish.networks.mlp import MLP


def refuse_overridden_bindings(configurable: str, params: Sequence[str], owner: str) -> None:
    """An error if the conf binds ``configurable.<param>`` for a network the algorithm ``owner`` builds itself and
    sizes with its own arguments (the binding would do nothing)."""
    for param in params:
        try:
            gin.query_parameter(f"{configurable}.{param}")
        except ValueError:  # not bound
            continue
        raise ValueError(f"{configurable}.{param} is bound, but {owner} builds its default {configurable} with its own "
                         f"{param}: set {owner}.{param} instead, or give the network as a constructor (e.g. "
                         f"{owner}'s *_network_cls / *_network_ctor = @{configurable})")


def build_encoder(ctor: Callable[..., nn.Module], observation_space: gym.Space,
                  allow_recurrent: bool = False) -> nn.Module:
    """``ctor(observation_space)``, checked: it sets an int ``output_size``, and is not recurrent unless
    ``allow_recurrent`` (the encoders that PPO and DQN train with a state)."""
    encoder = ctor(observation_space)
    if getattr(encoder, "recurrent", False) and not allow_recurrent:
        raise ValueError("a recurrent encoder (EncodingNetwork.rnn) is trained only as the shared encoder of PPO "
                         "(ActorCriticNetworks.encoding_network_ctor), DQN (DqnAlgorithm.encoding_network_ctor) or SAC "
                         "(SacAlgorithm.encoding_network_ctor); set EncodingNetwork.rnn = None here")
    if not isinstance(getattr(encoder, "output_size", None), int):
        raise ValueError(f"encoding network {ctor} must set an int attribute output_size (its feature size)")
    return encoder


@gin.configurable
class FeedForwardNetwork(nn.Module):
    """``obs -> [N, output_dim]``: an encoding network, then an MLP head.

    Args:
        observation_space, output_dim: given by the algorithm.
        hidden_sizes, activation, layer_norm, dropout: the MLP head (see ``MLP``).
        encoding_network_ctor: ``ctor(observation_space)`` -> a module with ``output_size`` (``EncodingNetwork``).
        output_gain: orthogonal init gain of the last layer (``None``: PyTorch's default init).
    """

    def __init__(self, observation_space: gym.Space, output_dim: int, hidden_sizes: Sequence[int] = (256, 256),
                 activation: str = "relu", layer_norm: bool = False, dropout: float = 0.0,
                 encoding_network_ctor: Callable[..., nn.Module] = EncodingNetwork,
                 output_gain: float | None = None):
        super().__init__()
        self.encoder = build_encoder(encoding_network_ctor, observation_space)
        self.head = MLP(self.encoder.output_size, output_dim, hidden_sizes, activation, output_gain, layer_norm,
                        dropout)

    def forward(self, obs: Any) -> torch.Tensor:
        return self.head(self.encoder(obs))


@gin.configurable
class CriticNetwork(nn.Module):
    """``(obs, action [N, action_dim]) -> [N, 1]``: the encoded observation and the action, concatenated, then an MLP.

    Args as ``FeedForwardNetwork`` (``layer_norm=True`` gives RLPD's critic).
    """

    def __init__(self, observation_space: gym.Space, action_dim: int, hidden_sizes: Sequence[int] = (256, 256),
                 activation: str = "relu", layer_norm: bool = False, dropout: float = 0.0,
                 encoding_network_ctor: Callable[..., nn.Module] = EncodingNetwork):
        super().__init__()
        self.encoder = build_encoder(encoding_network_ctor, observation_space)
        self.head = MLP(self.encoder.output_size + action_dim, 1, hidden_sizes, activation, None, layer_norm, dropout)

    def forward(self, obs: Any, action: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.encoder(obs), action], -1))


class EncodedHead(nn.Module):
    """``obs -> [N, output_dim]``: an encoder (``EncodingNetwork``, possibly recurrent), then an MLP head.

    Recurrent encoder: ``forward(obs, state)`` returns ``(output, next state)`` and ``unroll`` runs time-major
    sequences (the state reset at FIRST steps); otherwise ``forward(obs)`` returns the output.
    """

    def __init__(self, encoder: nn.Module, output_dim: int, hidden_sizes: Sequence[int] = (256, 256),
                 activation: str = "relu"):
        super().__init__()
        self.encoder = encoder
        self.head = MLP(encoder.output_size, output_dim, hidden_sizes, activation)

    @property
    def recurrent(self) -> bool:
        return bool(getattr(self.encoder, "recurrent", False))

    def initial_state(self, batch_size: int, device: Optional[torch.device] = None) -> Any:
        return self.encoder.initial_state(batch_size, device) if self.recurrent else ()

    def forward(self, obs: Any, state: Any = None) -> Any:
        if not self.recurrent:
            return self.head(self.encoder(obs))
        features, state = self.encoder(obs, state)
        return self.head(features), state

    def unroll(self, obs: Any, step_type: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """``obs [L, B, ...]`` from ``state`` -> ``(output [L, B, output_dim], state after the last step)``."""
        features, state = self.encoder.unroll(obs, step_type, state)
        return self.head(features), state
