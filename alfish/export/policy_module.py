"""``ExportedPolicy``: a run's policy as one ``nn.Module`` of plain tensors, the form ``torch.export`` and ONNX take.

    forward(*observations, *state) -> (action, *next_state)

It computes what ``play`` computes with ``--epsilon_greedy 0``: the data transformers' rollout view with their
statistics frozen (``update_stats=False``), then ``algorithm.predict_step(...).output``, then the env's clipping of a
Box action to its bounds (``BatchedEnv`` clips what it is given, so that is the action the env executes).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from alfish.algorithms.base import Algorithm
from alfish.data.state import is_empty
from alfish.data.types import EMPTY, StepType, TimeStep
from alfish.envs.mixed_actions import MixedActionBox
from alfish.envs.spec import EnvSpec, action_layout
from alfish.transforms.base import SequentialDataTransformer


class NotExportableError(ValueError):
    """The policy holds something an exported program cannot compute; the message is one line naming it."""


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of the exported program: its name, the shape of one sample (the batch dim comes first and
    is dynamic) and its dtype (a numpy name: 'float32', 'uint8', 'int64')."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def as_json(self) -> dict:
        return {"name": self.name, "shape": ["batch", *self.shape], "dtype": self.dtype}


class ExportedPolicy(nn.Module):
    """The greedy policy of ``(transformer, algorithm)`` (restored and in eval mode) over raw observations.

    Inputs, in order (``input_specs``):
      - the observation: one tensor ``[B, *obs_shape]`` for a Box space, or one per key of a Dict space, in the
        space's key order, named by the key; dtype as ``BatchedEnv`` gives it (float32, or the Box's integer dtype,
        e.g. uint8 images);
      - recurrent policies only: the state before this step, its leaves ``[B, *leaf_shape]`` (float32 for
        alfish's cores; GRU: ``state``, its ``h``; LSTM: ``state_0``, ``state_1``, its ``h`` and ``c``), all zeros at
        an episode's first step (that is ``algorithm.initial_state``).
    Outputs (``output_specs``): the action, int64 ``[B]`` (Discrete), int64 ``[B, k]`` (MultiDiscrete, MultiBinary)
    or float32 ``[B, *action_shape]`` within the Box's bounds; recurrent policies also the state after this step, to
    feed to the next call.
    """

    def __init__(self, transformer: SequentialDataTransformer, algorithm: Algorithm, spec: EnvSpec):
        super().__init__()
        if isinstance(spec.action_space, MixedActionBox):
            # the program would output the packed float vector, which no consumer of the file expects
            raise NotExportableError(f"the policy acts in a mixed action space ({spec.action_space.original}); "
                                     "export writes Box, Discrete, MultiDiscrete and MultiBinary policies only")
        refuse_stateful_transformers(transformer, spec)
        self.transformer, self.algorithm = transformer, algorithm
        space = spec.observation_space
        self.observation_keys: Optional[list[str]] = list(space.spaces) if isinstance(space, gym.spaces.Dict) else None
        leaves = space.spaces if self.observation_keys is not None else {"observation": space}
        self.observation_specs = [TensorSpec(name, tuple(leaf.shape), _obs_dtype(leaf))
                                  for name, leaf in leaves.items()]
        action_dtype, self.action_shape = action_layout(spec.action_space)
        #: Integer actions (Discrete, MultiDiscrete, MultiBinary): int64, nothing to clip.
        self.discrete = not action_dtype.is_floating_point
        if not self.discrete:
            # Buffers, not constants: they travel with the module (device moves) and show in the exported program.
            self.register_buffer("action_low", torch.as_tensor(spec.action_space.low, dtype=torch.float32))
            self.register_buffer("action_high", torch.as_tensor(spec.action_space.high, dtype=torch.float32))
        initial = algorithm.initial_state(1, torch.device("cpu"))
        self.recurrent = not is_empty(initial)
        state_leaves, self._state_treespec = pytree.tree_flatten(initial)
        names = _state_names(len(state_leaves))
        self.state_specs = [TensorSpec(name, tuple(leaf.shape[1:]), _numpy_name(leaf.dtype))
                            for name, leaf in zip(names, state_leaves)]

    @property
    def input_specs(self) -> list[TensorSpec]:
        return self.observation_specs + self.state_specs

    @property
    def output_specs(self) -> list[TensorSpec]:
        action = TensorSpec("action", self.action_shape, "int64" if self.discrete else "float32")
        return [action] + [dataclasses.replace(s, name="next_" + s.name) for s in self.state_specs]

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        num_obs = len(self.observation_specs)
        if len(inputs) != num_obs + len(self.state_specs):
            raise TypeError(f"ExportedPolicy takes {[s.name for s in self.input_specs]}, got {len(inputs)} tensors")
        obs = (dict(zip(self.observation_keys, inputs[:num_obs])) if self.observation_keys is not None
               else inputs[0])
        state = self.state_from_leaves(inputs[num_obs:])
        batch = inputs[0].shape[0]
        # What the transformers and predict_step read besides the observation. MID: no transformer that remains after
        # refuse_stateful_transformers looks at the step type; the caller resets the state at an episode's start.
        time_step = TimeStep(step_type=torch.full((batch,), StepType.MID, dtype=torch.int8),
                             reward=torch.zeros(batch), discount=torch.ones(batch), observation=obs,
                             prev_action=torch.zeros((batch,) + self.action_shape,
                                                     dtype=torch.int64 if self.discrete else torch.float32),
                             env_id=torch.arange(batch))
        seen, _ = self.transformer.transform_timestep(time_step, None, update_stats=False)
        alg_step = self.algorithm.predict_step(seen, state, epsilon_greedy=0.0)
        action = alg_step.output
        if not self.discrete:
            action = torch.clamp(action.reshape((batch,) + self.action_shape), self.action_low, self.action_high)
        next_state = pytree.tree_leaves(alg_step.state) if self.recurrent else []
        return (action, *next_state)

    def state_from_leaves(self, leaves: Sequence[torch.Tensor]) -> Any:
        """The algorithm's state nest from the state inputs (``EMPTY`` for a stateless policy)."""
        return pytree.tree_unflatten(list(leaves), self._state_treespec) if self.recurrent else EMPTY

    def initial_state(self, batch_size: int) -> list[torch.Tensor]:
        """The state inputs at an episode's start: zeros ``[batch_size, *leaf_shape]`` (empty for a stateless
        policy)."""
        return [torch.from_numpy(np.zeros((batch_size,) + s.shape, s.dtype)) for s in self.state_specs]


def refuse_stateful_transformers(transformer: SequentialDataTransformer, spec: EnvSpec) -> None:
    """Refuses a data transformer whose rollout view keeps per-env state, which an exported program does not carry.

    Each transformer is asked, on a time step of zeros, whether it returns a state for the stream (``FrameStacker``
    does: each env's last frames). The others are exported as they are: normalizers with frozen statistics, image
    scaling, reward shaping (which does not change the action) and ``HindsightExperienceTransformer`` and
    ``UntransformedTimeStep`` (which change nothing the policy reads).

    Raises:
        NotExportableError: one line naming the transformer.
    """
    time_step = dataclasses.replace(spec, num_envs=1).zero_time_step()
    with torch.no_grad():
        for t in transformer.transformers:
            time_step, state = t.transform_timestep(time_step, None, update_stats=False)
            if state is not None:
                raise NotExportableError(
                    f"data transformer {type(t).__name__} keeps a per-env state in the rollout view (e.g. stacked "
                    "frames), which an exported policy does not carry; export supports transformers without rollout "
                    "state (normalizers, image scaling, reward shaping, hindsight relabelling): train without it, or "
                    "stack frames in the env (a wrapper) instead")


def _obs_dtype(space: gym.spaces.Box) -> str:
    """The numpy dtype name of what ``BatchedEnv`` returns for ``space``: an integer Box keeps its own, the rest are
    float32."""
    return np.dtype(space.dtype).name if np.issubdtype(space.dtype, np.integer) else "float32"


def _numpy_name(dtype: torch.dtype) -> str:
    """``torch.float32 -> 'float32'``."""
    return torch.empty((), dtype=dtype).numpy().dtype.name


def _state_names(count: int) -> list[str]:
    """Names of the state leaves, in ``pytree`` order: ``state`` for one (a GRU's ``h``), else ``state_0``, ... (an
    LSTM's ``h``, ``c``)."""
    return ["state"] if count == 1 else [f"state_{i}" for i in range(count)]
