"""Writes under the root_dir that the disk refuses (full, over quota, read-only, not permitted), told in one line.

A run writes checkpoints, TensorBoard events, ``log.txt``, ``eval_log.jsonl`` and the config record under its
root_dir. When the file system refuses one of those writes, the user needs one line saying which path failed, why
(the errno's name) and what to free or change, not the chain of tracebacks the failing write leaves behind; and the
crash handler must not answer a refused write with another write (a checkpoint) that the disk refuses the same way.
This module names such failures (:class:`DiskWriteError`), finds them in an exception's chain
(:func:`disk_error_in`), words them (:func:`write_failure`) and checks a root_dir before a run starts
(:func:`check_root_dir`). It imports nothing heavy: ``alfish.bin.train`` uses it before torch is loaded.
"""
from __future__ import annotations

import errno
import getpass
import os
import shutil
import tempfile
from typing import Optional

from alfish.rundir.safe_paths import UnsafePathError, open_in_root, require_kind_in_root

__all__ = ["DiskWriteError", "check_root_dir", "disk_error_in", "human_bytes", "mount_point", "write_failure"]

# Errnos that say the file system refuses writes for a while: another write (say a crash checkpoint) would fail
# the same way. EACCES/EPERM are left out: a *read* that is not permitted raises them too.
DISK_FULL_ERRNOS = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EROFS) if e is not None)

# Folders a run writes in an existing root_dir, and the files it appends to (checked at start-up when they exist).
RUN_DIRS = ("checkpoints", os.path.join("checkpoints", "best"), "tb", "config", "videos", "run_record", "profile")
RUN_FILES = ("log.txt", "eval_log.jsonl", "scalars.csv")
# Files a run replaces (written to a temporary name, renamed over): checked to be regular files, never opened.
REPLACED_FILES = (os.path.join("config", "operative.gin"), os.path.join("config", "full.gin"))
_PROBE_BYTES = 4096  # written by the start-up probe: a full disk refuses it (an empty file may still be created)


class DiskWriteError(Exception):
    """A file under the root_dir could not be written because of the file system (full disk, quota, read-only,
    permissions, not a directory); ``str()`` is one line naming the path, the reason and what to free or change."""


def disk_error_in(exc: Optional[BaseException],
                  errnos: Optional[frozenset[int]] = DISK_FULL_ERRNOS) -> Optional[OSError]:
    """The first OSError with an errno in ``errnos`` (any OSError when ``errnos`` is None) in ``exc``'s chain
    (``__cause__``/``__context__``), or None.

    Libraries wrap the OSError of a failed write (torch.save raises a RuntimeError from it, TensorBoard re-raises its
    writer thread's error), so the chain is searched rather than the exception's own type."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and (errnos is None or exc.errno in errnos):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _existing(path: str) -> str:
    """``path`` if it exists, else its nearest ancestor that does."""
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def mount_point(path: str) -> str:
    """The mount point of the file system ``path`` is (or would be created) on."""
    path = _existing(path)
    while not os.path.ismount(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def human_bytes(n: float) -> str:
    """``n`` bytes as '0 B', '512 KB', '3.2 GB' (powers of 1024)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 10 else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # not reached


def _free_space(path: str) -> str:
    try:
        return human_bytes(shutil.disk_usage(mount_point(path)).free) + " free"
    except OSError:
        return "free space unknown"


def _remedy(path: str, err: OSError) -> str:
    """What to do about ``err`` raised while writing ``path``."""
    mount = mount_point(path)
    if err.errno == errno.ENOSPC:
        return f"free space on {mount} ({_free_space(path)}) or use another --root_dir"
    if err.errno == getattr(errno, "EDQUOT", None):
        return f"free space within your disk quota on {mount} (or have it raised) or use another --root_dir"
    if err.errno == errno.EROFS:
        return f"{mount} is mounted read-only: use a --root_dir on a writable file system"
    if err.errno == errno.EFBIG:
        return ("a file reached the file size limit: raise it (`ulimit -f`) or use a --root_dir on a file system "
                "that allows larger files")
    if err.errno in (errno.EACCES, errno.EPERM):
        target = _existing(path)  # what refused: the file itself, or the folder a file or folder was to be made in
        where = f"in {target}" if os.path.isdir(target) else target
        return f"user {_user()} may not write {where}: make it writable (chmod u+w) or use another --root_dir"
    if err.errno == errno.EIO:
        return "the device reported an I/O error: check the disk (dmesg) and use another --root_dir"
    return "check the file system or use another --root_dir"


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        return str(os.getuid()) if hasattr(os, "getuid") else "this user"


def write_failure(what: str, path: str, err: OSError, file: str = "") -> str:
    """One line: ``cannot write <what> <path> (<file>): <reason> (<ERRNO>); <what to do>``; ``file`` names the file
    of ``path`` (a folder) that failed, when that helps. A path alfish refused to write through (an
    ``UnsafePathError``: a symlink, FIFO or hard link inside the root_dir) is its own one line: it names the path and
    what to do, and no disk advice applies."""
    if isinstance(err, UnsafePathError):
        return str(err)
    reason = err.strerror or str(err) or type(err).__name__
    code = errno.errorcode.get(err.errno, "") if err.errno else ""
    where = f"{what} {path}" if what else path
    if file:
        where += f" ({file})"
    return f"cannot write {where}: {reason}{f' ({code})' if code else ''}; {_remedy(path, err)}"


def _not_a_directory(root_dir: str) -> Optional[str]:
    """The message for a root_dir that is, or lies under, something other than a directory; None if it does not."""
    path = os.path.abspath(root_dir)
    if os.path.lexists(path) and not os.path.isdir(path):
        kind = "a file" if os.path.isfile(path) else "not a directory"
        return f"--root_dir {root_dir} is {kind}; give the path of a directory (it is created if missing)"
    parent = os.path.dirname(path)
    while parent != os.path.dirname(parent) and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if os.path.lexists(parent) and not os.path.isdir(parent):
        return (f"cannot create --root_dir {root_dir}: {parent} is a file, not a directory; give a --root_dir whose "
                "parents are directories")
    return None


def _probe(folder: str) -> None:
    """Write (and remove) a small file in ``folder``: OSError if the file system refuses."""
    fd, name = tempfile.mkstemp(prefix=".alfish-write-test-", dir=folder)
    try:
        os.write(fd, b"\0" * _PROBE_BYTES)
    finally:
        os.close(fd)
        os.unlink(name)


def _check_run_paths(root_dir: str) -> None:
    """Refuse a run folder or file of ``root_dir`` that is a symlink (or a FIFO, device, ...) before anything is
    built: alfish would otherwise write through it, outside the root_dir."""
    wanted = [(name, "dir") for name in RUN_DIRS] + [(name, "file") for name in RUN_FILES + REPLACED_FILES]
    for name, kind in wanted:
        try:
            require_kind_in_root(root_dir, name, kind)
        except UnsafePathError as e:
            raise DiskWriteError(str(e)) from e


def check_root_dir(root_dir: str) -> None:
    """Make sure a run can write in ``root_dir`` before anything is built: create it if missing, refuse run folders
    and files that are links or not regular (``_check_run_paths``), write a probe file in it and in the run folders
    it already has (checkpoints, tb, config, ...), and open its logs for appending.

    Raises:
        DiskWriteError: one line naming the path and what to change (a file where the directory should be, a
            read-only or unwritable directory, a full disk, a symlink or hard link where a run writes).
    """
    message = _not_a_directory(root_dir)
    if message:
        raise DiskWriteError(message)
    path = os.path.abspath(root_dir)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise DiskWriteError(write_failure("--root_dir", root_dir, e).replace("cannot write", "cannot create", 1)) \
            from e
    _check_run_paths(path)
    folders = [path] + [os.path.join(path, d) for d in RUN_DIRS if os.path.isdir(os.path.join(path, d))]
    for folder in folders:
        try:
            _probe(folder)
        except OSError as e:
            what = "in --root_dir" if folder == path else "in"
            raise DiskWriteError(write_failure(what, folder, e)) from e
    for name in RUN_FILES:
        file = os.path.join(path, name)
        if os.path.lexists(file):
            try:
                with open_in_root(path, name, "ab"):  # appending nothing changes nothing
                    pass
            except OSError as e:
                raise DiskWriteError(write_failure("", file, e)) from e
