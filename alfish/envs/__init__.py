"""alfish's environments. ``BatchedEnv`` and ``create_environment`` are imported on first use (PEP 562), so that an env
worker process, which imports this package to unpickle its ``EnvFactory``, does not import torch (seconds per worker).
"""
from typing import Any

from alfish.envs import toy  # noqa: F401  (registers the alfish/* toy envs)

__all__ = ["BatchedEnv", "create_environment"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from alfish.envs import batched_env

        return getattr(batched_env, name)
    raise AttributeError(f"module 'alfish.envs' has no attribute '{name}'")
