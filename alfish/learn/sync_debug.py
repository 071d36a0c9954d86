"""Find host-device synchronizations without a GPU (DESIGN.md §3.12).

On a GPU, reading a tensor's value on the host (``.item()``, ``float(t)``, ``if t:``, ``.tolist()``, ``.cpu()``,
``.numpy()``), or an op whose output shape depends on the data (``nonzero``, boolean-mask indexing,
``masked_select``, ``unique``) makes the host wait for the device. On the CPU these calls cost nothing, so they hide
there; ``SyncCounter`` records them as they happen (a ``TorchFunctionMode`` sees every tensor method call) with the
first source line outside torch that made them, so a CPU test can assert that code which must not synchronize makes
none of them:

    with SyncCounter() as syncs:
        learner.update(batch, batch_info)
    assert syncs.calls == [], syncs.report()

Not counted: ``.to('cpu')``. On the CPU it cannot be told from a move to a training device that happens to be the CPU
(``x.to(self.device)``); the meta-device update test catches a copy to the host (a meta tensor cannot be copied out),
and ``torch.cuda.set_sync_debug_mode('error')`` is the GPU's own check of all of it (tests marked ``cuda``).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

#: Tensor methods that read values on the host (a device sync when the tensor is on a GPU).
#: (``__index__``: ``range(t)``, ``list[t]``; ``equal``/``allclose``/``is_nonzero`` answer with a Python bool.)
READS = frozenset({"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__", "__format__",
                   "__repr__", "equal", "allclose", "is_nonzero"})
#: Ops whose output shape depends on the data (the host must learn the shape).
DATA_DEPENDENT = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive",
                            "repeat_interleave"})
_TORCH_DIR = os.path.dirname(torch.__file__)
_THIS_FILE = os.path.abspath(__file__)


def _name(func: Callable) -> str:
    return getattr(func, "__name__", str(func))


def _bool_mask(args: tuple) -> bool:
    """Whether ``Tensor.__getitem__``/``__setitem__`` is indexed with a boolean tensor (a data-dependent shape)."""
    index = args[1] if len(args) > 1 else None
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


class SyncCounter(TorchFunctionMode):
    """Records each call that would synchronize with a GPU: its name in ``calls`` (``'__getitem__[bool mask]'`` for
    mask indexing) and ``'file:line'`` of the code that made it in ``sites``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.sites: list[str] = []

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = _name(func)
        if name in ("__getitem__", "__setitem__") and _bool_mask(args):
            name = f"{name}[bool mask]"
        if name in READS or name in DATA_DEPENDENT or name.endswith("[bool mask]"):
            self.calls.append(name)
            self.sites.append(_caller())
        return func(*args, **kwargs)

    def report(self) -> str:
        """The calls, one line per kind and site, most frequent first."""
        counts: dict[tuple[str, str], int] = {}
        for call in zip(self.calls, self.sites):
            counts[call] = counts.get(call, 0) + 1
        return "\n".join(f"{n} x {name} at {where}" for (name, where), n in
                         sorted(counts.items(), key=lambda kv: -kv[1]))


def _caller() -> str:
    """``file:line`` of the innermost frame outside torch and this module."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_TORCH_DIR) and filename != _THIS_FILE:
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"
