"""What the trackers get when a run starts: the operative gin config as parameters, and the run record's git tags."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from gin import config as gin_config

from alfish.config.gin_names import binding_key
from alfish.rundir.safe_paths import kind_in_root, read_bytes_in_root
from alfish.rundir.trackers.base import RunRecordInfo

_GIT_TXT_BYTES = 1 << 20
_PLAIN = (bool, int, float, str, type(None))


def operative_params() -> dict[str, Any]:
    """``{'scope/Name.param': value}`` of every parameter gin supplied so far (``gin.operative_config_str()``'s
    bindings, defaults included), sorted; a value that is not a bool, number, string or None (or a list of them) is
    given as its gin text (``@SacAlgorithm``, ...)."""
    with gin_config._OPERATIVE_CONFIG_LOCK:  # (alfish.config.config_record reads gin's record the same way)
        operative = {key: dict(params) for key, params in gin_config._OPERATIVE_CONFIG.items()}
    params = {}
    for (scope, selector), values in operative.items():
        for arg, value in values.items():
            params[binding_key(scope, selector, arg)] = _plain(value)
    return dict(sorted(params.items()))


def _plain(value: Any) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value):
        return list(value)
    return repr(value)


def run_record_info(root_dir: str, folder: Optional[Path]) -> Optional[RunRecordInfo]:
    """The run record at ``folder`` (inside ``root_dir``; None: no run record, ``Trainer.run_record=False``) with
    the git tags of its ``git.txt`` (none without a git checkout)."""
    if folder is None:
        return None
    tags: dict[str, str] = {}
    git_txt = os.path.join(folder, "git.txt")
    if kind_in_root(root_dir, git_txt) == "file":
        lines = read_bytes_in_root(root_dir, git_txt, _GIT_TXT_BYTES).decode("utf-8", "replace").splitlines()
        fields = dict(line.split(" ", 1) for line in lines[:2] if " " in line)  # 'commit <sha>', 'branch <name>'
        if "commit" in fields:
            tags["git_commit"] = fields["commit"].strip()
        if "branch" in fields:
            tags["git_branch"] = fields["branch"].strip()
        status = lines[3:] if len(lines) > 2 and lines[2] == "status:" else []
        tags["git_dirty"] = "true" if any(line.strip() for line in status) else "false"
    return RunRecordInfo(folder=Path(folder), tags=tags)


def record_files(root_dir: str, folder: Path) -> list[Path]:
    """The regular files of the run record ``folder`` (relative to it), found without following a link."""
    found = []
    for dirpath, _dirnames, filenames in os.walk(folder, followlinks=False):
        for name in filenames:
            path = Path(dirpath, name)
            if kind_in_root(root_dir, str(path)) == "file":
                found.append(path.relative_to(folder))
    return sorted(found)
