"""Helpers for nests (NamedTuples, tuples, lists, dicts) of tensors, with ``torch.utils._pytree``'s semantics.

``map_nest`` and ``flatten`` run once or more per env step and per update, so the common containers (plain tuples
and lists, NamedTuples, plain dicts) are walked here directly: ``pytree.tree_flatten`` of an ``Experience`` costs about
40 us of Python (it checks every node against its registry), this walk about 3 us. They give what pytree gives: the
same leaves in the same order (NamedTuple fields in order, dict values in insertion order; anything that is
not a container is a leaf, ``None`` included); other container types (OrderedDict, defaultdict, registered classes) go
to pytree itself.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree


def _is_namedtuple(x: Any) -> bool:
    # (the instance's attribute, not ``type(x)``'s: torch 2.11's dynamo cannot trace ``hasattr`` on the class of a
    # NamedTuple made inside a compiled region, and breaks the graph there)
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _leaves_into(nest: Any, out: list) -> None:
    kind = type(nest)
    if kind is torch.Tensor or isinstance(nest, torch.Tensor):
        out.append(nest)
    elif kind is tuple or kind is list or _is_namedtuple(nest):
        for child in nest:
            _leaves_into(child, out)
    elif kind is dict:
        for child in nest.values():
            _leaves_into(child, out)
    elif isinstance(nest, (tuple, list, dict)) or type(nest) in pytree.SUPPORTED_NODES:
        out.extend(pytree.tree_leaves(nest))
    else:
        out.append(nest)


def _map(fn: Callable[..., Any], nest: Any, rest: tuple) -> Any:
    kind = type(nest)
    if kind is torch.Tensor or isinstance(nest, torch.Tensor):
        return fn(nest, *rest)
    if kind is tuple or kind is list:
        return kind(_map(fn, child, tuple(r[i] for r in rest)) for i, child in enumerate(nest))
    if _is_namedtuple(nest):
        return kind(*(_map(fn, child, tuple(r[i] for r in rest)) for i, child in enumerate(nest)))
    if kind is dict:
        return {key: _map(fn, child, tuple(r[key] for r in rest)) for key, child in nest.items()}
    if isinstance(nest, (tuple, list, dict)) or type(nest) in pytree.SUPPORTED_NODES:
        return pytree.tree_map(fn, nest, *rest)
    return fn(nest, *rest)


def _map1(fn: Callable[[Any], Any], nest: Any) -> Any:
    """``_map`` of a single nest (the common case, without the zipping)."""
    kind = type(nest)
    if kind is torch.Tensor or isinstance(nest, torch.Tensor):
        return fn(nest)
    if kind is tuple or kind is list:
        return kind([_map1(fn, child) for child in nest])
    if _is_namedtuple(nest):
        return kind(*[_map1(fn, child) for child in nest])
    if kind is dict:
        return {key: _map1(fn, child) for key, child in nest.items()}
    if isinstance(nest, (tuple, list, dict)) or type(nest) in pytree.SUPPORTED_NODES:
        return pytree.tree_map(fn, nest)
    return fn(nest)


def map_nest(fn: Callable[..., Any], nest: Any, *rest: Any) -> Any:
    """Apply ``fn`` to every leaf (several nests of the same structure are zipped); the structure is kept."""
    return _map(fn, nest, rest) if rest else _map1(fn, nest)


def flatten(nest: Any) -> list:
    """The leaves of ``nest``, in ``pytree.tree_leaves`` order."""
    out: list = []
    _leaves_into(nest, out)
    return out


def stack(nests: list, dim: int = 0) -> Any:
    """Stack a list of same-structured nests leaf by leaf along a new ``dim``."""
    leaves, spec = pytree.tree_flatten(nests[0])
    all_leaves = [flatten(n) for n in nests]
    stacked = [torch.stack([ls[i] for ls in all_leaves], dim) for i in range(len(leaves))]
    return pytree.tree_unflatten(stacked, spec)


def cat(nests: list, dim: int = 0) -> Any:
    leaves, spec = pytree.tree_flatten(nests[0])
    all_leaves = [flatten(n) for n in nests]
    joined = [torch.cat([ls[i] for ls in all_leaves], dim) for i in range(len(leaves))]
    return pytree.tree_unflatten(joined, spec)


def detach(nest: Any) -> Any:
    return map_nest(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, nest)


def replace_fields(record: Any, **changes: Any) -> Any:
    """``record._replace(**changes)`` for a NamedTuple ``record`` (a new one of its type with ``changes`` applied),
    written so that ``torch.compile`` traces it correctly on every torch alfish supports.

    Why not ``_replace`` itself: torch 2.11's dynamo miscompiles a ``_replace`` whose result leaves the compiled
    region -- it returns an empty tuple of the record's type for a record passed in, and fails with a bare
    ``AssertionError`` (``side_effects.codegen_save_tempvars``) for one made inside (seen on the H200 machine with
    torch 2.11.0: every compiled update fell back to eager; torch 2.13 traces both). alfish code builds records with
    this helper everywhere (``tests/test_nest_replace_fields.py`` keeps ``_replace`` out of the package), so no update
    path depends on where the compiled region ends.
    """
    unknown = [name for name in changes if name not in record._fields]  # (no set built: a few calls an env step)
    if unknown:
        raise ValueError(f"{type(record).__name__} has no field {', '.join(sorted(unknown))}")
    return type(record)(*[changes.get(name, value) for name, value in zip(record._fields, record)])
