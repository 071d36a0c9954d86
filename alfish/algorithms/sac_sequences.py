"""SAC over a shared encoder (``SacAlgorithm.encoding_network_ctor``): the encoder's features of a sampled sequence,
online and target, from the state it was acted from (``sac.py``'s module docstring describes the scheme)."""
from __future__ import annotations

from typing import Any

import torch

from alfish.data import nest
from alfish.data.types import Experience


def sequence_features(sac: Any, exp: Experience) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder features of steps ``burn_in .. L-1`` of ``exp`` ``[L, B]``: ``(online [L', B, F]`` with gradient,
    ``target [L', B, F])`` without, ``L' = L - burn_in``. ``sac``: a ``SacAlgorithm`` with a shared encoder. A
    recurrent encoder starts from the stored rollout state of step 0 (``use_rollout_state``, else zeros), resets at
    FIRST steps (``unroll``) and runs the burn-in steps without gradient."""
    obs = sac.network_input(exp.observation, batch_dims=2)                  # [L, B, ...]
    if not sac.recurrent:
        with torch.no_grad():
            target = sac.target_encoder(obs)
        return sac.encoder(obs), target
    first, step_type = sac.burn_in, exp.step_type
    if sac.use_rollout_state:
        start = nest.map_nest(lambda x: x[0], exp.rollout_info.state)
    else:
        start = sac.initial_state(step_type.shape[1], step_type.device)
    with torch.no_grad():
        target, _ = sac.target_encoder.unroll(obs, step_type, start)
        state = start
        if first:  # burn-in: the state is warmed up without gradients
            _, state = sac.encoder.unroll(sac.step_slice(obs, slice(0, first)), step_type[:first], start)
    online, _ = sac.encoder.unroll(sac.step_slice(obs, slice(first, None)), step_type[first:], state)
    return online, target[first:]
