"""Writing an ``ExportedPolicy`` as a ``torch.export`` program (``.pt2``) or an ONNX model, and loading either back
as a function of numpy arrays, the way a deployment would run it.

Both are traced with a dynamic batch dimension (``torch.export.Dim('batch')``) on every input and output, so one file
serves any batch size >= 1. ONNX goes through the dynamo exporter (``torch.onnx.export(..., dynamo=True)``, which
needs ``onnx`` and ``onnxscript``); running it needs ``onnxruntime``. All three are the ``export`` extra.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import torch

from alfish.export.policy_module import ExportedPolicy

FORMATS = ("pt2", "onnx")
SUFFIXES = {"pt2": ".pt2", "onnx": ".onnx"}
EXPORT_EXTRA = "pip install 'alfish[export]'"

#: A loaded program: the inputs (numpy arrays, in ``ExportedPolicy.input_specs`` order) -> the outputs.
Runner = Callable[[Sequence[np.ndarray]], list[np.ndarray]]


class MissingPackageError(ImportError):
    """A package of the ``export`` extra is not installed; the message is one line saying how to install it."""


def check_format_packages(fmt: str) -> None:
    """Refuses ``fmt`` when a package its exporter needs is missing (before anything is loaded or traced).

    Raises:
        MissingPackageError: one line naming the package and ``pip install 'alfish[export]'``.
    """
    if fmt != "onnx":
        return
    for package in ("onnx", "onnxscript"):
        try:
            __import__(package)
        except ImportError:
            raise MissingPackageError(f"--format onnx needs the {package} package, which is not installed: "
                                      f"{EXPORT_EXTRA}") from None


def export_program(policy: ExportedPolicy, example: Sequence[torch.Tensor], fmt: str, path: str) -> None:
    """Traces ``policy`` on ``example`` (its inputs, a batch of >= 2: torch.export specializes a batch of 1) and writes
    the program to ``path`` in format ``fmt``."""
    example = tuple(example)
    batch = torch.export.Dim("batch", min=1)
    # forward(*inputs): one spec per input, inside the one varargs argument.
    dynamic_shapes = (tuple({0: batch} for _ in example),)
    with _quiet_export():
        if fmt == "pt2":
            program = torch.export.export(policy, example, dynamic_shapes=dynamic_shapes)
            torch.export.save(program, path)
            return
        onnx_program = torch.onnx.export(policy, example, dynamo=True, dynamic_shapes=dynamic_shapes,
                                         input_names=[s.name for s in policy.input_specs],
                                         output_names=[s.name for s in policy.output_specs], verbose=False)
        # One self-contained file: a policy is far below ONNX's 2 GB limit for weights inside the model.
        onnx_program.save(path, external_data=False)


def load_program(path: str, fmt: str) -> Optional[Runner]:
    """The program at ``path`` as a ``Runner``: ``torch.export.load(path).module()`` for pt2, an onnxruntime CPU
    session for ONNX; ``None`` for ONNX when onnxruntime is not installed (the caller says the check was skipped)."""
    if fmt == "pt2":
        module = torch.export.load(path).module()

        def run_pt2(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
            with torch.no_grad():
                outputs = module(*(torch.from_numpy(np.ascontiguousarray(x)) for x in inputs))
            return [out.numpy() for out in outputs]

        return run_pt2
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run_onnx(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return session.run(None, dict(zip(names, inputs)))

    return run_onnx


@contextlib.contextmanager
def _quiet_export() -> Iterator[None]:
    """Silences what the exporters print that says nothing about this policy: torch.onnx's and onnxscript's log lines
    (torchvision operators not registered, optimizer passes), a deprecation inside torch, a note that the inputs share
    one batch axis. (``RLAlgorithm``'s cache of the action-bound maps is neither read nor written while tracing,
    ``torch.compiler.is_compiling()``, so exporting warns of no tensor attribute assigned.)"""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            # (every input's batch is the one Dim, so the exporter names it once)
            warnings.filterwarnings("ignore", message=r"# The axis name: batch will not be used")
            warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
