from alfish.replay.batching import WholeBufferBatches, to_time_major, whole_buffer_minibatches
from alfish.replay.mapped_ring_buffer import MappedRingBuffer
from alfish.replay.prioritized import PrioritizedSampler
from alfish.replay.replay_buffer import ReplayBuffer
from alfish.replay.ring_buffer import RingBuffer
from alfish.replay.samplers import Sampler, UniformSampler
from alfish.replay.segment_tree import MinTree, SumTree
from alfish.replay.staging import BatchStager
from alfish.replay.storage import STORAGE_LOCATIONS, make_storage

__all__ = ["STORAGE_LOCATIONS", "BatchStager", "MappedRingBuffer", "MinTree", "PrioritizedSampler", "ReplayBuffer",
           "RingBuffer", "Sampler", "SumTree", "UniformSampler", "WholeBufferBatches", "make_storage", "to_time_major",
           "whole_buffer_minibatches"]
