"""TensorBoard summaries via ``torch.utils.tensorboard``, written under ``root_dir/tb``.

Host syncs (``.item()``) happen only here, and only on iterations where a summary is due.

TensorBoard writes events in a thread of its own. When the disk refuses a write there, the thread stores the error
(TensorBoard raises it again from the next ``add_scalar``/``flush`` in the training thread) and re-raises it, which
Python's default thread hook prints as a traceback. ``Summaries`` turns the error into one ``DiskWriteError`` line
in the training thread, keeps the writer thread's copy off stderr (``_quiet_writer_threads``: only OSErrors of
TensorBoard's writer threads, everything else goes to the previous hook), and closes the writer without raising.
``tb/`` must be a real folder inside the root_dir (``safe_paths.make_dirs_in_root``): a symlink there is refused.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Optional, Union

import torch
from tensorboard.summary.writer import event_file_writer
from torch.utils.tensorboard import SummaryWriter

from alfish.collect.episode_stats import EpisodeStats
from alfish.rundir.disk import DiskWriteError, write_failure
from alfish.rundir.safe_paths import make_dirs_in_root
from alfish.rundir.scalars_file import ScalarsFile
from alfish.rundir.trackers import Trackers

#: A histogram's values, or ``(values, bins)`` (``bins`` as ``np.histogram`` takes them; default TensorBoard's).
HistogramValues = Union[torch.Tensor, tuple[torch.Tensor, Any]]

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


@dataclasses.dataclass(frozen=True)
class GlobalStep:
    """ALF's global counter, for ``Summaries`` when it is not the iteration: ``read()`` gives it (e.g. the learner's
    update count); ``interval_counts_global_step``: the summary interval counts it too (else iterations)."""

    read: Callable[[], int]
    interval_counts_global_step: bool = True


class Summaries:
    """Decides when a summary is due and writes scalars and histograms.

    interval: iterations between summaries; first_interval: also summarize every iteration before the first
    ``interval`` (ALF's ``summarize_first_interval``).
    global_step: ALF's global counter when it is not the iteration (``TrainerConfig.update_counter_every_mini_batch``:
    the learner's update count): summaries are then written with it as their step (``step``), and with
    ``interval_counts_global_step`` the interval counts it too: a summary is due after each iteration in which it
    reached a multiple of ``interval`` (and, with ``first_interval``, after every iteration that advanced it before
    the first ``interval``). Summaries are still written between iterations.
    csv_path: also append every scalar to this CSV file (``Trainer.scalars_csv``; its format is
    ``alfish.rundir.scalars_file``'s): one row per scalar, flushed with the events; a resumed run appends to it.
    ``trackers`` (set by the builder with ``Trainer.trackers``): experiment trackers (``alfish.rundir.trackers``) that
    also get every scalar at the same step, one call per ``write``/``scalars``/``scalar``; closed with the summaries.
    """

    def __init__(self, root_dir: str, interval: int, first_interval: bool, flush_secs: float, max_queue: int,
                 global_step: Optional[GlobalStep] = None, csv_path: Optional[str] = None):
        self.interval = interval
        self.first_interval = first_interval
        self.global_step = global_step.read if global_step is not None else None
        self._by_global_step = global_step is not None and global_step.interval_counts_global_step
        self._checked_step = 0  # the global step at the last is_due
        self.log_dir = os.path.join(root_dir, "tb")
        _quiet_writer_threads()
        with self._disk_errors():
            # TensorBoard creates its event files by name in tb/: make sure tb/ is a real folder inside the root_dir
            # (a symlinked tb/ is refused here, in one line, rather than written through)
            make_dirs_in_root(root_dir, "tb")
            self.writer = SummaryWriter(log_dir=self.log_dir, flush_secs=flush_secs, max_queue=max_queue)
        self.csv_path = csv_path
        self._csv = ScalarsFile(csv_path, root_dir) if csv_path is not None else None
        self.trackers: Optional[Trackers] = None

    @contextlib.contextmanager
    def _disk_errors(self) -> Iterator[None]:
        """An OSError from the writer (its thread's, re-raised here) becomes one DiskWriteError line."""
        try:
            yield
        except OSError as e:
            raise DiskWriteError(write_failure("TensorBoard events in", self.log_dir, e)) from e

    def is_due(self, iteration: int) -> bool:
        """Whether to write a summary now, after the ``iteration``-th iteration (1 after the first). Called once per
        iteration: counting the global step, it remembers the step it saw."""
        if not self._by_global_step:
            return self._due_at(iteration)
        step, before = self.global_step(), self._checked_step
        self._checked_step = step
        crossed = step // self.interval > before // self.interval  # an update of this iteration was a multiple
        first = self.first_interval and step > before and before + 1 < self.interval  # one was before the first
        return crossed or first

    def _due_at(self, count: int) -> bool:
        return count % self.interval == 0 or (self.first_interval and count < self.interval)

    def due_for_update(self, iteration: int, update: int) -> bool:
        """Whether the ``update``-th optimizer step (1-based), made during the ``iteration``-th iteration, falls in a
        summarized iteration (a pure test: what the learner's summary-only measurements ask before each update)."""
        return self._due_at(update) if self._by_global_step else self._due_at(iteration)

    def step(self, iteration: int) -> int:
        """The step summaries are written with after the ``iteration``-th iteration: the iteration, or the global
        step."""
        return iteration if self.global_step is None else self.global_step()

    def histogram(self, tag: str, values: torch.Tensor, step: int, bins: Any = "tensorflow") -> None:
        """A TensorBoard histogram of ``values`` (any shape; read to the host here). Non-finite values (an fp16
        update's overflowed gradients) are left out; empty histograms are skipped."""
        values = values.detach().float().cpu().reshape(-1)
        values = values[torch.isfinite(values)]
        if values.numel() == 0:
            return
        with self._disk_errors():
            self.writer.add_histogram(tag, values, step, bins=bins)

    def histograms(self, values: Mapping[str, HistogramValues], step: int) -> None:
        """Histograms by their full tag (``vars/<name>``, ``action/dim0``, ...)."""
        for tag, value in values.items():
            tensor, bins = value if isinstance(value, tuple) else (value, "tensorflow")
            self.histogram(tag, tensor, step, bins)

    def scalar(self, tag: str, value: float | torch.Tensor, step: int) -> None:
        self.write({tag: value}, step)

    def scalars(self, prefix: str, values: Mapping[str, float | torch.Tensor], step: int) -> None:
        self.write({f"{prefix}/{name}": value for name, value in values.items()}, step)

    def write(self, scalars: Mapping[str, float | torch.Tensor], step: int) -> None:
        """Scalars by their full tag (``loss/total``, ``async/queue_length``, ...); NaNs are left out."""
        written = {}
        for tag, value in scalars.items():
            if isinstance(value, torch.Tensor):
                value = float(value.detach())
            if math.isnan(value):
                continue
            with self._disk_errors():
                self.writer.add_scalar(tag, value, step)
            if self._csv is not None:
                self._csv.write_row(step, tag, value)
            written[tag] = float(value)
        if written and self.trackers is not None:
            self.trackers.log_scalars(written, step)  # (a tracker's failure is its one warning, never raised)

    def flush(self) -> None:
        """Write the queued events now; DiskWriteError if the disk refused them (now or in the writer's thread)."""
        with self._disk_errors():
            self.writer.flush()
        if self._csv is not None:
            self._csv.flush()

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
        if self._csv is not None:
            self._csv.close()
            self._csv = None
        if self.trackers is not None:
            self.trackers.close()
            self.trackers = None


class NullSummaries:
    """What ranks other than 0 get: never due, writes nothing."""

    trackers: Optional[Trackers] = None  # (rank 0 alone tracks)

    def is_due(self, iteration: int) -> bool:
        return False

    def due_for_update(self, iteration: int, update: int) -> bool:
        return False

    def step(self, iteration: int) -> int:
        return iteration

    def histogram(self, tag: str, values: torch.Tensor, step: int, bins: Any = "tensorflow") -> None:
        pass

    def histograms(self, values: Mapping[str, HistogramValues], step: int) -> None:
        pass

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


def parameter_histograms(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``vars/<name>``: the values of every parameter, ``grads/<name>``: its gradient (the last update's, as it was
    stepped: after clipping), for ``Summaries.histograms``."""
    values = {}
    for name, p in module.named_parameters():
        values[f"vars/{name}"] = p.detach()
        if p.grad is not None:
            values[f"grads/{name}"] = p.grad.detach()
    return values


def action_distributions(actions: Optional[torch.Tensor], algorithm: torch.nn.Module
                         ) -> tuple[dict[str, torch.Tensor], dict[str, HistogramValues]]:
    """``(scalars, histograms)`` of ``actions [N, *action_shape]`` (``TrainingStep.taken_actions``). Box actions: per
    action dim ``i`` (the flattened action shape) the histogram ``action/dim<i>`` and the scalars ``action/dim<i>.mean``
    and ``action/dim<i>.std``. Discrete actions (``algorithm.discrete``): the histogram ``action/discrete`` with one
    bin per action and the scalars ``action/frequency.<k>``, the share of each action ``k``. Empty without actions."""
    if actions is None or actions.numel() == 0:
        return {}, {}
    if getattr(algorithm, "discrete", False):
        num_actions = int(algorithm.num_actions)
        index = actions.detach().reshape(-1).long()
        counts = torch.bincount(index.clamp(0, num_actions - 1), minlength=num_actions).float()
        shares = counts / counts.sum()
        scalars = {f"action/frequency.{k}": shares[k] for k in range(num_actions)}
        return scalars, {"action/discrete": (index, [k - 0.5 for k in range(num_actions + 1)])}
    flat = actions.detach().float().reshape(actions.shape[0], -1)  # [N, action_dim]
    scalars, histograms = {}, {}
    for i in range(flat.shape[1]):
        scalars[f"action/dim{i}.mean"] = flat[:, i].mean()
        scalars[f"action/dim{i}.std"] = flat[:, i].std(correction=0)
        histograms[f"action/dim{i}"] = flat[:, i]
    return scalars, histograms
