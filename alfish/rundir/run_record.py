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
"""
from __future__ import annotations

import datetime
import importlib.metadata
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Optional, Sequence

import alfish

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
    git or the packages are noted in the record, never fatal."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    folder = Path(root_dir) / "run_record" / stamp
    folder.mkdir(parents=True, exist_ok=False)
    (folder / "command.txt").write_text(" ".join(argv) + "\n")
    (folder / "packages.txt").write_text(installed_packages())
    if not _write_git(folder):
        _copy_sources(PACKAGE_DIR, folder / "alfish_source")
    if conf_file and Path(conf_file).is_file():
        (folder / "conf").mkdir()
        shutil.copy2(conf_file, folder / "conf" / Path(conf_file).name)
        for module_file in user_module_files(Path(conf_file).read_text()):
            (folder / "user_modules").mkdir(exist_ok=True)
            shutil.copy2(module_file, folder / "user_modules" / f"{module_file.name}.txt")
    logging.info("run record written to %s", folder)
    return folder


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


def _write_git(folder: Path) -> bool:
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
    (folder / "git.txt").write_text(f"commit {commit.strip()}\nbranch {branch.strip()}\nstatus:\n{status}")
    (folder / "git.diff").write_text(git("diff", "HEAD") or "")
    return True


def _copy_sources(package: Path, dest: Path) -> None:
    for file in package.rglob("*.py"):
        target = dest / file.relative_to(package)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(file, target.with_name(target.name + ".txt"))
