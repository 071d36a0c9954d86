"""What code produced a result: ALF's ``code_snapshots`` and alfish's run record, both written when training starts.

* ``TrainerConfig.code_snapshots`` (ALF's meaning): a list of source files, each recorded as TensorBoard text
  (``code/<path>``, step 0). A path is read as given (absolute, or relative to the working directory), else relative
  to the alfish package (``'algorithms/sac.py'``). A missing file is a one-line error before training.
* ``Trainer.run_record`` (on by default): ``ROOT_DIR/run_record/<start time>/`` holds
    - ``git.txt``: the commit, branch and ``git status`` of the checkout alfish runs from, and ``git.diff`` (its
      uncommitted changes); without a git checkout, ``alfish_source/``: a copy of the package's ``.py`` files;
    - ``packages.txt``: the installed distributions and versions (as ``pip freeze`` lists them);
    - ``conf/``: the conf file given to ``train`` and ``command.txt``: the command line;
    - ``user_modules/``: the source of the modules the conf imports (its ``import`` lines) that are neither part of
      alfish nor installed packages.
  Source copies are stored with a ``.txt`` suffix (``sac.py.txt``) and nothing reads them back: no copy is ever put on
  ``sys.path`` when a root_dir is read (DESIGN.md §3.13). Each start of the run (a resume too) writes its own folder.
  The folder is made and written through ``alfish.rundir.safe_paths`` (a symlinked ``run_record/`` is refused, not
  written through); what is copied (the conf, modules, alfish's source) is read from the user's own, trusted paths.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import logging
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Optional, Sequence

import alfish
from alfish.rundir.safe_paths import make_dirs_in_root, open_in_root

PACKAGE_DIR = Path(alfish.__file__).resolve().parent
MAX_SNAPSHOT_BYTES = 1 << 20  # a code snapshot larger than this is cut (TensorBoard text is for reading)
_IMPORT = re.compile(r"^\s*import\s+([A-Za-z_][\w.]*)", re.MULTILINE)


# ------------------------------------------------------------------------------------------------ code_snapshots ----
def resolve_snapshots(paths: Optional[Sequence[str]]) -> list[Path]:
    """The files of ``TrainerConfig.code_snapshots``; a missing one is a one-line ValueError."""
    files = []
    for path in paths or ():
        candidates = [Path(path), PACKAGE_DIR / path]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            raise ValueError(f"TrainerConfig.code_snapshots: {path!r} is not a file (looked in the working directory "
                             f"and in the alfish package {PACKAGE_DIR}); give a source file's path")
        files.append(found)
    return files


def snapshot_texts(files: Sequence[Path]) -> dict[str, str]:
    """``{tag: markdown}`` for TensorBoard's text tab: each file in a code block (cut at ``MAX_SNAPSHOT_BYTES``)."""
    texts = {}
    for file in files:
        data = file.read_bytes()[:MAX_SNAPSHOT_BYTES].decode("utf-8", errors="replace")
        name = os.path.relpath(file, PACKAGE_DIR) if file.resolve().is_relative_to(PACKAGE_DIR) else str(file)
        texts[f"code/{name}"] = "```\n" + data + "\n```"
    return texts


# ------------------------------------------------------------------------------------------------- run record ----
def write_run_record(root_dir: str, conf_file: Optional[str], argv: Sequence[str]) -> Path:
    """Write ``ROOT_DIR/run_record/<start time>/`` (see the module docstring); returns the folder. Failures to read
    git or the packages are noted in the record, never fatal.

    Raises:
        UnsafePathError: ``run_record/`` (or a folder in it) is a symlink, ... (one line); OSError: the disk.
    """
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    folder = Path(make_dirs_in_root(root_dir, os.path.join("run_record", stamp)))
    record = _RecordWriter(root_dir, folder)
    record.write("command.txt", " ".join(argv) + "\n")
    record.write("packages.txt", installed_packages())
    if not _write_git(record):
        _copy_sources(PACKAGE_DIR, record, "alfish_source")
    if conf_file and Path(conf_file).is_file():
        conf = Path(conf_file)
        record.write(f"conf/{conf.name}", conf.read_bytes())
        for module_file in user_module_files(conf.read_text()):
            record.write(f"user_modules/{module_file.name}.txt", module_file.read_bytes())
    logging.info("run record written to %s", folder)
    return folder


class _RecordWriter:
    """Writes the files of one run record ``folder`` (inside ``root_dir``) through ``safe_paths``."""

    def __init__(self, root_dir: str, folder: Path) -> None:
        self.root_dir, self.folder = root_dir, folder

    def write(self, name: str, content: str | bytes) -> None:
        """The new file ``folder/name`` (``name`` may hold '/': its folders are made) with ``content``."""
        data = content.encode("utf-8") if isinstance(content, str) else content
        with open_in_root(self.root_dir, str(self.folder / name), "wb", create_dirs=True) as f:
            f.write(data)


def installed_packages() -> str:
    """``name==version`` of every installed distribution, sorted (``pip freeze``'s list, without running pip)."""
    names = {f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions() if d.metadata['Name']}
    return "\n".join(sorted(names, key=str.lower)) + "\n"


def user_module_files(conf_text: str) -> list[Path]:
    """Source files of the modules a conf imports (``import x.y`` lines) that are neither alfish's nor installed
    packages' nor the standard library's (only modules already imported: the conf was loaded before)."""
    excluded = [PACKAGE_DIR] + [Path(p).resolve() for p in {sysconfig.get_paths()["purelib"],
                                                              sysconfig.get_paths()["platlib"],
                                                              sysconfig.get_paths()["stdlib"]}]
    files = []
    for name in _IMPORT.findall(conf_text):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if not path or not path.endswith(".py"):
            continue
        path = Path(path).resolve()
        if not any(path.is_relative_to(root) for root in excluded):
            files.append(path)
    return files


def _write_git(record: _RecordWriter) -> bool:
    """``git.txt`` and ``git.diff`` of the checkout holding alfish; False when it is not in one (or git is missing)."""
    def git(*args: str) -> Optional[str]:
        try:
            out = subprocess.run(["git", *args], cwd=PACKAGE_DIR, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return False
    branch = git("rev-parse", "--abbrev-ref", "HEAD") or "?"
    status = git("status", "--short") or ""
    record.write("git.txt", f"commit {commit.strip()}\nbranch {branch.strip()}\nstatus:\n{status}")
    record.write("git.diff", git("diff", "HEAD") or "")
    return True


def _copy_sources(package: Path, record: _RecordWriter, dest: str) -> None:
    """A copy of ``package``'s ``.py`` files (each as ``<name>.py.txt``) in the record's folder ``dest``."""
    for file in package.rglob("*.py"):
        record.write(f"{dest}/{file.relative_to(package).as_posix()}.txt", file.read_bytes())
