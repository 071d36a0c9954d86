"""Where experience comes from: the Unroller (the one unroll loop), the synchronous collector around it and the
asynchronous one whose child process runs it."""
from alfish.collect.collector import Collector, ProgressPoint, SyncCollector
from alfish.collect.episode_stats import EpisodeStats
from alfish.collect.unroller import Unroller

__all__ = ["Collector", "EpisodeStats", "ProgressPoint", "SyncCollector", "Unroller"]
