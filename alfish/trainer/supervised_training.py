"""``SupervisedTraining``: what one iteration of supervised learning (``ml_type='sl'``) does:
``num_updates_per_train_iter`` mini-batches of ``mini_batch_size`` pairs, each one Learner update; the validation loss
is computed only when a summary is due (``sl/validation_loss``)."""
from __future__ import annotations

import torch

from alfish.data import nest
from alfish.replay.supervised_data import SupervisedData
from alfish.trainer.training import StepParts, TrainingStep


class SupervisedTraining(TrainingStep):
    """``parts.algorithm``: a ``SupervisedModel``; ``data``: the pairs; ``seed``: of the mini-batch draws."""

    def __init__(self, parts: StepParts, data: SupervisedData, num_updates_per_train_iter: int, mini_batch_size: int,
                 seed: int):
        super().__init__(parts)
        self.data, self.num_updates, self.mini_batch_size = data, num_updates_per_train_iter, mini_batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def _collect_and_train(self, steps_per_env: int) -> int:
        for _ in range(self.num_updates):
            batch = self.data.sample(self.mini_batch_size, self.generator)
            self.learner.update(nest.replace_fields(batch, inputs=batch.inputs.to(self.learner.device),
                                               targets=batch.targets.to(self.learner.device)))
        return 0

    def summary(self) -> dict[str, float]:
        out = super().summary()
        validation = self.data.validation()
        if validation is not None:
            device = self.learner.device
            out["sl/validation_loss"] = float(self.algorithm.validation_loss(
                nest.replace_fields(validation, inputs=validation.inputs.to(device),
                                    targets=validation.targets.to(device))))
        return out
