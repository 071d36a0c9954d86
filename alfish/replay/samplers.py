"""What a replay sampler is (``Sampler``) and the uniform one (``UniformSampler``).

A sampler decides which stored sequences a training batch is made of. It never owns data: the ``ReplayBuffer`` that
holds it passes its ``RingBuffer`` to every call, and tells it about every change of the storage (``on_add`` after each
add, ``on_clear`` after each clear), so a sampler that keeps per-slot state (priorities) never has to detect changes
nor keep its own copy of the storage's counters. Positions are absolute write indices (see ``ring_buffer.py``).
"""
from __future__ import annotations

import torch

from alfish.data.types import BatchInfo
from alfish.replay.ring_buffer import RingBuffer


class Sampler:
    """Interface of the samplers a ``ReplayBuffer`` drives. Every hook but ``sample`` defaults to doing nothing."""

    def attach(self, storage: RingBuffer) -> None:
        """Called once, by ``ReplayBuffer.__init__``: check that the sampler fits ``storage`` (and take note of steps
        it already holds)."""

    def on_add(self, storage: RingBuffer, env_ids: torch.Tensor, write_counts_before: torch.Tensor) -> None:
        """``storage.add`` has just written one step to each of ``env_ids`` ``[N]`` (CPU int64), at the absolute
        indices ``write_counts_before`` ``[N]`` (the envs' write counts before the add). The (env, index) pairs are
        distinct, the envs not always: ``ReplayBuffer.add_steps`` passes the ``T`` steps of each env at once."""

    def on_clear(self, storage: RingBuffer, oldest_before: torch.Tensor) -> None:
        """``storage.clear`` has just moved the oldest readable index of each env from ``oldest_before`` ``[num_envs]``
        to ``storage.oldest_index()``."""

    def sample(self, storage: RingBuffer, batch_size: int, length: int, num_batches: int = 1) -> BatchInfo:
        """Where ``batch_size`` sequences of ``length`` steps start: ``BatchInfo`` with ``env_ids`` and ``positions``
        int64 ``[batch_size]`` (every sequence fully readable and not running past the newest step; on the CPU, or
        on the sampler's device for a sampler that keeps its state there) and ``importance_weights`` float32
        ``[batch_size]`` or ``None``. In the steady state (enough steps stored) it must not read a device tensor
        back to the host (no ``.item()``, ``bool()``, ``.cpu()``...): ``RingBuffer.holds_sequence`` answers
        "enough?".

        ``num_batches``: that many mini-batches drawn at once, as ``num_batches`` calls would draw them from the
        same state (``[num_batches * batch_size]``, batch ``k`` the ``k``-th block of ``batch_size``)."""
        raise NotImplementedError

    def update_priorities(self, storage: RingBuffer, batch_info: BatchInfo, priorities: torch.Tensor) -> None:
        """New priorities ``[B]`` for the sequences of ``batch_info`` (as returned by ``sample``)."""

    def flush(self, storage: RingBuffer) -> None:
        """Apply any priority update still deferred (called before ``state_dict``)."""

    def state_dict(self) -> dict:
        """Tensors only; restored after the storage (``ReplayBuffer.load_state_dict`` does it in that order)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore from ``state_dict``."""


def check_length(length: int) -> None:
    if length < 1:
        raise ValueError(f"sequences must be at least 1 step long, asked for length={length}")


def too_few_steps(num_stored: torch.Tensor, length: int) -> RuntimeError:
    """The error of a sample from a buffer that holds no sequence of ``length`` steps (same text for every sampler)."""
    return RuntimeError(f"the replay buffer holds {num_stored.tolist()} steps per env, too few for sequences of "
                        f"mini_batch_length={length}; collect more (initial_collect_steps)")


class UniformSampler(Sampler):
    """Every fully stored sequence of ``length`` steps equally likely (with replacement); no importance weights.

    ``generator`` (a CPU generator, public so it can be reseeded) makes the draws reproducible; ``None`` uses torch's
    global generator. Draws and indices stay on the CPU wherever the storage is (``RingBuffer.gather`` moves the
    indices to a device storage in one non-blocking copy); nothing here reads a tensor back, so a sample never
    waits for the device.
    """

    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator

    def sample(self, storage: RingBuffer, batch_size: int, length: int, num_batches: int = 1) -> BatchInfo:
        check_length(length)
        batch_size *= num_batches  # (draws with replacement: the blocks are independent batches)
        num_stored = storage.num_stored()
        if not storage.holds_sequence(length):  # Python ints once enough is stored: no tensor is read
            raise too_few_steps(num_stored, length)
        starts = torch.clamp(num_stored - length + 1, min=0)  # sequences that fit, per env  [num_envs]
        # An env with probability proportional to its number of starts, then a start uniformly inside it: uniform over
        # all starts. (These two draws, in this order, are what runs have always drawn: seeded runs stay the same.)
        env_ids = torch.multinomial(starts.float(), batch_size, replacement=True, generator=self.generator)
        # (index_select, not starts[env_ids]: advanced indexing costs several times more per call on CPU)
        offsets = (torch.rand(batch_size, generator=self.generator) * starts.index_select(0, env_ids)).long()
        positions = storage.oldest_index().index_select(0, env_ids) + offsets
        return BatchInfo(env_ids=env_ids, positions=positions)
