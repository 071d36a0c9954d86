"""The critic-first update order by a deferred actor term, shared by DDPG/TD3 (``ddpg.py``) and SAC (``sac.py``).

``update_order='joint'`` (alfish's default): one total loss and one optimizer step per update, so the actor's loss
reads the critics as they were before this update's critic step. ``'critic_first'``: the actor's loss reads the
critics *after* that step, as Stable-Baselines3 and the TD3/SAC authors' code do (a critic step, then an actor step on
the same batch). alfish keeps one loss and one step per update by deferring the actor's term (and SAC's temperature
term, which reads the same log-probabilities) by one update: an update keeps its batch's observations and validity
mask here, and the next update builds the actor's term on them, read through that update's critics before their step,
which are the critics after the previous step. So the actor's gradient is the reference order's, one update later.

This mixin holds the kept batch: two buffers (``deferred_observations [N, ...]``, ``deferred_valid [N]``, so a
checkpoint resumes exactly), sized eagerly in ``before_update`` (a compiled update only copies into them: memory
allocated inside a CUDA-graph update belongs to the graph), and the build-time refusals that follow from deferring
(prioritized replay and offline data would weight or mix the kept rows as the next batch's own; a ``Dict`` observation
is not kept). The algorithm decides when its actor term is due and builds it.
"""
from __future__ import annotations

from typing import Any, Optional

import gymnasium as gym
import torch

from alfish.data.types import Experience, StepType

#: ``update_order``'s values (DDPG/TD3 and SAC).
UPDATE_ORDERS = ("joint", "critic_first")


def check_update_order(owner: str, update_order: str, observation_space: gym.Space) -> None:
    """One-line ``ValueError`` for an unknown ``update_order`` or one that cannot keep this env's observations."""
    if update_order not in UPDATE_ORDERS:
        raise ValueError(f"{owner}.update_order={update_order!r}: use one of {UPDATE_ORDERS}")
    if update_order == "critic_first" and isinstance(observation_space, gym.spaces.Dict):
        raise ValueError(f"{owner}.update_order='critic_first' keeps a batch's observations for the next update, "
                         "which it does for array observations only; this env's are a Dict: use update_order='joint'")


class DeferredActorBatch:
    """Mixin for ``nn.Module`` algorithms with an ``update_order`` (module docstring); before ``UpdateCounter`` and the
    algorithm base in the bases, so that its ``_load_from_state_dict`` runs first."""

    update_order: str

    def _init_update_order(self, update_order: str) -> None:
        """Call once in ``__init__`` (after ``check_update_order``): the kept-batch buffers, empty until a batch is
        kept; resized as needed, also on load."""
        self.update_order = update_order
        if update_order == "critic_first":
            self.register_buffer("deferred_observations", torch.zeros(0))
            self.register_buffer("deferred_valid", torch.zeros(0))

    @staticmethod
    def valid_transitions(exp: Experience) -> torch.Tensor:
        """``[N]`` float: 1 for a transition that trains, 0 for one out of a LAST step (env autoreset)."""
        return (exp.step_type[:-1] != StepType.LAST).flatten().to(exp.reward.dtype)

    def before_update(self, batch: Any) -> None:
        """(``'critic_first'``) Size the kept-batch buffers for ``batch`` ``[L, B]`` here, eagerly, so that the
        (compiled) update only copies into them (``RLAlgorithm.before_update``: with CUDA graphs, buffers allocated in
        the update would be the graph's memory)."""
        if self.update_order != "critic_first" or not isinstance(batch, Experience):
            return
        obs = batch.observation
        key = (obs.shape, obs.dtype, obs.device, batch.reward.dtype)
        kept = self.__dict__.get("_kept_layout")  # (key, the kept rows' shape and dtype): computed once per layout
        if kept is None or kept[0] != key:
            # One transition's network input (a view, or a cast of two observations) gives the rows' shape, dtype.
            one = self.steps(self.network_input(obs[:2, :1], batch_dims=2), slice(None, -1))
            num_transitions = (obs.shape[0] - 1) * obs.shape[1]
            kept = (key, (num_transitions, *one.shape[1:]), one.dtype)
            self.__dict__["_kept_layout"] = kept
        self._size_kept(kept[1], kept[2], batch.reward.dtype, obs.device)

    def _size_kept(self, shape: tuple[int, ...], dtype: torch.dtype, valid_dtype: torch.dtype,
                   device: torch.device) -> None:
        """Reallocate the kept-batch buffers when the batch's ``[N, ...]`` shape, dtype or device changes."""
        kept = self.deferred_observations
        if kept.shape != shape or kept.dtype != dtype or kept.device != device:
            self.deferred_observations = torch.empty(shape, dtype=dtype, device=device)
            self.deferred_valid = torch.empty(shape[:1], dtype=valid_dtype, device=device)

    def _take_kept(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch the previous update kept: observations ``[N, ...]`` and validity ``[N]``, as copies (the buffers
        are overwritten with this update's batch, which the backward must not see)."""
        return self.deferred_observations.clone(), self.deferred_valid.clone()

    def _keep_for_actor(self, observations: torch.Tensor, valid: torch.Tensor) -> None:
        """Keep a batch's observations ``[N, ...]`` and validity ``[N]`` for the next step's actor term, in the
        buffers: sized by ``before_update`` in a Learner's update; resized here only for a direct ``train_step``
        call (eager)."""
        self._size_kept(tuple(observations.shape), observations.dtype, valid.dtype, observations.device)
        self.deferred_observations.copy_(observations)
        self.deferred_valid.copy_(valid)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        # The kept batch is as large as the checkpointed run's (or empty): take its shape before loading into it.
        for name in ("deferred_observations", "deferred_valid"):
            loaded = state_dict.get(prefix + name)
            if name in self._buffers and isinstance(loaded, torch.Tensor):
                self._buffers[name] = torch.empty(loaded.shape, dtype=loaded.dtype,
                                                  device=self._buffers[name].device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def replay_refusal(self, prioritized: bool, offline: bool) -> Optional[str]:
        """Why this algorithm cannot train from such a replay (None: it can): the ``'critic_first'`` order defers the
        actor's term to the next batch, whose importance weights or offline rows are not the kept batch's."""
        if self.update_order != "critic_first" or not (prioritized or offline):
            return None
        what = ("TrainerConfig.priority_replay=True" if prioritized
                else "offline data (TrainerConfig.offline_buffer_dir)")
        return (f"{type(self).__name__}.update_order='critic_first' defers the actor's term to the next batch, which "
                f"{what} would weight or mix as that batch's own rows: use update_order='joint' with it")
