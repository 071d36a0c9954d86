"""Keep large freed buffers in the process instead of returning them to the OS (glibc malloc on Linux).

An update allocates fresh activation and gradient buffers of a few hundred KB each (SAC's ``[2, 256, 256]``
activations are 512 KB). glibc serves blocks above its mmap threshold (128 KB at start, adapting upwards only after
frees) with a fresh ``mmap`` and unmaps them on ``free``, so every update page-faults its buffers in again, and trims
the heap top above 128 KB. Raising both thresholds keeps the buffers in the heap, where the next update reuses them:
SAC's update (Pendulum, batch 256, 256x256) took 3.99-4.39 ms (60-65% of its FLOP floor) against 4.12-4.87 ms
(53-63%) with malloc's defaults, median 4.36 vs 4.69 ms, in four alternating pairs of
``tools/bench/sac_update_floor.py [--host_memory_cache_mb 0]`` (2-core development machine, 2026-11-24). The cost:
up to ``cache_mb`` of freed memory stays in the process's RSS. On other platforms (or another libc) this does
nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
_MAX_MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc caps M_MMAP_THRESHOLD at 32 MB on 64-bit (HEAP_MAX / 2)


def keep_freed_host_memory(cache_mb: int) -> bool:
    """Raise glibc's mmap and trim thresholds so freed blocks up to 32 MB are reused and up to ``cache_mb`` MB of free
    heap is kept; ``cache_mb=0`` leaves malloc as it is. Returns whether the setting took effect."""
    if cache_mb <= 0 or not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt): nothing to tune
        return False
    cache = cache_mb * 1024 * 1024
    ok = (mallopt(M_MMAP_THRESHOLD, min(cache, _MAX_MMAP_THRESHOLD)) == 1
          and mallopt(M_TRIM_THRESHOLD, cache) == 1 and mallopt(M_TOP_PAD, min(cache, 64 * 1024 * 1024)) == 1)
    logging.debug("malloc keeps freed blocks up to %d MB (took effect: %s)", cache_mb, ok)
    return ok
