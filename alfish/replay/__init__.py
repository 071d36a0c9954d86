from alfish.replay.batching import WholeBufferBatches, to_time_major, whole_buffer_minibatches
from alfish.replay.ring_buffer import RingBuffer

__all__ = ["RingBuffer", "WholeBufferBatches", "to_time_major", "whole_buffer_minibatches"]
