"""Warm start: a new run begins from another run's checkpoint (``Trainer.warm_start_from``), as a callback.

    Trainer.warm_start_from = 'runs/pretrained'    # a root_dir (its newest verified checkpoint), a checkpoints
                                                   # dir such as 'runs/pretrained/checkpoints/best', or one ckpt-N dir
    Trainer.warm_start = 'weights'                 # or 'weights_and_optimizer', or 'all' (+ the replay buffer)

``'weights'``: the algorithm's parameters and the data transformers' statistics (normalizers); the run's counters,
schedules and RNGs start afresh. ``'weights_and_optimizer'`` adds the optimizer state (a best checkpoint has none).
``'all'`` adds the replay buffer (the checkpoint must have one, written by a job of the same number of ranks).
Only a fresh run warm-starts: a run that resumes from its own checkpoint continues from it (logged). The other run's
checkpoint is read as every checkpoint is (tensors with ``weights_only=True``, manifest verified); nothing of its
config is parsed: the networks are this conf's, and a checkpoint that does not fit them is a one-line error.
"""
from __future__ import annotations

import logging
import os
import re
from typing import TYPE_CHECKING

from alfish.collect.collector import example_experience
from alfish.rundir.checkpoint import Checkpointer, CheckpointError, LoadedCheckpoint
from alfish.trainer.callbacks import TrainerCallback
from alfish.trainer.resume import check_resumable

if TYPE_CHECKING:
    from alfish.trainer.trainer import Trainer

PARTS = ("weights", "weights_and_optimizer", "all")
_CKPT_DIR = re.compile(r"^ckpt-(\d+)$")


def load_source_checkpoint(path: str) -> LoadedCheckpoint:
    """The checkpoint ``path`` names: a ``ckpt-N`` directory; a directory of them (``.../checkpoints`` or
    ``.../checkpoints/best``: the newest that verifies); or a root_dir (its ``checkpoints``)."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise CheckpointError(f"Trainer.warm_start_from={path!r} is not a directory; give a root_dir, a checkpoints "
                              "directory or a ckpt-N directory")
    match = _CKPT_DIR.match(os.path.basename(path))
    if match:
        return Checkpointer(os.path.dirname(path)).load(int(match.group(1)))
    root = os.path.join(path, "checkpoints") if os.path.isdir(os.path.join(path, "checkpoints")) else path
    ckpt = Checkpointer(root, root_dir=path).load_latest()  # (path as typed; nothing below it followed)
    if ckpt is None:
        raise CheckpointError(f"Trainer.warm_start_from={path!r}: no checkpoint that verifies under {root}")
    return ckpt


class WarmStart(TrainerCallback):
    """Load ``parts`` of the checkpoint at ``source`` before the first action of a fresh run (module docstring)."""

    def __init__(self, source: str, parts: str = "weights"):
        if parts not in PARTS:
            raise ValueError(f"Trainer.warm_start={parts!r} is not one of {PARTS}")
        self.source, self.parts = source, parts

    def before_run(self, trainer: "Trainer") -> None:
        if trainer.resumed:
            logging.info("resumed from this run's own checkpoint: Trainer.warm_start_from=%s is not applied",
                         self.source)
            return
        ckpt = load_source_checkpoint(self.source)
        wanted = {"weights": ("algorithm", "transformers"), "weights_and_optimizer": ("algorithm", "transformers",
                                                                                       "learner"),
                  "all": ("algorithm", "transformers", "learner", "replay")}[self.parts]
        missing = [name for name in wanted if name not in ckpt.tensors]
        if missing:
            raise CheckpointError(f"Trainer.warm_start={self.parts!r}: checkpoint {ckpt.path} has no "
                                  f"{', '.join(missing)} (a best checkpoint holds weights only; a replay buffer is "
                                  "saved with Trainer.save_replay_buffer=True); use a smaller Trainer.warm_start")
        try:
            trainer.algorithm.load_state_dict(ckpt.tensors["algorithm"])
            trainer.transformer.load_state_dict(ckpt.tensors["transformers"])
            if "learner" in wanted:
                trainer.learner.load_state_dict(ckpt.tensors["learner"])
        except (RuntimeError, KeyError, ValueError) as err:
            first = " ".join(str(err).split())[:300]
            raise CheckpointError(f"Trainer.warm_start_from: checkpoint {ckpt.path} does not fit this conf's "
                                  f"networks ({first})") from None
        if "replay" in wanted:
            if trainer.replay is None:
                raise CheckpointError("Trainer.warm_start='all' loads a replay buffer, and this run has none "
                                      "(on-policy); use 'weights_and_optimizer'")
            check_resumable(ckpt, trainer.dist.world_size)  # (replay buffers are per rank)
            example = example_experience(trainer.algorithm, trainer.transformer, trainer.collector.spec)
            trainer.replay.load_state_dict(ckpt.tensors["replay"], example)
            trainer.replay.truncate_episodes()
        logging.info("warm start (%s) from %s (its iteration %s)", self.parts, ckpt.path, ckpt.meta.get("iteration"))
