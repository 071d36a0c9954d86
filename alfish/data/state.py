"""Recurrent state helpers: a state is a nest of ``[B, ...]`` tensors (``EMPTY`` for stateless algorithms)."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.utils import _pytree as pytree


def is_empty(state: Any) -> bool:
    """Whether ``state`` is ``EMPTY`` (a stateless algorithm's state)."""
    return isinstance(state, tuple) and len(state) == 0


def reset_state_at_first(state: Any, step_type: torch.Tensor,
                         initial_state: Callable[[int, Optional[torch.device]], Any]) -> Any:
    """``state`` (a nest of ``[B, ...]`` tensors) where ``step_type [B]`` is FIRST replaced by
    ``initial_state(B, device)``; ``EMPTY`` stays ``EMPTY`` (no op)."""
    if is_empty(state):
        return state
    leaves = pytree.tree_leaves(state)
    first = (step_type == 0).to(leaves[0].device)  # StepType.FIRST
    init = initial_state(first.shape[0], leaves[0].device)
    return pytree.tree_map(lambda s, i: torch.where(first.view((-1,) + (1,) * (s.dim() - 1)), i, s), state, init)
