"""TensorBoard summaries via ``torch.utils.tensorboard``, written under ``root_dir/tb``.

Host syncs (``.item()``) happen only here, and only on iterations where a summary is due.

TensorBoard writes events in a thread of its own. When the disk refuses a write there, the thread stores the error
(TensorBoard raises it again from the next ``add_scalar``/``flush`` in the training thread) and re-raises it, which
Python's default thread hook prints as a traceback. ``Summaries`` turns the error into one ``DiskWriteError`` line
in the training thread, keeps the writer thread's copy off stderr (``_quiet_writer_threads``: only OSErrors of
TensorBoard's writer threads, everything else goes to the previous hook), and closes the writer without raising.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from typing import Iterator, Mapping

import torch
from tensorboard.summary.writer import event_file_writer
from torch.utils.tensorboard import SummaryWriter

from alfish.collect.episode_stats import EpisodeStats
from alfish.trainer.disk import DiskWriteError, write_failure

# TensorBoard's event writer thread (a private class; if a TensorBoard release renames it, its errors are printed
# again, nothing else changes).
_WRITER_THREAD = getattr(event_file_writer, "_AsyncWriterThread", None)
_hook_lock = threading.Lock()
_hook_installed = False


def _quiet_writer_threads() -> None:
    """Install (once) a ``threading.excepthook`` that drops OSErrors raised in TensorBoard's writer threads: the
    training thread reports them (TensorBoard hands the same error to the next write or flush there)."""
    global _hook_installed
    with _hook_lock:
        if _hook_installed or _WRITER_THREAD is None:
            return
        previous = threading.excepthook

        def hook(args: threading.ExceptHookArgs) -> None:
            if isinstance(args.thread, _WRITER_THREAD) and isinstance(args.exc_value, OSError):
                return
            previous(args)

        threading.excepthook = hook
        _hook_installed = True


class Summaries:
    """Decides when a summary is due and writes scalars.

    interval: iterations between summaries; first_interval: also summarize every iteration before the first
    ``interval`` (ALF's ``summarize_first_interval``).
    """

    def __init__(self, root_dir: str, interval: int, first_interval: bool, flush_secs: float, max_queue: int):
        self.interval = interval
        self.first_interval = first_interval
        self.log_dir = os.path.join(root_dir, "tb")
        _quiet_writer_threads()
        with self._disk_errors():
            self.writer = SummaryWriter(log_dir=self.log_dir, flush_secs=flush_secs, max_queue=max_queue)

    @contextlib.contextmanager
    def _disk_errors(self) -> Iterator[None]:
        """An OSError from the writer (its thread's, re-raised here) becomes one DiskWriteError line."""
        try:
            yield
        except OSError as e:
            raise DiskWriteError(write_failure("TensorBoard events in", self.log_dir, e)) from e

    def is_due(self, iteration: int) -> bool:
        """``iteration`` counts completed iterations (1 after the first)."""
        return iteration % self.interval == 0 or (self.first_interval and iteration < self.interval)

    def scalar(self, tag: str, value: float | torch.Tensor, step: int) -> None:
        if isinstance(value, torch.Tensor):
            value = float(value.detach())
        if not math.isnan(value):
            with self._disk_errors():
                self.writer.add_scalar(tag, value, step)

    def scalars(self, prefix: str, values: Mapping[str, float | torch.Tensor], step: int) -> None:
        for name, value in values.items():
            self.scalar(f"{prefix}/{name}", value, step)

    def write(self, scalars: Mapping[str, float | torch.Tensor], step: int) -> None:
        """Scalars by their full tag (``loss/total``, ``async/queue_length``, ...)."""
        for tag, value in scalars.items():
            self.scalar(tag, value, step)

    def flush(self) -> None:
        """Write the queued events now; DiskWriteError if the disk refused them (now or in the writer's thread)."""
        with self._disk_errors():
            self.writer.flush()

    def close(self) -> None:
        """Flush and close, never raising: it runs on the way out of a run, also after a disk error, where a second
        report of the same failure would only hide the first (call ``flush`` first to hear of a failure)."""
        for writer in list((self.writer.all_writers or {}).values()):
            # FileWriter.close flushes, stops the writer thread, then closes the file: after a failed flush, stopping
            # the thread still matters (it must not outlive the run), hence the second attempt.
            with contextlib.suppress(OSError):
                writer.flush()
            with contextlib.suppress(OSError):
                writer.close()
        self.writer.file_writer = self.writer.all_writers = None


class NullSummaries:
    """What ranks other than 0 get: never due, writes nothing."""

    def is_due(self, iteration: int) -> bool:
        return False

    def scalar(self, tag: str, value: float | torch.Tensor, step: int) -> None:
        pass

    def scalars(self, prefix: str, values: Mapping[str, float | torch.Tensor], step: int) -> None:
        pass

    def write(self, scalars: Mapping[str, float | torch.Tensor], step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class Throughput:
    """Env steps and iterations per second between two summaries."""

    def __init__(self) -> None:
        self._last: tuple[float, int, int] | None = None  # (time, env steps, iteration)

    def rates(self, env_steps: int, iteration: int) -> dict[str, float]:
        now = time.monotonic()
        rates = {}
        if self._last is not None and now > self._last[0]:
            seconds = now - self._last[0]
            rates = {"time/env_steps_per_s": (env_steps - self._last[1]) / seconds,
                     "time/iterations_per_s": (iteration - self._last[2]) / seconds}
        self._last = (now, env_steps, iteration)
        return rates


def episode_scalars(stats: EpisodeStats, min_episodes: int) -> dict[str, float]:
    """Average training return and length once ``min_episodes`` episodes (at most the window) have ended."""
    if len(stats.returns) < min(min_episodes, stats.returns.maxlen):
        return {}
    return {"train/episode_return": stats.average_return(), "train/episode_length": stats.average_length()}


def parameter_norms(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``vars/<name>.norm`` of every parameter and ``grads/<name>.norm`` of every gradient."""
    norms = {}
    for name, p in module.named_parameters():
        norms[f"vars/{name}.norm"] = p.detach().norm()
        if p.grad is not None:
            norms[f"grads/{name}.norm"] = p.grad.norm()
    return norms
