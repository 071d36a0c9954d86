"""Thin helpers over ``torch.utils._pytree`` for nests (NamedTuples, dicts, tuples) of tensors."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree


def map_nest(fn: Callable[..., Any], nest: Any, *rest: Any) -> Any:
    """Apply ``fn`` to every leaf (several nests of the same structure are zipped)."""
    return pytree.tree_map(fn, nest, *rest)


def flatten(nest: Any) -> list:
    return pytree.tree_leaves(nest)


def stack(nests: list, dim: int = 0) -> Any:
    """Stack a list of same-structured nests leaf by leaf along a new ``dim``."""
    leaves, spec = pytree.tree_flatten(nests[0])
    all_leaves = [pytree.tree_leaves(n) for n in nests]
    stacked = [torch.stack([ls[i] for ls in all_leaves], dim) for i in range(len(leaves))]
    return pytree.tree_unflatten(stacked, spec)


def cat(nests: list, dim: int = 0) -> Any:
    leaves, spec = pytree.tree_flatten(nests[0])
    all_leaves = [pytree.tree_leaves(n) for n in nests]
    joined = [torch.cat([ls[i] for ls in all_leaves], dim) for i in range(len(leaves))]
    return pytree.tree_unflatten(joined, spec)


def detach(nest: Any) -> Any:
    return map_nest(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, nest)
