"""``NoCollector``: pure offline training collects nothing (DESIGN.md §3.11: offline is the case with no collector).

It stands where the training envs would be, so the loop calls it as any collector, and it describes the data's spaces
(``spec``) in place of an env's: no training env is built.
"""
from __future__ import annotations

from typing import Callable, Optional

from alfish.algorithms.base import Algorithm
from alfish.collect.collector import Collector, ProgressPoint, Sink
from alfish.collect.episode_stats import EpisodeStats
from alfish.envs.spec import EnvSpec
from alfish.transforms.base import DataTransformer


class NoCollector(Collector):
    """Collects no experience; ``spec``: the offline data's spaces (``num_envs`` 1)."""

    def __init__(self, spec: EnvSpec):
        self.spec = spec
        self.stats = EpisodeStats(spec.num_envs)

    def start(self, algorithm: Algorithm, transformer: DataTransformer, sink: Optional[Sink],
              seed: Optional[int], progress: ProgressPoint,
              before_publish: Callable[[], None] = lambda: None, resume: Optional[dict] = None) -> None:
        """Nothing acts."""

    def collect(self, steps_per_env: int) -> int:
        return 0

    def warm_up(self, steps_per_env: int) -> int:
        return 0

    def close(self) -> None:
        """No env to close."""
