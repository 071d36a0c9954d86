"""Mixed actions: a gymnasium ``Tuple`` or ``Dict`` action space of one ``Discrete`` and one ``Box`` part, packed into
one float vector.

alfish's data path holds an env step's action as one tensor (the batched env, rollout, replay, trajectories, the
episode log of exact resume, the async unroll's queue). A mixed action travels through it packed, float32 ``[1 + d]``:

    slot 0:      the discrete choice, a float holding an integer in 0..n-1 (exact: n < 2**24);
    slots 1..d:  the Box part, flattened (C order), in its own bounds and units.

Each env of a batch is wrapped in ``MixedActionPacking`` (``EnvFactory`` does it, inside the episode log, outside the
contract check): it takes the packed vector and hands its env the ``Tuple`` or ``Dict`` the env asked for. Everything
above the env sees a ``MixedActionBox``: a Box of the packed layout that remembers the parts (``original``,
``num_choices``, ``box_space``), by which an algorithm knows it is driving a mixed action (``RLAlgorithm``).

The choice slot's bounds are ``[-0.5, n - 0.5]`` and a value is read as ``floor(x + 0.5)`` clipped to ``[0, n-1]``
(``choice_of``), so a uniform sample of the packed Box (random warm-up actions) is a uniform choice, and what an
algorithm stores and what the env was given agree.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Hashable

import gymnasium as gym
import numpy as np

if TYPE_CHECKING:  # (env workers import this module: it must not import torch, see tests/envs/test_env_workers.py)
    import torch

#: The container spaces a mixed action may come in.
MIXED_ACTION_SPACES = (gym.spaces.Tuple, gym.spaces.Dict)

SUPPORTED_MIXED = "a gymnasium Tuple or Dict of exactly one Discrete and one Box part"


def mixed_parts(space: gym.Space) -> tuple[Hashable, Hashable]:
    """``(key of the Discrete part, key of the Box part)`` of a Tuple (indices) or Dict (keys) ``space``; a
    ``ValueError`` (one line) for any other composition."""
    parts = dict(enumerate(space.spaces)) if isinstance(space, gym.spaces.Tuple) else dict(space.spaces)
    discrete = [k for k, part in parts.items() if isinstance(part, gym.spaces.Discrete)]
    boxes = [k for k, part in parts.items() if isinstance(part, gym.spaces.Box)]
    if len(parts) != 2 or len(discrete) != 1 or len(boxes) != 1:
        kinds = ", ".join(type(part).__name__ for part in parts.values())
        raise ValueError(f"action space {type(space).__name__}({kinds}) is not supported: alfish drives mixed actions "
                         f"made of {SUPPORTED_MIXED}")
    return discrete[0], boxes[0]


def choice_of(packed: "torch.Tensor", num_choices: int) -> "torch.Tensor":
    """The discrete choices ``[*]`` int64 of packed actions ``[*, 1 + d]`` (``floor(x + 0.5)``, clipped to
    ``[0, num_choices - 1]``; module docstring). (The packing side is ``alfish.algorithms.sac_mixed.pack``.)"""
    return packed[..., 0].add(0.5).floor_().clamp_(0, num_choices - 1).long()


class MixedActionBox(gym.spaces.Box):
    """The packed view (float32 ``[1 + d]``, module docstring) of a mixed action space ``original``.

    Attributes: ``original`` (the Tuple or Dict), ``discrete_key`` / ``box_key`` (the parts' index or key),
    ``num_choices`` (``n`` of the Discrete part), ``box_space`` (the Box part, ``d`` = its flattened size).
    """

    def __init__(self, original: gym.Space):
        self.discrete_key, self.box_key = mixed_parts(original)
        self.original = original
        choices, box = original[self.discrete_key], original[self.box_key]
        self.num_choices, self.box_space = int(choices.n), box
        low = np.concatenate([[-0.5], np.asarray(box.low, dtype=np.float32).reshape(-1)]).astype(np.float32)
        high = np.concatenate([[self.num_choices - 0.5], np.asarray(box.high, dtype=np.float32).reshape(-1)])
        super().__init__(low, high.astype(np.float32), dtype=np.float32)

    def unpack(self, packed: np.ndarray) -> Any:
        """One env's action ``[1 + d]`` -> the Tuple (a tuple) or Dict (a dict) ``original`` takes."""
        packed = np.asarray(packed, dtype=np.float32).reshape(-1)
        choice = np.int64(min(max(np.floor(packed[0] + 0.5), 0), self.num_choices - 1))  # as ``choice_of``
        box = packed[1:].reshape(self.box_space.shape).astype(self.box_space.dtype)
        parts = {self.discrete_key: choice, self.box_key: box}
        if isinstance(self.original, gym.spaces.Tuple):
            return tuple(parts[i] for i in range(2))
        return {key: parts[key] for key in self.original.spaces}

    def pack_one(self, action: Any) -> np.ndarray:
        """The inverse of ``unpack``: one env's Tuple or Dict action -> float32 ``[1 + d]``."""
        return np.concatenate([[float(action[self.discrete_key])],
                               np.asarray(action[self.box_key], dtype=np.float32).reshape(-1)]).astype(np.float32)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, MixedActionBox) and self.original == other.original

    def __repr__(self) -> str:
        return f"MixedActionBox({self.original} packed as float32[{self.shape[0]}])"


class MixedActionPacking(gym.ActionWrapper):
    """Makes an env with a mixed action space take packed actions (``MixedActionBox``, module docstring)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.action_space = MixedActionBox(env.action_space)

    def action(self, action: Any) -> Any:
        return self.action_space.unpack(action)
