"""The record of the config a run used: the texts of ``root_dir/config/operative.gin`` (with the bindings never used)
and ``full.gin``, made once the training objects are built (``alfish.rundir.config_files`` writes them)."""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

import gin
from gin import config as gin_config

from alfish.config.conf_error import one_line
from alfish.config.gin_names import binding_key

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ConfigRecord:
    """The record of the config a run used: ``files`` maps a file name of ``root_dir/config/`` to its text;
    ``unused`` lists the bindings that were set but never used ('scope/Name.param = value')."""

    files: dict[str, str]
    unused: list[str]


def config_record() -> ConfigRecord:
    """The texts of ``operative.gin`` and ``full.gin`` and the bindings that were set but never used.

    operative.gin holds the bindings the program actually used (gin.operative_config_str(), defaults included),
    followed by one ``# UNUSED: Name.param = value`` comment per unused binding; full.gin holds everything that was
    set (gin.config_str()). Call it after the training objects have been built: gin counts a binding as used only
    once its configurable has been called. Each unused binding is also logged as a warning (one line each), so the
    caller need not log them again. Writing the files into a root_dir is ``alfish.rundir.config_files``'s (it
    writes only through the results directory's safe paths).
    """
    unused = unused_bindings()
    operative = gin.operative_config_str()
    if unused:
        operative += ('\n\n# Bindings set in the conf but never used (their configurable was not called, '
                      'or its caller passed the value itself):\n')
        operative += ''.join(f'# UNUSED: {binding}\n' for binding in unused)
    for binding in unused:
        logger.warning("gin binding set but never used: %s", binding)
    return ConfigRecord(files={'operative.gin': operative, 'full.gin': gin.config_str()}, unused=unused)


def unused_bindings() -> list[str]:
    """Bindings ('scope/Name.param = value') that are set but did not supply the value of any call so far.

    A binding supplies a call's value when the call's scope equals or lies inside the binding's scope, no binding in
    a more specific scope sets the same parameter, and the caller did not pass the parameter itself.
    """
    used = _used_binding_keys()
    return sorted(_format_binding(scope, selector, arg, value)
                  for (scope, selector), params in gin_config._CONFIG.items()
                  for arg, value in params.items() if (scope, selector, arg) not in used)


def _used_binding_keys() -> set[tuple[str, str, str]]:
    """(scope, selector, param) of every binding that supplied a value to some configurable call."""
    used = set()
    with gin_config._OPERATIVE_CONFIG_LOCK:
        operative = {key: list(params) for key, params in gin_config._OPERATIVE_CONFIG.items()}
    for (call_scope, selector), params in operative.items():
        for arg in params:
            binding_scope = _supplying_scope(call_scope, selector, arg)
            if binding_scope is not None:
                used.add((binding_scope, selector, arg))
    return used


def _supplying_scope(call_scope: str, selector: str, arg: str) -> Optional[str]:
    """The scope of the binding gin used for `arg` in a call made in `call_scope`: the most specific bound one."""
    components = call_scope.split('/') if call_scope else []
    for depth in range(len(components), -1, -1):
        scope = '/'.join(components[:depth])
        if arg in gin_config._CONFIG.get((scope, selector), {}):
            return scope
    return None


def _format_binding(scope: str, selector: str, arg: str, value: Any) -> str:
    """'scope/Name.param = value' on one line."""
    return f'{binding_key(scope, selector, arg)} = {one_line(repr(value))}'
