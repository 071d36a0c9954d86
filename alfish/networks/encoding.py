"""Encoding networks: an observation in its own shape and dtype -> one float feature vector per sample.

``EncodingNetwork`` is the one place where observations are turned into features (DESIGN.md §3.15):
  - images (a Box of rank 3, HWC or CHW, or a uint8 Box of rank 2) go through a conv stack; uint8 pixels arrive as
    they are stored (1 byte each) and are scaled to [0, 1] here, unless a transformer already made them floats (then
    nothing is scaled twice);
  - vectors (any other Box) are flattened, and cast to float32;
  - a Dict observation gets one such encoder per key (an optional per-key MLP for vectors), and the features are
    concatenated in the space's key order;
  - then an optional fully connected stack (``fc_layers``) with LayerNorm and dropout as options;
  - then an optional LSTM/GRU core whose state layout is ``state_spec`` (trained as PPO's shared encoder,
    ``ActorCriticNetworks.encoding_network_ctor``, DQN's, ``DqnAlgorithm.encoding_network_ctor``, or SAC's,
    ``SacAlgorithm.encoding_network_ctor``; ``unroll`` runs it over sequences; other networks refuse a recurrent
    encoder).

Shapes: ``forward(obs)`` takes ``[*batch, *obs_shape]`` (a dict of such tensors for a Dict space) and returns
``[*batch, output_size]``.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import gin
import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from alfish.data.state import reset_state_at_first
from alfish.networks.mlp import activation_class, fc_stack

#: The conv stack of Mnih et al. 2015 (Nature DQN): (out_channels, kernel, stride) per layer, no padding.
NATURE_CNN = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
#: The channels of the IMPALA ResNet's three sections (Espeholt et al. 2018).
IMPALA_CHANNELS = (16, 32, 32)
CONV_PRESETS = ("nature", "impala")
RNN_KINDS = ("lstm", "gru")

ConvSpec = Union[str, Sequence[Sequence[int]]]


def is_image_space(space: gym.Space) -> bool:
    """A Box of rank 3 (HWC or CHW), or a uint8 Box of rank 2 (one grey channel)."""
    return isinstance(space, gym.spaces.Box) and (
        len(space.shape) == 3 or (len(space.shape) == 2 and space.dtype == np.uint8))


def is_flat_space(space: gym.Space) -> bool:
    """True when a plain MLP can read the observation as one float vector: a Box of rank <= 1, or a Dict of those."""
    if isinstance(space, gym.spaces.Dict):
        return all(is_flat_space(s) for s in space.spaces.values())
    return isinstance(space, gym.spaces.Box) and len(space.shape) <= 1


def channels_last_layout(shape: Sequence[int]) -> bool:
    """Whether a rank-3 image shape is HWC: the last axis is the shorter end (``(84, 84, 4)``), else CHW
    (``(4, 84, 84)``). Equal ends count as CHW, PyTorch's layout."""
    return shape[-1] < shape[0]


class ResidualBlock(nn.Module):
    """IMPALA's residual block: ``x + conv(relu(conv(relu(x))))``, 3x3 convs keeping the channels."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Not in place: x itself is added back.
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


def impala_stack(in_channels: int, channels: Sequence[int] = IMPALA_CHANNELS) -> nn.Sequential:
    """The IMPALA ResNet: per section a 3x3 conv, a 3x3 max-pool of stride 2, two residual blocks; a ReLU at the end."""
    layers: list[nn.Module] = []
    for out in channels:
        layers += [nn.Conv2d(in_channels, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                   ResidualBlock(out), ResidualBlock(out)]
        in_channels = out
    layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def conv_stack(in_channels: int, spec: ConvSpec, activation: str = "relu") -> nn.Sequential:
    """``'nature'``, ``'impala'`` or a sequence of ``(out_channels, kernel, stride[, padding])``; an activation after
    each conv of a sequence (the presets have their own)."""
    if isinstance(spec, str):
        if spec not in CONV_PRESETS:
            raise ValueError(f"EncodingNetwork.conv_layers='{spec}' is not a preset; choose one of {CONV_PRESETS} "
                             "or give (out_channels, kernel, stride) per layer")
        if spec == "impala":
            return impala_stack(in_channels)
        spec = NATURE_CNN
    act = activation_class(activation)
    layers: list[nn.Module] = []
    for layer in spec:
        if len(layer) not in (3, 4):
            raise ValueError(f"EncodingNetwork.conv_layers entry {tuple(layer)} must be (out_channels, kernel, stride"
                             "[, padding])")
        out, kernel, stride, *padding = (int(v) for v in layer)
        layers += [nn.Conv2d(in_channels, out, kernel, stride, padding[0] if padding else 0), act()]
        in_channels = out
    return nn.Sequential(*layers)


MEMORY_FORMATS = ("channels_last", "contiguous")


class ImageEncoder(nn.Module):
    """``[N, *image_shape]`` (uint8 or float, HWC or CHW, or HW) -> ``[N, features]`` through a conv stack.

    memory_format: how the convs' weights and activations lie in memory. ``'channels_last'`` (NHWC, the default):
    oneDNN's CPU convolutions run it ~1.3x (batch 32) to ~1.8x (batch 256) faster for the Nature CNN's forward +
    backward on the development machine (``tools/bench/bench_atari.py --floor_only``), and cuDNN's tensor-core kernels
    want it under AMP; an HWC image already lies that way. ``'contiguous'``: NCHW, PyTorch's default.
    """

    def __init__(self, space: gym.spaces.Box, conv_layers: ConvSpec, activation: str,
                 channels_last: Optional[bool] = None, memory_format: str = "channels_last"):
        super().__init__()
        if memory_format not in MEMORY_FORMATS:
            raise ValueError(f"EncodingNetwork.memory_format='{memory_format}' is not one of {MEMORY_FORMATS}")
        shape = tuple(space.shape)
        self.grey = len(shape) == 2
        self.channels_last = False if self.grey else (
            channels_last_layout(shape) if channels_last is None else channels_last)
        chw = (1, *shape) if self.grey else ((shape[2], shape[0], shape[1]) if self.channels_last else shape)
        self.scale = 1.0 / 255.0 if space.dtype == np.uint8 else None
        self.memory_format = torch.channels_last if memory_format == "channels_last" else torch.contiguous_format
        self.convs = conv_stack(chw[0], conv_layers, activation).to(memory_format=self.memory_format)
        try:
            with torch.no_grad():
                out = self.convs(torch.zeros((1, *chw)))
        except RuntimeError:
            out = torch.zeros(0)
        if out.numel() == 0:
            raise ValueError(f"EncodingNetwork.conv_layers={conv_layers!r} do not fit a {chw} (C, H, W) image: a "
                             "kernel is larger than what is left of it; give smaller kernels or strides as "
                             "(out_channels, kernel, stride) per layer")
        self.output_size = int(out.numel())

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = image.unsqueeze(1) if self.grey else (image.permute(0, 3, 1, 2) if self.channels_last else image)
        # uint8 -> float here, once (the buffer and the batch that crossed to the device hold 1 byte per pixel), and
        # into the convs' memory format in the same copy.
        x = x.to(dtype=torch.float32, memory_format=self.memory_format)
        if self.scale is not None:
            # in place only on the copy .to() made of a non-float input, never on the caller's tensor
            x = x.mul_(self.scale) if image.dtype != torch.float32 else x * self.scale
        return self.convs(x).flatten(1)  # features in (C, H, W) order whatever the memory format


class VectorEncoder(nn.Module):
    """``[N, *shape]`` -> ``[N, prod(shape)]`` float32, optionally through an MLP (``fc_layers``)."""

    def __init__(self, space: gym.spaces.Box, fc_layers: Sequence[int] = (), activation: str = "relu",
                 layer_norm: bool = False, dropout: float = 0.0):
        super().__init__()
        self.in_size = int(np.prod(space.shape)) if space.shape else 1
        self.fc = fc_stack(self.in_size, fc_layers, activation, layer_norm, dropout)
        self.output_size = fc_layers[-1] if fc_layers else self.in_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.reshape(x.shape[0], self.in_size).to(torch.float32))


@gin.configurable
class EncodingNetwork(nn.Module):
    """Observation ``[*batch, *obs_shape]`` (or a dict of them) -> features ``[*batch, output_size]``.

    Args:
        observation_space: a Box or a Dict of Boxes, as the algorithm sees it (after the data transformers).
        conv_layers: the conv stack of image observations: ``'nature'`` (Mnih et al. 2015), ``'impala'`` (Espeholt et
            al. 2018) or ``(out_channels, kernel, stride[, padding])`` per layer.
        fc_layers: fully connected layers after the (concatenated) encoders; ``()``: none.
        key_fc_layers: an MLP for each vector key of a Dict observation before concatenation; ``()``: flattened only.
        activation: of the fc layers and a listed conv stack (see ``alfish.networks.mlp.ACTIVATIONS``).
        layer_norm: LayerNorm after each fc layer, before its activation (as RLPD's critics).
        dropout: dropout probability after each fc activation (0: none).
        channels_last: layout of rank-3 images; ``None``: inferred (HWC when the last axis is the shortest).
        rnn: ``None``, ``'lstm'`` or ``'gru'``: a recurrent core of ``rnn_size`` units after the fc layers.
        rnn_size: units of the recurrent core.
        memory_format: ``'channels_last'`` (default, faster convs) or ``'contiguous'``; see ``ImageEncoder``.
        key_encoder_ctors: for a Dict observation, ``{key: ctor}`` replacing the default encoder of those keys (a
            user's preprocessing network per key): ``ctor(space_of_key)`` -> a module ``[N, *key_shape] -> [N, F]``
            with an int attribute ``output_size`` (``F``).
    """

    def __init__(self, observation_space: gym.Space, conv_layers: ConvSpec = "nature", fc_layers: Sequence[int] = (),
                 key_fc_layers: Sequence[int] = (), activation: str = "relu", layer_norm: bool = False,
                 dropout: float = 0.0, channels_last: Optional[bool] = None, rnn: Optional[str] = None,
                 rnn_size: int = 256, key_encoder_ctors: Optional[dict[str, Callable[..., nn.Module]]] = None,
                 memory_format: str = "channels_last"):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"EncodingNetwork.dropout={dropout} must be in [0, 1)")
        if rnn is not None and rnn not in RNN_KINDS:
            raise ValueError(f"EncodingNetwork.rnn='{rnn}' is not one of {RNN_KINDS} (or None)")
        self.observation_space = observation_space
        self.keys: Optional[list[str]] = None
        custom = dict(key_encoder_ctors or {})

        def image_encoder(box: gym.spaces.Box) -> nn.Module:
            return ImageEncoder(box, conv_layers, activation, channels_last, memory_format)

        def vector_encoder(box: gym.spaces.Box, layers: Sequence[int]) -> nn.Module:
            return VectorEncoder(box, layers, activation, layer_norm, dropout)

        if isinstance(observation_space, gym.spaces.Dict):
            self.keys = list(observation_space.spaces)
            unknown = sorted(set(custom) - set(self.keys))
            if unknown:
                raise ValueError(f"EncodingNetwork.key_encoder_ctors names {unknown}, which the observation does not "
                                 f"have; its keys are {self.keys}")
            self.encoders = nn.ModuleDict({
                key: self._custom_encoder(custom[key], space, key) if key in custom else
                self._leaf_encoder(space, key, image_encoder, lambda box: vector_encoder(box, key_fc_layers))
                for key, space in observation_space.spaces.items()})
            size = sum(e.output_size for e in self.encoders.values())
        else:
            if custom:
                raise ValueError(f"EncodingNetwork.key_encoder_ctors needs a Dict observation; this one is "
                                 f"{observation_space}")
            self.encoder = self._leaf_encoder(observation_space, "observation", image_encoder,
                                              lambda box: vector_encoder(box, ()))
            size = self.encoder.output_size
        self._obs_rank = {k: len(s.shape) for k, s in self._leaf_spaces().items()}
        self.fc = fc_stack(size, fc_layers, activation, layer_norm, dropout)
        size = fc_layers[-1] if fc_layers else size
        self.rnn_kind = rnn
        self.rnn: Optional[nn.Module] = None
        if rnn is not None:
            self.rnn = (nn.LSTMCell if rnn == "lstm" else nn.GRUCell)(size, rnn_size)
            size = rnn_size
        self.output_size = size

    @staticmethod
    def _leaf_encoder(space: gym.Space, name: str, image_encoder: Callable[[gym.spaces.Box], nn.Module],
                      vector_encoder: Callable[[gym.spaces.Box], nn.Module]) -> nn.Module:
        """The encoder of one Box leaf ``name``: ``image_encoder`` for an image, ``vector_encoder`` for a vector."""
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(f"EncodingNetwork encodes Box observations (or a Dict of them); {name} is {space}")
        if is_image_space(space):
            return image_encoder(space)
        if len(space.shape) > 3:
            raise ValueError(f"EncodingNetwork cannot tell how to encode {name} of shape {space.shape}: images are "
                             "rank 3 (HWC or CHW) or uint8 rank 2; write a network class for it")
        return vector_encoder(space)

    @staticmethod
    def _custom_encoder(ctor: Callable[..., nn.Module], space: gym.Space, key: str) -> nn.Module:
        encoder = ctor(space)
        if not isinstance(getattr(encoder, "output_size", None), int):
            raise ValueError(f"EncodingNetwork.key_encoder_ctors['{key}'] = {ctor} must build a module with an int "
                             "attribute output_size (its feature size)")
        return encoder

    def _leaf_spaces(self) -> dict[str, gym.spaces.Box]:
        space = self.observation_space
        return dict(space.spaces) if self.keys is not None else {"observation": space}

    @property
    def recurrent(self) -> bool:
        return self.rnn is not None

    def state_spec(self) -> Any:
        """Shapes of one sample's recurrent state: ``((rnn_size,), (rnn_size,))`` (LSTM's h, c), ``(rnn_size,)`` (GRU)
        or ``()`` without a core."""
        if self.rnn is None:
            return ()
        size = (self.rnn.hidden_size,)
        return (size, size) if self.rnn_kind == "lstm" else size

    def initial_state(self, batch_size: int, device: Optional[torch.device] = None) -> Any:
        """Zeros of ``state_spec`` for ``batch_size`` samples (``()`` without a core)."""
        if self.rnn is None:
            return ()
        zeros = lambda: torch.zeros(batch_size, self.rnn.hidden_size, device=device)  # noqa: E731
        return (zeros(), zeros()) if self.rnn_kind == "lstm" else zeros()

    def encode(self, obs: Any) -> torch.Tensor:
        """``[*batch, *obs]`` -> ``[*batch, features]`` before the recurrent core."""
        leaves = {k: obs[k] for k in self.keys} if self.keys is not None else {"observation": obs}
        first_key, first = next(iter(leaves.items()))
        batch_shape = first.shape[:first.dim() - self._obs_rank[first_key]]
        # Encoders see one batch dim [N, *leaf_shape]; the batch shape comes back at the end.
        parts = [encoder(leaves[key].reshape((-1,) + tuple(leaves[key].shape[len(batch_shape):])))
                 for key, encoder in self._encoders()]
        features = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
        return self.fc(features).reshape(batch_shape + (-1,))

    def _encoders(self) -> list[tuple[str, nn.Module]]:
        return list(self.encoders.items()) if self.keys is not None else [("observation", self.encoder)]

    def unroll(self, obs: Any, step_type: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """The recurrent core over time-major sequences: ``obs [L, B, ...]``, ``step_type [L, B]``, ``state`` the
        state before step 0 (``[B, ...]``). The feed-forward part runs on all ``L * B`` steps at once; the core steps
        through time, its state reset to ``initial_state`` at each FIRST step (nothing leaks across an episode
        boundary inside a sequence). Returns ``(features [L, B, output_size], state after the last step)``."""
        features = self.encode(obs)  # [L, B, F]
        lstm = self.rnn_kind == "lstm"
        outputs = []
        for t in range(features.shape[0]):
            state = reset_state_at_first(state, step_type[t], self.initial_state)
            state = self.rnn(features[t], state)
            outputs.append(state[0] if lstm else state)
        return torch.stack(outputs), state

    def forward(self, obs: Any, state: Any = None) -> Any:
        """Features ``[*batch, output_size]``; with a recurrent core, ``(features [N, output_size], new_state)`` of one
        step from ``state`` (``initial_state`` when ``None``), for a batch ``[N]``."""
        features = self.encode(obs)
        if self.rnn is None:
            return features
        if state is None:
            state = self.initial_state(features.shape[0], features.device)
        new_state = self.rnn(features, state)
        return (new_state[0] if self.rnn_kind == "lstm" else new_state), new_state
