"""``SupervisedModel``: supervised learning (``TrainerConfig.ml_type='sl'``) as an algorithm, so the same loop,
Learner, summaries and checkpoints serve it (a model's inputs stand where observations stand, its targets where
actions stand).

A batch is a ``SupervisedBatch(inputs [B, *in], targets [B, *out] or [B] class indices)``; the loss is the mean
squared error (``loss='mse'``, Box targets) or the cross-entropy (``loss='cross_entropy'``, Discrete targets).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

import gin
import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from alfish.algorithms.base import Algorithm
from alfish.data.types import EMPTY, AlgStep, LossInfo, TimeStep
from alfish.errors import OneLineValueError
from alfish.networks.mlp import MLP
from alfish.schedulers import Scheduler

LOSSES = ("mse", "cross_entropy")


class SupervisedBatch(NamedTuple):
    inputs: torch.Tensor   # [B, *input_shape] float32
    targets: torch.Tensor  # [B, *target_shape] float32 (mse) or [B] int64 (cross_entropy)


@gin.configurable
class SupervisedModel(Algorithm):
    """A model trained on (input, target) pairs.

    Args:
        observation_space: the inputs' space (a Box); action_space: the targets' (a Box for regression, a Discrete
            for classification). The trainer builds them from ``SupervisedData``.
        hidden_sizes: hidden layers of the default MLP.
        lr: Adam learning rate (a number or a schedule).
        model_ctor: ``ctor(input_dim, output_dim)`` -> the model (``[B, input_dim] -> [B, output_dim]``); ``None``:
            an MLP of ``hidden_sizes``.
        loss: ``'mse'`` or ``'cross_entropy'``; ``None``: chosen by the targets' space.
    """

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Space,
                 hidden_sizes: Sequence[int] = (64, 64), lr: float | Scheduler = 1e-3,
                 model_ctor: Optional[Callable[[int, int], nn.Module]] = None, loss: Optional[str] = None):
        super().__init__()
        self.classify = isinstance(action_space, gym.spaces.Discrete)
        loss = loss or ("cross_entropy" if self.classify else "mse")
        if loss not in LOSSES or (loss == "cross_entropy") != self.classify:
            raise OneLineValueError(f"SupervisedModel.loss={loss!r} does not fit targets in {action_space}: use "
                                    "'mse' for Box targets and 'cross_entropy' for Discrete (class index) targets")
        self.input_dim = int(gym.spaces.flatdim(observation_space))
        self.output_dim = int(action_space.n) if self.classify else int(gym.spaces.flatdim(action_space))
        self.target_shape = () if self.classify else tuple(action_space.shape)
        self.model = (model_ctor or (lambda i, o: MLP(i, o, hidden_sizes)))(self.input_dim, self.output_dim)
        self.loss_name, self.lr = loss, lr

    def param_groups(self) -> list[dict]:
        return [dict(name="model", params=list(self.model.parameters()), lr=self.lr)]

    def forward_model(self, inputs: torch.Tensor) -> torch.Tensor:
        """Model outputs ``[B, output_dim]`` (logits when classifying) for inputs ``[B, *input_shape]``."""
        return self.model(inputs.reshape(inputs.shape[0], -1).float())

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        """Predictions: class indices ``[B]``, or targets ``[B, *target_shape]``."""
        out = self.forward_model(inputs)
        return out.argmax(-1) if self.classify else out.reshape((-1,) + self.target_shape)

    def predict_step(self, time_step: TimeStep, state: Any = EMPTY, epsilon_greedy: float = 0.0) -> AlgStep:
        return AlgStep(output=self.predict(time_step.observation), state=state)

    def rollout_step(self, time_step: TimeStep, state: Any = EMPTY) -> AlgStep:
        return self.predict_step(time_step, state)

    def train_step(self, batch: SupervisedBatch, state: Any = EMPTY) -> AlgStep:
        return AlgStep(info=self.forward_model(batch.inputs))

    def calc_loss(self, batch: SupervisedBatch, outputs: torch.Tensor) -> LossInfo:
        """Per-sample loss ``[B]`` (squared error summed over target dims, or cross-entropy)."""
        if self.classify:
            loss = F.cross_entropy(outputs, batch.targets.long(), reduction="none")

            def extra() -> dict[str, torch.Tensor]:
                return dict(accuracy=(outputs.detach().argmax(-1) == batch.targets).float().mean())
        else:
            loss = (outputs - batch.targets.reshape(outputs.shape).float()).square().sum(-1)
            extra = {}
        return LossInfo(loss=loss, extra=extra)

    def validation_loss(self, batch: SupervisedBatch) -> torch.Tensor:
        """The mean loss on ``batch`` without gradients (0-d)."""
        with torch.no_grad():
            return self.calc_loss(batch, self.forward_model(batch.inputs)).loss.mean()
