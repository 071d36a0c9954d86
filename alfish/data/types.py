"""The data types that travel along alfish's one data path (DESIGN.md §1, §3.5).

All are NamedTuples of tensors (or nests of tensors), so ``torch.utils._pytree`` maps over them.
Shapes: ``[B, ...]`` for one batched step, ``[T, B, ...]`` for a time-major trajectory or replay sample.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch

#: The value of a field that holds nothing: an empty nest (no tensors, so storage, ``nest`` helpers and pytree maps
#: skip it, where ``None`` would be a leaf they would try to map). Named so that its uses say what they mean.
EMPTY: tuple = ()


class StepType:
    """Position of a step in its episode; stored as int8 tensors.

    FIRST: the first step of an episode (reward 0, discount 1).
    MID:   any step in between.
    LAST:  the final step; ``discount`` is 0 on a true termination and 1 on a time-limit truncation.
    After LAST, the environment returns FIRST and ignores the action it was given (gymnasium's next-step autoreset),
    so the transition LAST -> FIRST is never a real transition.
    """

    FIRST = 0
    MID = 1
    LAST = 2


class TimeStep(NamedTuple):
    """What the environment reports at one step, batched over ``B`` environments.

    step_type:   int8 [B], a ``StepType``.
    reward:      float32 [B], reward for ``prev_action`` (the action that led here).
    discount:    float32 [B], 0 at a true termination, else 1.
    observation: float32 [B, *obs_shape].
    prev_action: [B, *action_shape], the action that led here (zeros at FIRST).
    env_id:      int64 [B], which environment of the batch produced this step.
    untransformed: ``EMPTY``, or the raw TimeStep before any data transformer (set by ``UntransformedTimeStep``).
    """

    step_type: torch.Tensor
    reward: torch.Tensor
    discount: torch.Tensor
    observation: Any
    prev_action: torch.Tensor
    env_id: torch.Tensor
    untransformed: Any = EMPTY

    def is_first(self) -> torch.Tensor:
        return self.step_type == StepType.FIRST

    def is_last(self) -> torch.Tensor:
        return self.step_type == StepType.LAST


class AlgStep(NamedTuple):
    """What an algorithm's ``*_step`` returns.

    output: the action ``[B, *action_shape]`` (rollout/predict) or any training output.
    state:  recurrent state (``EMPTY`` for stateless algorithms).
    info:   a nest of tensors ``[B, ...]``: stored in replay as ``rollout_info`` by ``rollout_step``,
            passed to ``calc_loss`` by ``train_step``.
    """

    output: Any = EMPTY
    state: Any = EMPTY
    info: Any = EMPTY


class Experience(NamedTuple):
    """One stored step: a TimeStep, the action chosen at it and the rollout info, plus replay metadata.

    Shapes are ``[L, B, ...]`` (time-major) when handed to ``train_step``. The next observation of step ``t`` is
    ``observation[t + 1]``: the buffer never stores a duplicated next observation. ``untransformed`` is ``EMPTY`` in
    storage; ``UntransformedTimeStep`` fills it with the raw sample (an Experience) before the other transformers.
    """

    step_type: torch.Tensor
    reward: torch.Tensor
    discount: torch.Tensor
    observation: Any
    action: torch.Tensor
    env_id: torch.Tensor
    rollout_info: Any = EMPTY
    untransformed: Any = EMPTY

    @staticmethod
    def from_time_step(time_step: TimeStep, action: torch.Tensor, rollout_info: Any = EMPTY) -> "Experience":
        return Experience(
            step_type=time_step.step_type,
            reward=time_step.reward,
            discount=time_step.discount,
            observation=time_step.observation,
            action=action,
            env_id=time_step.env_id,
            rollout_info=rollout_info,
            untransformed=time_step.untransformed,
        )

    def is_last(self) -> torch.Tensor:
        return self.step_type == StepType.LAST


class BatchInfo(NamedTuple):
    """Where a replay sample came from.

    env_ids:            int64 [B], the ring each sequence was read from.
    positions:          int64 [B], absolute write index of each sequence's first step in its ring.
    importance_weights: float32 [B] or ``None`` (uniform sampling).
    """

    env_ids: torch.Tensor
    positions: torch.Tensor
    importance_weights: Optional[torch.Tensor] = None


class LossInfo(NamedTuple):
    """What ``calc_loss`` returns.

    loss:     per-sample loss ``[L, B]`` or ``[B]`` (the trainer applies importance weights and takes the mean),
              or a scalar.
    extra:    named loss terms for TensorBoard: a dict of scalar tensors, or a zero-argument callable returning one
              (preferred: the trainer calls it only when a summary is due, so the reductions cost nothing otherwise).
    priority: ``[B]`` new replay priorities, or ``EMPTY`` when the algorithm gives none.
    """

    loss: torch.Tensor
    extra: Any = EMPTY
    priority: Any = EMPTY
