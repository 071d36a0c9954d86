"""How offline data joins training (gin name ``OfflineData``); ALF's own parameters stay in ``TrainerConfig``."""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Union

import gin

from alfish.errors import OneLineValueError

MIXINGS = ("separate", "mixed")


@gin.configurable("OfflineData")
@dataclasses.dataclass(frozen=True)
class OfflineOptions:
    """mixing: how offline and online data train together once the RL part runs:
        ``'separate'`` (ALF's scheme, the default): every update computes the algorithm's loss on an offline batch of
        ``mini_batch_size`` sequences, plus, at the iterations ``TrainerConfig.rl_train_after_update_steps`` /
        ``rl_train_every_update_steps`` select, its loss on an online batch of another ``mini_batch_size``: the two
        means are summed into one loss (one backward). ``mini_batch_size`` is per part.
        ``'mixed'`` (RLPD, Ball et al. 2023): one loss on batches of ``mini_batch_size`` sequences in total, of which
        ``round(mini_batch_size * offline_fraction)`` are drawn from the offline data and the rest online.
    offline_fraction: ``'mixed'`` only: the offline share of each batch, in [0, 1] (a number or a schedule).
    init_normalizers: observation/reward normalizers start from the offline data's statistics (one pass over it).
    in_memory_limit_mb: D4RL-style data whose converted steps exceed this many MB is converted once into an alfish
        dataset under ``cache_dir`` and memory-mapped (``None``: half of the memory available at start).
    cache_dir: where such conversions go (``None``: ``<root_dir>/offline_cache``).
    """

    mixing: str = "separate"
    offline_fraction: Union[float, Callable[[], float]] = 0.5
    init_normalizers: bool = True
    in_memory_limit_mb: Optional[int] = None
    cache_dir: Optional[str] = None

    def __post_init__(self) -> None:
        if self.mixing not in MIXINGS:
            choices = ", ".join(map(repr, MIXINGS))
            raise OneLineValueError(f"OfflineData.mixing={self.mixing!r} must be one of {choices}")
        if isinstance(self.offline_fraction, (int, float)) and not 0.0 <= self.offline_fraction <= 1.0:
            raise OneLineValueError(f"OfflineData.offline_fraction={self.offline_fraction} must lie in [0, 1]")
        if self.mixing == "separate" and self.offline_fraction != 0.5:
            raise OneLineValueError("OfflineData.offline_fraction applies to mixing='mixed' (RLPD's batches); with "
                             "mixing='separate' each update trains one offline and one online batch: remove it or "
                             "set OfflineData.mixing='mixed'")
        if self.in_memory_limit_mb is not None and self.in_memory_limit_mb < 0:
            raise OneLineValueError(f"OfflineData.in_memory_limit_mb={self.in_memory_limit_mb} must be >= 0")
