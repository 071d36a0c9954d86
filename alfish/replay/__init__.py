from alfish.replay.batching import to_time_major, whole_buffer_minibatches
from alfish.replay.ring_buffer import RingBuffer

__all__ = ["RingBuffer", "to_time_major", "whole_buffer_minibatches"]
