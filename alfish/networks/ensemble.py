"""Ensembles of any network as one batched computation.

``VmapEnsemble`` holds ``E`` independently initialised copies of a network (a user's critic class, a conv critic) as
stacked parameters ``[E, *shape]`` (``torch.func.stack_module_state``) and evaluates all members with one
``torch.func.vmap`` over ``torch.func.functional_call``: each layer becomes one batched kernel for the ``E`` members
(a batched matmul, a grouped convolution), not ``E`` Python calls. ``EnsembleCritic`` is the fast special case for
MLP critics over flat observations (weights already stored ``[E, in, out]``, see ``EnsembleMLP``).

Both take ``(observation, action)`` and return ``[E', N, 1]``, with the ``detach_params`` and ``members`` options of
``EnsembleMLP.forward``; algorithms call them the same way.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from alfish.networks.mlp import EnsembleMLP


class EnsembleCritic(EnsembleMLP):
    """``EnsembleMLP`` critics over ``[observation, action]`` concatenated: ``(obs [N, obs_dim], action [N, A])`` ->
    ``[E', N, 1]``. Same parameters (and checkpoint keys) as the ``EnsembleMLP`` it is."""

    def forward(self, obs: torch.Tensor, action: torch.Tensor, detach_params: bool = False,  # type: ignore[override]
                members: Optional[slice] = None) -> torch.Tensor:
        return super().forward(torch.cat([obs, action], -1), detach_params, members)


def _safe_name(name: str) -> str:
    """A parameter's dotted path as one attribute name: ``encoder.convs.0.weight`` -> ``encoder__convs__0__weight``."""
    return name.replace(".", "__")


class VmapEnsemble(nn.Module):
    """``num_members`` copies of ``make_member()`` evaluated by one ``vmap``.

    make_member: builds one member (called ``num_members`` times, so each is initialised independently); it may have
        parameters and buffers, and its ``forward`` takes the ensemble's inputs (any number of tensors, shared by all
        members) and returns a tensor ``[N, ...]``.
    Parameters are ``members.<path, __ for dots>`` of shape ``[E, *shape]``; buffers ``member_buffers__<path>``.
    Dropout draws independently per member (``randomness='different'``).
    """

    def __init__(self, make_member: Callable[[], nn.Module], num_members: int):
        super().__init__()
        if num_members < 1:
            raise ValueError(f"an ensemble needs at least one member, got {num_members}")
        built = [make_member() for _ in range(num_members)]
        params, buffers = stack_module_state(built)
        self.num_members = num_members
        self._names = list(params)
        self._buffer_names = list(buffers)
        self.members = nn.ParameterDict({_safe_name(k): nn.Parameter(v.detach().clone()) for k, v in params.items()})
        for name, value in buffers.items():
            self.register_buffer("member_buffers__" + _safe_name(name), value.clone())
        # The structure to call: a copy on the meta device (no memory), kept out of the module tree so that it is
        # neither a parameter nor moved, saved or copied with the ensemble's state.
        self.__dict__["_template"] = copy.deepcopy(built[0]).to("meta")

    def parameter_list(self) -> list[nn.Parameter]:
        return list(self.members.values())

    def train(self, mode: bool = True) -> "VmapEnsemble":
        """Also switches the template that ``forward`` calls (dropout follows the ensemble's mode)."""
        self._template.train(mode)
        return super().train(mode)

    def forward(self, *inputs: torch.Tensor, detach_params: bool = False,
                members: Optional[slice] = None) -> torch.Tensor:
        """``inputs`` (each ``[N, ...]``, shared by the members) -> ``[E', N, ...]``.

        detach_params: evaluate with detached parameters (gradients reach the inputs only).
        members: evaluate only these members (all by default).
        """
        params = {name: self.members[_safe_name(name)] for name in self._names}
        buffers = {name: getattr(self, "member_buffers__" + _safe_name(name)) for name in self._buffer_names}
        if detach_params:
            params = {k: v.detach() for k, v in params.items()}
        if members is not None:
            params = {k: v[members] for k, v in params.items()}
            buffers = {k: v[members] for k, v in buffers.items()}

        def one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], *x: torch.Tensor) -> Any:
            return functional_call(self._template, (p, b), x)

        in_dims = (0, 0) + (None,) * len(inputs)
        return vmap(one, in_dims=in_dims, randomness="different")(params, buffers, *inputs)
