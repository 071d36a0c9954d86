"""Measuring one command against a planted results directory: its exit status, stderr, wall time and peak RSS
(the high-water mark of each of its processes, polled), and whether a directory outside the results
directory changed (a hash of its tree, links not followed) or was opened at all (inotify on each of its folders: a read
through a planted symlink leaves no trace in the hash).
"""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import pathlib
import signal
import struct
import subprocess
import time
from typing import Optional

import psutil

# inotify(7): the events that mean the tree was touched (opened, read, written, created, deleted, renamed)
_IN_ACCESS, _IN_MODIFY, _IN_ATTRIB, _IN_OPEN = 0x1, 0x2, 0x4, 0x20
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_CLOSE_WRITE = 0x400, 0x800, 0x8
_WATCHED = (_IN_ACCESS | _IN_MODIFY | _IN_ATTRIB | _IN_OPEN | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
            | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_CLOSE_WRITE)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


def tree_digest(root: pathlib.Path) -> dict[str, str]:
    """``{relative path: what it is}`` for every entry under ``root`` (links not followed): a file's sha256 and mode,
    a link's target, a folder's mode, anything else's type."""
    digest = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                digest[rel] = f"link -> {os.readlink(path)}"
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    digest[rel] = f"file {oct(st.st_mode)} {hashlib.file_digest(f, 'sha256').hexdigest()}"
            else:
                digest[rel] = f"{'dir' if os.path.isdir(path) else 'special'} {oct(st.st_mode)}"
    return digest


def digest_changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What differs, as ``added X``, ``removed X``, ``changed X`` (sorted)."""
    return sorted([f"added {p}" for p in after.keys() - before.keys()]
                  + [f"removed {p}" for p in before.keys() - after.keys()]
                  + [f"changed {p}" for p in before.keys() & after.keys() if before[p] != after[p]])


class OpenWatch:
    """inotify watches on ``root`` and every folder below it; ``touched()`` names what was opened or changed since
    ``start()``. Unavailable (``available`` False) where inotify is: the hash still tells writes."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        self.available = self._fd >= 0
        self._names: dict[int, str] = {}

    def start(self) -> None:
        if not self.available:
            return
        for folder, _, _ in os.walk(self.root):
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(folder), _WATCHED)
            if wd >= 0:
                self._names[wd] = os.path.relpath(folder, self.root)
        self._drain()  # (nothing should be there yet; a clean start either way)

    def touched(self) -> list[str]:
        """Each path something happened to, with the worst that did (``written`` over ``read`` over ``opened``)."""
        masks: dict[str, int] = {}
        for wd, mask, name in self._drain():
            path = os.path.normpath(os.path.join(self._names.get(wd, "?"), name))
            masks[path] = masks.get(path, 0) | mask
        return [f"{_what(mask)} {path}" for path, mask in sorted(masks.items())]

    def close(self) -> None:
        if self.available:
            os.close(self._fd)
            self.available = False

    def _drain(self) -> list[tuple[int, int, str]]:
        events = []
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return events
            offset = 0
            while offset < len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size:offset + _EVENT.size + length].rstrip(b"\0").decode(errors="replace")
                events.append((wd, mask, name))
                offset += _EVENT.size + length


def _what(mask: int) -> str:
    for bit, word in ((_IN_MODIFY | _IN_CLOSE_WRITE, "written"), (_IN_CREATE | _IN_MOVED_TO, "created"),
                      (_IN_DELETE | _IN_DELETE_SELF | _IN_MOVED_FROM | _IN_MOVE_SELF, "removed"),
                      (_IN_ATTRIB, "chmod"), (_IN_ACCESS, "read"), (_IN_OPEN, "opened")):
        if mask & bit:
            return word
    return hex(mask)


@dataclasses.dataclass
class Finished:
    """A command run to its end (or killed at its timeout)."""
    returncode: Optional[int]  # None: killed at the timeout (a hang)
    stdout: str
    stderr: str
    wall_s: float
    max_rss_mb: float  # the peak resident set of its largest process (VmHWM; see run_measured)


def run_measured(argv: list[str], cwd: pathlib.Path, env: dict, timeout_s: float, logs: pathlib.Path,
                 kill_rss_mb: float) -> Finished:
    """``argv`` in its own session, stdout and stderr to files under ``logs`` (a command that writes gigabytes cannot
    fill a pipe or this process's memory); its group is SIGKILLed at ``timeout_s``, or as soon as its process tree
    holds more than ``kill_rss_mb`` (a memory bomb must not take the machine down with it: the bound is then
    exceeded, which is what is measured).

    Peak RSS: every 50 ms, each process of the tree's high-water mark (``VmHWM``: its own, from its exec on); the
    largest seen. Not ``wait4``'s ``ru_maxrss``: Linux carries the parent's high-water mark into a child across
    fork and exec, so that figure would be at least this battery's own RSS (hundreds of MB once it built the bombs).
    """
    logs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(logs / "stdout", "wb") as out, open(logs / "stderr", "wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    status, peak = None, 0
    while status is None:
        pid, wait_status, _ = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            status = wait_status
            break
        rss, high_water = _tree_memory(proc.pid)
        peak = max(peak, high_water)
        if time.monotonic() - start > timeout_s or rss > kill_rss_mb * 2**20:
            os.killpg(proc.pid, signal.SIGKILL)
            _, wait_status, _ = os.wait4(proc.pid, 0)
            if time.monotonic() - start <= timeout_s:  # killed for its memory: an exit status, not a hang
                status = wait_status
            break
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status) if status is not None else -signal.SIGKILL  # (reaped here)
    wall = time.monotonic() - start
    try:  # children left in the session (a worker that outlived its parent) go too
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return Finished(None if status is None else proc.returncode, _tail(logs / "stdout"), _tail(logs / "stderr"),
                    wall, peak / 2**20)


def _tree_memory(pid: int) -> tuple[int, int]:
    """(summed RSS, largest VmHWM) in bytes over ``pid`` and its descendants (0 for those that already exited)."""
    try:
        pids = [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return 0, 0
    total = high = 0
    for each in pids:
        try:
            with open(f"/proc/{each}/status") as f:
                fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
        except OSError:
            continue
        total += int(fields.get("VmRSS", "0 kB").split()[0]) << 10
        high = max(high, int(fields.get("VmHWM", "0 kB").split()[0]) << 10)
    return total, high


def _tail(path: pathlib.Path, limit: int = 1 << 20) -> str:
    """The last ``limit`` bytes of a log (a command may have written far more)."""
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
        return f.read().decode(errors="replace")
