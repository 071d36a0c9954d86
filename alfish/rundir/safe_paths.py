"""Paths inside a results directory: never follow a symlink, open only regular files and directories.

The rule (DESIGN.md §3.13). The root_dir the user typed is trusted as typed, and may itself be a symlink: it is
opened once, following links. Every path *inside* it is walked one component at a time, each directory opened with
``O_NOFOLLOW | O_DIRECTORY`` relative to its parent's descriptor and the last component opened with ``O_NOFOLLOW``
relative to its directory's. A symlink planted anywhere below the root is therefore refused, not followed, with no
window between a check and the open. Opened files must be regular files (``fstat`` after the open, with
``O_NONBLOCK`` so that a FIFO cannot block the open); files opened for writing must also have one name only (a hard
link would let a write land in a file outside the root).

Deletion never crosses a link either: trees are removed with ``shutil.rmtree(dir_fd=...)`` (which does not follow
symlinks) from a parent reached by the same walk, and a checkpoint is removed file by file (``remove_listed``), only
the names its manifest lists.

Paths the user types (``--record_file``, ``--out``) are not this module's business: they are trusted as typed.

Every refusal is an :class:`UnsafePathError`, an ``OSError`` whose ``str()`` is one line naming the path and what to
do about it. Callers that treat an unreadable file as damage (a checkpoint: try the older one) catch ``OSError`` as
they already did.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from typing import IO, Any, Iterator, Optional

__all__ = ["UnsafePathError", "open_in_root", "read_bytes_in_root", "make_dirs_in_root", "kind_in_root",
           "require_kind_in_root", "list_dir_in_root", "remove_tree_in_root", "remove_listed", "rename_in_root",
           "fsync_dir_in_root", "unsafe_path_in"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC

# The file modes alfish uses, as os.open flags (O_TRUNC is applied after the file is checked to be regular).
_MODE_FLAGS = {
    "r": os.O_RDONLY,
    "w": os.O_WRONLY | os.O_CREAT,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
}
_LINK_ADVICE = "alfish never follows links inside a results directory: replace it with a real {kind} or use " \
               "another --root_dir"


class UnsafePathError(OSError):
    """A path inside a root_dir that alfish refuses to open, create or delete: a symlink, a FIFO, socket or device,
    a hard-linked file to be written, or a path that leaves the root. ``str()`` is one line saying what to do."""

    def __init__(self, path: str, message: str, code: int = errno.ELOOP) -> None:
        super().__init__(code, message, path)

    def __str__(self) -> str:
        return self.strerror


def describe(st: os.stat_result) -> str:
    """'a symlink', 'a FIFO', 'a socket', 'a device', 'a directory', 'a regular file' for ``st`` (an lstat)."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _refusal(path: str, st: Optional[os.stat_result], wanted: str) -> UnsafePathError:
    """The error for ``path`` (lstat ``st``) found where a ``wanted`` ('file' or 'directory') should be."""
    found = describe(st) if st is not None else "not accessible"
    if st is not None and stat.S_ISLNK(st.st_mode):
        return UnsafePathError(path, f"{path} is a symlink; {_LINK_ADVICE.format(kind=wanted)}")
    return UnsafePathError(path, f"{path} is {found}, not a {wanted}; alfish opens only regular files and "
                                 f"directories inside a results directory: remove it or use another --root_dir",
                           errno.EINVAL)


def _lstat_at(name: str, dir_fd: int) -> Optional[os.stat_result]:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None


def _parts(root: str, path: str) -> tuple[str, list[str]]:
    """``root`` made absolute and the components of ``path`` below it (``path`` absolute or relative to root)."""
    root_abs = os.path.abspath(root)
    full = os.path.abspath(os.path.join(root_abs, path))
    rel = os.path.relpath(full, root_abs)
    if rel == os.curdir:
        return root_abs, []
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        raise UnsafePathError(full, f"{full} is outside the results directory {root_abs}; alfish reads and writes "
                                    "only inside it", errno.EINVAL)
    return root_abs, rel.split(os.sep)


def _open_root(root_abs: str) -> int:
    """The root_dir itself, as typed: a symlink here is the user's own choice and is followed."""
    return os.open(root_abs, os.O_RDONLY | _DIRECTORY | _CLOEXEC)


def _descend(fd: int, name: str, shown: str, create: bool) -> int:
    """Open directory ``name`` in ``fd`` without following a link (creating it when ``create``); closes ``fd``."""
    try:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):  # made by another process meanwhile: open it as it is
                os.mkdir(name, 0o777, dir_fd=fd)
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                raise _refusal(shown, _lstat_at(name, fd), "directory") from None
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def _dir_fd(root: str, parts: list[str], create: bool) -> Iterator[int]:
    """A descriptor of the directory ``root/parts...`` reached without following links below ``root``."""
    root_abs = os.path.abspath(root)
    fd = _open_root(root_abs)
    shown = root_abs
    for name in parts:  # _descend closes the descriptor it is given, also when it raises
        shown = os.path.join(shown, name)
        fd = _descend(fd, name, shown, create)
    try:
        yield fd
    finally:
        os.close(fd)


def _file_flags(mode: str) -> tuple[int, bool]:
    """os.open flags for a ``mode`` like 'rb', 'w', 'a' or 'xb', and whether the file is truncated once checked."""
    kind = mode.replace("b", "").replace("t", "").replace("+", "")
    if kind not in _MODE_FLAGS or "+" in mode:
        raise ValueError(f"open_in_root does not support mode {mode!r}; use r, w, a or x (with b for bytes)")
    return _MODE_FLAGS[kind] | _NOFOLLOW | _NONBLOCK | _CLOEXEC, kind == "w"


def _checked_fd(fd: int, path: str, writing: bool) -> None:
    """Raise (closing ``fd``) unless ``fd`` is a regular file, with one name when it is to be written."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _refusal(path, st, "file")
    if writing and st.st_nlink > 1:
        os.close(fd)
        raise UnsafePathError(path, f"{path} is a hard link ({st.st_nlink} names), so writing it would change "
                                    "files outside the results directory too; replace it with a copy (cp) or use "
                                    "another --root_dir", errno.EMLINK)
    if _NONBLOCK:
        import fcntl  # POSIX only, like O_NONBLOCK itself
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)


def open_in_root(root: str, path: str, mode: str = "rb", *, create_dirs: bool = False, **kwargs: Any) -> IO:
    """Open the regular file ``path`` (absolute, or relative to ``root``) inside the results directory ``root``.

    Args:
        root: the root_dir as the user typed it (followed if it is a symlink).
        path: the file, inside ``root``.
        mode: 'r', 'w', 'a' or 'x', with 'b' for bytes; text modes default to UTF-8.
        create_dirs: create the missing directories on the way (never through a link).
        kwargs: passed to ``os.fdopen`` (``encoding``, ``newline``, ``buffering``).

    Raises:
        UnsafePathError: a link, FIFO, socket or device on the way or at the end; a hard-linked file to write.
        OSError: as ``open`` would (missing file, permissions, full disk).
    """
    root_abs, parts = _parts(root, path)
    if not parts:
        raise _refusal(root_abs, os.stat(root_abs), "file")
    shown = os.path.join(root_abs, *parts)
    flags, truncate = _file_flags(mode)
    with _dir_fd(root_abs, parts[:-1], create_dirs) as dir_fd:
        try:
            fd = os.open(parts[-1], flags, 0o666, dir_fd=dir_fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENXIO, errno.EMLINK):  # a link; a FIFO opened to write, no reader
                raise _refusal(shown, _lstat_at(parts[-1], dir_fd), "file") from None
            st = _lstat_at(parts[-1], dir_fd) if e.errno == errno.EEXIST else None
            if st is not None and not stat.S_ISREG(st.st_mode):  # mode 'x' met a link (or a FIFO): say so
                raise _refusal(shown, st, "file") from None
            raise
    _checked_fd(fd, shown, writing=flags & (os.O_WRONLY | os.O_RDWR) != 0)
    if truncate:
        os.ftruncate(fd, 0)
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    return os.fdopen(fd, mode.replace("x", "w"), **kwargs)


def read_bytes_in_root(root: str, path: str, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the regular file ``path`` inside ``root`` (callers compare the length with
    ``limit`` to tell a file that is too large)."""
    with open_in_root(root, path, "rb") as f:
        return f.read(limit + 1)


def make_dirs_in_root(root: str, path: str) -> str:
    """Create the directory ``path`` inside ``root`` and its missing parents, refusing links on the way (the root
    itself is created when missing, as typed); returns ``path`` made absolute.

    Also the check for folders a library writes into by name (TensorBoard's ``tb/``, ``videos/``): the library then
    only creates new files in a directory that is really inside the root."""
    root_abs, parts = _parts(root, path)
    os.makedirs(root_abs, exist_ok=True)
    with _dir_fd(root_abs, parts, create=True):
        pass
    return os.path.join(root_abs, *parts)


def kind_in_root(root: str, path: str) -> str:
    """What ``path`` inside ``root`` is, without following links: 'missing', 'file', 'dir', or a refusal's kind
    ('symlink', 'fifo', 'socket', 'device', 'other'). A link or non-directory on the way raises UnsafePathError."""
    root_abs, parts = _parts(root, path)
    if not parts:
        return "dir" if os.path.isdir(root_abs) else "missing"
    try:
        with _dir_fd(root_abs, parts[:-1], create=False) as dir_fd:
            st = _lstat_at(parts[-1], dir_fd)
    except FileNotFoundError:
        return "missing"
    if st is None:
        return "missing"
    mode = st.st_mode
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"), (stat.S_ISLNK, "symlink"),
                       (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "device"),
                       (stat.S_ISBLK, "device")):
        if test(mode):
            return name
    return "other"


def require_kind_in_root(root: str, path: str, wanted: str) -> str:
    """'missing' or ``wanted`` ('file' or 'dir'): what ``path`` inside ``root`` is, without following links.

    Raises:
        UnsafePathError: ``path`` is anything else (a symlink, a FIFO, a file where a directory should be), or a
            link or non-directory lies on the way (one line naming it and what to do).
    """
    kind = kind_in_root(root, path)
    if kind in ("missing", wanted):
        return kind
    root_abs, parts = _parts(root, path)
    if not parts:
        raise _refusal(root_abs, os.stat(root_abs), "file")
    with _dir_fd(root_abs, parts[:-1], create=False) as dir_fd:
        st = _lstat_at(parts[-1], dir_fd)
    raise _refusal(os.path.join(root_abs, *parts), st, "directory" if wanted == "dir" else "file")


def list_dir_in_root(root: str, path: str) -> list[str]:
    """The names in the directory ``path`` inside ``root`` (reached without following links); [] when missing."""
    root_abs, parts = _parts(root, path)
    try:
        with _dir_fd(root_abs, parts, create=False) as fd:
            return os.listdir(fd)
    except FileNotFoundError:
        return []


def remove_tree_in_root(root: str, path: str) -> None:
    """Delete the tree ``path`` inside ``root`` if it exists, never following a link (a link itself is removed,
    not what it points to); a link on the way to ``path`` raises UnsafePathError."""
    root_abs, parts = _parts(root, path)
    if not parts:
        raise UnsafePathError(root_abs, f"refusing to delete the results directory {root_abs} itself", errno.EINVAL)
    with _dir_fd(root_abs, parts[:-1], create=False) as dir_fd:
        st = _lstat_at(parts[-1], dir_fd)
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(parts[-1], dir_fd=dir_fd)
            return
        shutil.rmtree(parts[-1], dir_fd=dir_fd)


def remove_listed(root: str, path: str, names: list[str]) -> list[str]:
    """Delete the regular files ``names`` (plain names) from the directory ``path`` inside ``root``, then the
    directory if that left it empty; returns the names that were left (other files, links, folders: not alfish's
    to delete)."""
    root_abs, parts = _parts(root, path)
    with _dir_fd(root_abs, parts, create=False) as fd:
        for name in names:
            if os.sep in name or name in (os.curdir, os.pardir, ""):
                continue
            st = _lstat_at(name, fd)
            if st is not None and stat.S_ISREG(st.st_mode):
                os.unlink(name, dir_fd=fd)
        left = os.listdir(fd)
    if not left:
        with _dir_fd(root_abs, parts[:-1], create=False) as parent:
            os.rmdir(parts[-1], dir_fd=parent)
    return sorted(left)


def rename_in_root(root: str, src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``, both inside ``root``, neither's directory reached through a link (the entry
    renamed may be anything: a rename moves the link, not its target)."""
    root_abs, src_parts = _parts(root, src)
    _, dst_parts = _parts(root, dst)
    if not src_parts or not dst_parts:
        raise UnsafePathError(root_abs, f"refusing to rename the results directory {root_abs} itself", errno.EINVAL)
    with _dir_fd(root_abs, src_parts[:-1], create=False) as src_fd, \
            _dir_fd(root_abs, dst_parts[:-1], create=True) as dst_fd:
        os.rename(src_parts[-1], dst_parts[-1], src_dir_fd=src_fd, dst_dir_fd=dst_fd)


def fsync_dir_in_root(root: str, path: str) -> None:
    """Make the creations and renames inside the directory ``path`` (inside ``root``, reached without following
    links) durable; best effort: a file system that cannot sync directories is ignored."""
    root_abs, parts = _parts(root, path)
    with _dir_fd(root_abs, parts, create=False) as fd, contextlib.suppress(OSError):
        os.fsync(fd)


def unsafe_path_in(exc: Optional[BaseException]) -> Optional[UnsafePathError]:
    """The first UnsafePathError in ``exc``'s chain (``__cause__``/``__context__``, ``exc`` included), or None: a
    refusal that a library (or alfish's own error types) wrapped."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, UnsafePathError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
