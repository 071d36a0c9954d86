"""Capture and restore the global random number generators as checkpoint data (tensors + JSON, nothing pickled).

Covered: torch's CPU generator, torch's CUDA generators (when CUDA is initialized), numpy's global ``np.random``
state (MT19937) and python's ``random`` module. Use::

    rng_tensors, rng_meta = capture_rng_state()
    checkpointer.save(step, {"rng": rng_tensors, ...}, {"rng": rng_meta, ...})
    ...
    restore_rng_state(ckpt.tensors["rng"], ckpt.meta["rng"])

Generators owned by objects (``np.random.Generator``, ``torch.Generator`` instances, gymnasium env RNGs) are not
global and are the owner's to save.
"""
from __future__ import annotations

import logging
import random

import numpy as np
import torch

from alfish.rundir.checkpoint_format import CheckpointError

__all__ = ["capture_rng_state", "restore_rng_state"]

logger = logging.getLogger(__name__)

RNG_FORMAT = 1


def capture_rng_state() -> tuple[dict[str, torch.Tensor], dict]:
    """The current state of the global RNGs.

    Returns:
        ``(tensors, meta)``: ``tensors`` maps ``"torch_cpu"`` (uint8 state), ``"torch_cuda_<i>"`` (uint8 state of
        device ``i``) and ``"numpy_keys"`` (the 624 MT19937 words, as int64) to CPU tensors; ``meta`` is JSON-able and
        holds the rest (numpy's position and cached gaussian, python ``random``'s state as lists).

    CUDA generators are captured only when CUDA is already initialized in this process: if it is not, no CUDA random
    number has been drawn, and capturing would create a CUDA context on every visible device.
    """
    tensors: dict[str, torch.Tensor] = {"torch_cpu": torch.get_rng_state().clone()}
    n_cuda = 0
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = state.cpu().clone()
            n_cuda += 1

    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    tensors["numpy_keys"] = torch.from_numpy(np.asarray(keys, dtype=np.int64).copy())

    version, internal, gauss_next = random.getstate()
    meta = {
        "format": RNG_FORMAT,
        "torch_cuda_devices": n_cuda,
        "numpy": {"bit_generator": str(kind), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached_gaussian)},
        "python_random": {"version": int(version), "internal": [int(x) for x in internal],
                          "gauss_next": None if gauss_next is None else float(gauss_next)},
    }
    return tensors, meta


def restore_rng_state(tensors: dict, meta: dict) -> None:
    """Set the global RNGs to a state from :func:`capture_rng_state`, so the same random draws follow.

    CUDA states are restored for the devices present in both the checkpoint and this process; a different device
    count is logged as a warning (the run continues, but CUDA draws will differ from the original run).

    Raises:
        CheckpointError: ``tensors``/``meta`` are not an RNG state written by :func:`capture_rng_state`.
    """
    try:
        if meta.get("format") != RNG_FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, expected {RNG_FORMAT}")
        cpu = tensors["torch_cpu"]
        np_meta = meta["numpy"]
        keys = tensors["numpy_keys"]
        py = meta["python_random"]
        np_state = (np_meta["bit_generator"], np.asarray(keys.cpu().numpy(), dtype=np.uint32), int(np_meta["pos"]),
                    int(np_meta["has_gauss"]), float(np_meta["cached_gaussian"]))
        py_state = (int(py["version"]), tuple(int(x) for x in py["internal"]),
                    None if py["gauss_next"] is None else float(py["gauss_next"]))
        n_saved = int(meta.get("torch_cuda_devices", 0))
        np.random.set_state(np_state)  # (these two check their numbers: out of range is malformed)
        random.setstate(py_state)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise CheckpointError(f"the RNG state in the checkpoint is malformed ({type(e).__name__}: "
                              f"{str(e)[:200]}); it was not written by alfish.rundir.rng.capture_rng_state") from e

    torch.set_rng_state(cpu.to(device="cpu", dtype=torch.uint8))

    if n_saved:
        n_here = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n_here != n_saved:
            logger.warning("the checkpoint holds CUDA RNG states for %d device(s) but %d are visible here; restoring "
                           "%d, CUDA random draws will not repeat the original run", n_saved, n_here,
                           min(n_saved, n_here))
        for i in range(min(n_saved, n_here)):
            torch.cuda.set_rng_state(tensors[f"torch_cuda_{i}"].to(device="cpu", dtype=torch.uint8), device=i)
