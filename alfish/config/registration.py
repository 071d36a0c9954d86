"""Registering the configurables a conf may name: every module of alfish's configurable packages is imported."""
from __future__ import annotations

import importlib
import logging
import pkgutil
from types import ModuleType
from typing import Optional, Sequence

logger = logging.getLogger(__name__)


# Packages whose modules define the configurables a conf may name; every module under them is imported before parsing.
CONFIGURABLE_PACKAGES: tuple[str, ...] = (
    'alfish.algorithms', 'alfish.envs', 'alfish.learn', 'alfish.networks', 'alfish.trainer',
    'alfish.transforms', 'alfish.replay', 'alfish.schedulers',
)


def register_configurables(packages: Optional[Sequence[str]] = None) -> list[str]:
    """Imports every module of `packages` so their `@gin.configurable`s are registered; returns the packages found.

    `packages` defaults to CONFIGURABLE_PACKAGES (read at call time). A package that does not exist (yet) is
    skipped; any other import error, including a missing module imported by an existing one, propagates unchanged.
    """
    found = []
    for name in CONFIGURABLE_PACKAGES if packages is None else packages:
        package = _import_if_exists(name)
        if package is None:
            logger.debug("Package %s does not exist; none of its configurables are registered", name)
            continue
        found.append(name)
        _import_submodules(package)
    return found


def _import_if_exists(name: str) -> Optional[ModuleType]:
    """Imports module `name`; None if it (or a parent package) does not exist. Other failures propagate."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        missing = error.name or ''
        if missing and (name == missing or name.startswith(missing + '.')):
            return None
        raise


def _import_submodules(package: ModuleType) -> None:
    """Imports every module below `package` (recursively); the first import error propagates."""
    if not hasattr(package, '__path__'):
        return  # A plain module: nothing below it.
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + '.', onerror=_reraise_import):
        importlib.import_module(info.name)


def _reraise_import(name: str) -> None:
    """pkgutil's onerror hook: imports `name` again so its real exception propagates instead of being skipped."""
    importlib.import_module(name)
