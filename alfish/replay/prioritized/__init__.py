"""Prioritized replay: ``PrioritizedSampler`` (``base``: the contract and the shared part) and its two
implementations, ``HostPrioritizedSampler`` (numpy, trees on the CPU) and ``DevicePrioritizedSampler`` (torch, trees on
a device); ``make_prioritized_sampler`` builds the trainer's from its config."""
from alfish.replay.prioritized.base import PrioritizedSampler, PriorityOptions
from alfish.replay.prioritized.device import DevicePrioritizedSampler
from alfish.replay.prioritized.factory import make_prioritized_sampler
from alfish.replay.prioritized.host import HostPrioritizedSampler

__all__ = ["DevicePrioritizedSampler", "HostPrioritizedSampler", "PrioritizedSampler", "PriorityOptions",
           "make_prioritized_sampler"]
