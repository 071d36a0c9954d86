"""``SupervisedData``: the (input, target) pairs of supervised training (``TrainerConfig.ml_type='sl'``).

From a file: an ``.npz`` (or a directory of ``.npy`` files) with arrays ``inputs [N, *in]`` and ``targets [N, *out]``
(float targets: regression; integer ``[N]`` targets: classes), read with ``allow_pickle=False`` (``.npy`` files
memory-mapped); or a toy made here (``toy='sine'``: ``y = sin(3x) + noise`` on ``x`` in [-1, 1], a regression whose
best mean squared error is the noise variance). A fixed fraction is held out for the validation loss.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import gin
import gymnasium as gym
import numpy as np
import torch

from alfish.algorithms.supervised import SupervisedBatch
from alfish.errors import OneLineValueError

TOYS = ("sine",)


@gin.configurable("SupervisedData")
class SupervisedData:
    """Args:
        path: an ``.npz`` file or a directory of ``inputs.npy`` / ``targets.npy``; ``None`` with ``toy``.
        toy: ``'sine'`` (see the module docstring), made with ``num_samples`` pairs and noise std ``noise``.
        validation_fraction: share of the pairs held out (the last ones after a seeded shuffle).
        seed: the shuffle's and the toy's seed.
    """

    def __init__(self, path: Optional[str] = None, toy: Optional[str] = None, num_samples: int = 4096,
                 noise: float = 0.1, validation_fraction: float = 0.1, seed: int = 0):
        if (path is None) == (toy is None):
            raise OneLineValueError("SupervisedData needs exactly one of path (a .npz file or .npy directory) and toy "
                             f"({', '.join(map(repr, TOYS))})")
        if not 0.0 <= validation_fraction < 1.0:
            raise OneLineValueError(f"SupervisedData.validation_fraction={validation_fraction} must be in [0, 1)")
        rng = np.random.default_rng(seed)
        inputs, targets = _load(path) if path is not None else _toy(toy, num_samples, noise, rng)
        if len(inputs) != len(targets) or len(inputs) < 2:
            raise OneLineValueError(f"SupervisedData: {len(inputs)} inputs and {len(targets)} targets; they must "
                                    "pair up (at least 2)")
        order = rng.permutation(len(inputs))
        held_out = int(round(len(inputs) * validation_fraction))
        train, validation = order[:len(inputs) - held_out], order[len(inputs) - held_out:]
        self.inputs = torch.as_tensor(np.asarray(inputs, dtype=np.float32))
        classify = np.issubdtype(np.asarray(targets[:1]).dtype, np.integer)
        self.targets = torch.as_tensor(np.asarray(targets, dtype=np.int64 if classify else np.float32))
        self.train_index, self.validation_index = torch.as_tensor(train), torch.as_tensor(validation)
        self.input_space = gym.spaces.Box(-np.inf, np.inf, tuple(self.inputs.shape[1:]), np.float32)
        self.target_space = (gym.spaces.Discrete(int(self.targets.max()) + 1) if classify
                             else gym.spaces.Box(-np.inf, np.inf, tuple(self.targets.shape[1:]), np.float32))

    def sample(self, batch_size: int, generator: Optional[torch.Generator] = None) -> SupervisedBatch:
        """``batch_size`` training pairs drawn uniformly with replacement."""
        pick = self.train_index[torch.randint(len(self.train_index), (batch_size,), generator=generator)]
        return SupervisedBatch(self.inputs.index_select(0, pick), self.targets.index_select(0, pick))

    def validation(self) -> Optional[SupervisedBatch]:
        """The held-out pairs (``None`` when none are held out)."""
        if len(self.validation_index) == 0:
            return None
        return SupervisedBatch(self.inputs[self.validation_index], self.targets[self.validation_index])


def _load(path: str):
    p = Path(path)
    try:
        if p.is_dir():
            return (np.load(p / "inputs.npy", mmap_mode="r", allow_pickle=False),
                    np.load(p / "targets.npy", mmap_mode="r", allow_pickle=False))
        with np.load(p, allow_pickle=False) as data:
            return data["inputs"], data["targets"]
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"SupervisedData.path={os.fspath(path)!r}: cannot read 'inputs' and 'targets' "
                         f"({str(err).splitlines()[0]})") from None


def _toy(name: str, n: int, noise: float, rng: np.random.Generator):
    if name not in TOYS:
        raise OneLineValueError(f"SupervisedData.toy={name!r} must be one of {', '.join(map(repr, TOYS))}")
    x = rng.uniform(-1.0, 1.0, size=(n, 1)).astype(np.float32)
    y = (np.sin(3.0 * x) + noise * rng.standard_normal((n, 1))).astype(np.float32)
    return x, y
