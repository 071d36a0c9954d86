"""alfish: a PyTorch-native reinforcement-learning training framework.

The oldest torch alfish runs on, ``TORCH_FLOOR``, is the newest release among the torch features it relies on
(``TORCH_FEATURES``, each with the release that introduced it); setup.py requires it, and importing alfish with an
older torch is a one-line ``TorchTooOldError`` naming what is missing. Features with an easy fallback are detected
where they are used instead (``DETECTED_TORCH_FEATURES``) and do not raise the floor. ``tests/test_torch_floor.py``
checks that setup.py's floor is this one and that every listed feature is present in the installed torch.

The check reads torch's installed version from ``torch/version.py``: importing alfish does not import torch (an env
worker process never does).
"""
from __future__ import annotations

import re
from typing import Any, Callable, NamedTuple, Optional


class TorchFeature(NamedTuple):
    """A torch feature alfish relies on. ``present(torch)``: True when the installed torch has it."""

    what: str
    where: str  # the alfish file that uses it
    since: tuple[int, int]  # the torch release that introduced it
    present: Callable[[Any], bool]


def _has_parameters(function: Callable, *names: str) -> bool:
    import inspect

    return set(names) <= set(inspect.signature(function).parameters)


def _fused_on_cpu(torch: Any) -> bool:
    """Fused Adam, AdamW and SGD accept CPU parameters (older releases refuse them at construction)."""
    params = [torch.zeros(1, requires_grad=True)]
    try:
        for optimizer in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD):
            optimizer(params, lr=0.1, fused=True)
    except RuntimeError:
        return False
    return True


def _per_device_backends(torch: Any) -> bool:
    from torch.distributed.distributed_c10d import BackendConfig

    return BackendConfig("cpu:gloo,cuda:nccl").get_device_backend_map() == {"cpu": "gloo", "cuda": "nccl"}


def _pytree_key_paths(torch: Any) -> bool:
    from torch.utils import _pytree

    return hasattr(_pytree, "tree_flatten_with_path")


TORCH_FEATURES = (
    TorchFeature("torch.func vmap(randomness='different'), stack_module_state, functional_call (batched ensembles)",
                 "alfish/networks/ensemble.py", (2, 0),
                 lambda torch: _has_parameters(torch.func.vmap, "randomness")
                 and hasattr(torch.func, "stack_module_state") and hasattr(torch.func, "functional_call")),
    TorchFeature("init_process_group(backend='cpu:gloo,cuda:nccl') (NCCL with gloo control traffic)",
                 "alfish/learn/distributed.py", (2, 0), _per_device_backends),
    TorchFeature("torch.load(mmap=True, weights_only=True) (checkpoints)", "alfish/rundir/checkpoint_format.py",
                 (2, 1), lambda torch: _has_parameters(torch.load, "mmap", "weights_only")),
    TorchFeature("torch.export.export(dynamic_shapes=...) with torch.export.Dim", "alfish/export/formats.py", (2, 2),
                 lambda torch: hasattr(torch.export, "Dim") and _has_parameters(torch.export.export, "dynamic_shapes")),
    TorchFeature("torch.compiler.cudagraph_mark_step_begin (Learner.compile_mode='reduce-overhead')",
                 "alfish/learn/learner.py", (2, 2), lambda torch: hasattr(torch.compiler, "cudagraph_mark_step_begin")),
    TorchFeature("torch.distributed.DistError (collective timeouts)", "alfish/learn/heartbeat.py", (2, 2),
                 lambda torch: hasattr(torch.distributed, "DistError")),
    TorchFeature("torch.utils._pytree.tree_flatten_with_path (replay field names)", "alfish/replay/ring_buffer.py",
                 (2, 3), _pytree_key_paths),
    TorchFeature("torch.amp.GradScaler(device_type) (fp16)", "alfish/learn/amp.py", (2, 3),
                 lambda torch: hasattr(torch.amp, "GradScaler") and _has_parameters(torch.amp.GradScaler.__init__,
                                                                                    "device")),
    TorchFeature("fused Adam, AdamW and SGD on the CPU (OptimizerConfig.fused=True, the default)",
                 "alfish/learn/optim.py", (2, 4), _fused_on_cpu),
    TorchFeature("torch.onnx.export(dynamo=True, dynamic_shapes=...) (export --format onnx)",
                 "alfish/export/formats.py", (2, 5),
                 lambda torch: _has_parameters(torch.onnx.export, "dynamo", "dynamic_shapes")),
)

#: Newer features used where present, with a fallback otherwise (tested both ways): they do not raise the floor.
DETECTED_TORCH_FEATURES = (
    TorchFeature("DistributedDataParallel(forward_sync_buffers=False) (older: broadcast_buffers=False and the buffers "
                 "broadcast once at construction by alfish)", "alfish/learn/distributed.py", (2, 13),
                 lambda torch: _has_parameters(torch.nn.parallel.DistributedDataParallel.__init__,
                                               "forward_sync_buffers")),
    # (2, 13): the first release alfish ran it on; it may be older
    TorchFeature("dynamo tracing torch.autograd.grad inside compiled code, torch._dynamo.config.trace_autograd_ops "
                 "(older: Learner.compile_scope='update' compiles the loss module only, after one warning)",
                 "alfish/learn/whole_update.py", (2, 13),
                 lambda torch: hasattr(torch._dynamo.config, "trace_autograd_ops")),
)

TORCH_FLOOR = max(feature.since for feature in TORCH_FEATURES)


class TorchTooOldError(ImportError):
    """The installed torch is older than ``TORCH_FLOOR``."""


def release_of(version: str) -> Optional[tuple[int, int]]:
    """``(major, minor)`` of a torch version string ('2.13.0+cpu', '2.5.0a0+git1234', '2.6.0.dev20241001'), or None
    when it does not start with one."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_torch_version(version: str) -> None:
    """Raise ``TorchTooOldError`` (one line) when torch ``version`` is older than ``TORCH_FLOOR``."""
    release = release_of(version)
    if release is None or release >= TORCH_FLOOR:
        return
    floor = ".".join(map(str, TORCH_FLOOR))
    missing = "; ".join(f"{f.what} (torch {f.since[0]}.{f.since[1]})" for f in TORCH_FEATURES if f.since > release)
    raise TorchTooOldError(f"alfish needs torch >= {floor} and this environment has torch {version}, which lacks: "
                           f"{missing}; upgrade it (pip install --upgrade 'torch>={floor}')")


def _installed_torch_version() -> Optional[str]:
    """torch's version, without importing it: from ``torch/version.py`` (what ``torch.__version__`` is read from;
    importlib.metadata would cost an env worker 50 ms), or from torch itself when already imported."""
    import importlib.util
    import os
    import sys

    if "torch" in sys.modules:
        return str(getattr(sys.modules["torch"], "__version__", "")) or None
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None  # not installed: the first import of torch will say so
    try:
        with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py"), encoding="utf-8") as f:
            text = f.read(1 << 16)
    except OSError:
        return None
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return match.group(1) if match else None


_version = _installed_torch_version()
if _version is not None:
    check_torch_version(_version)


# The Python entry points (``alfish.api``: ``alfish.train``, ``alfish.load_policy``), resolved on first use (PEP 562)
# so that ``import alfish`` stays cheap and imports no torch. This floor package depends on nothing of alfish when it
# is imported: it names its top layer here only by that lazy lookup (tools/import_graph.py checks import statements).
_API = ("train", "load_policy", "TrainResult", "TrainError", "Policy", "LoadPolicyError")


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib

        return getattr(importlib.import_module("alfish.api"), name)
    raise AttributeError(f"module 'alfish' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
