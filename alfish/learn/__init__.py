"""Loss -> update: the Learner (optimizer, scheduled learning rates, clipping, non-finite guard), AMP and DDP.

Import from the modules (``alfish.learn.learner``, ``.optim``, ``.amp``, ``.distributed``); the names below are also
reachable here, imported on first use so ``import alfish.learn.optim`` stays light.
"""
from __future__ import annotations

import importlib

_EXPORTS = {"AmpPolicy": "amp", "Learner": "learner", "NonFiniteLossError": "learner", "OptimizerConfig": "optim",
            "loss_terms": "learner"}
__all__ = ["AmpPolicy", "Learner", "NonFiniteLossError", "OptimizerConfig", "loss_terms"]


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"alfish.learn.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'alfish.learn' has no attribute '{name}'")
