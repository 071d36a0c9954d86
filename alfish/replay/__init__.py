from alfish.replay.batching import WholeBufferBatches, to_time_major, whole_buffer_minibatches
from alfish.replay.prioritized import PrioritizedSampler
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.samplers import Sampler, UniformSampler
from alfish.replay.segment_tree import MinTree, SumTree

__all__ = ["MinTree", "PrioritizedSampler", "ReplayBuffer", "RingBuffer", "Sampler", "SumTree", "UniformSampler",
           "WholeBufferBatches", "to_time_major", "whole_buffer_minibatches"]
