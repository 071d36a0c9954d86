"""``TrainerConfig.profiling``: ``torch.profiler`` over a window of iterations, written into the root_dir.

The window skips the first ``Profiler.skip_iterations`` iterations (start-up, allocator warm-up, first compilations)
and records the next ``Profiler.active_iterations``; then it writes

    ROOT_DIR/profile/trace-<first>-<last>.json   Chrome trace: open it in https://ui.perfetto.dev (or chrome://tracing)
    ROOT_DIR/profile/top_ops-<first>-<last>.txt  the ops with the most self CPU time (and CUDA time on a GPU)

A run that ends inside the window writes what it recorded. Only rank 0 profiles (the ranks run the same code).
Both files are written through ``alfish.rundir.atomic_text`` (never through a link inside the root_dir): torch
exports the trace to a private temporary folder first, since it writes only by file name.
"""
from __future__ import annotations

import logging
import os
import tempfile
from typing import Optional

import gin
import torch

from alfish.rundir.atomic_text import write_bytes_atomic, write_text_atomic


class NullProfiler:
    """Profiling off: every call does nothing."""

    def step(self, iteration: int) -> None:
        """Called after each iteration (``iteration``: iterations completed)."""

    def close(self) -> None:
        """Called once when the run ends."""


@gin.configurable("Profiler")
class IterationProfiler(NullProfiler):
    """Profiles iterations ``skip_iterations + 1 .. skip_iterations + active_iterations`` of this process's run (counted
    from its start, so a resumed run skips its own warm-up too).

    Args:
        root_dir: the run's results directory (files go to ``root_dir/profile``).
        skip_iterations: iterations run before recording starts.
        active_iterations: iterations recorded.
        row_limit: rows of the top-ops table.
    """

    def __init__(self, root_dir: str, skip_iterations: int = 10, active_iterations: int = 20, row_limit: int = 40):
        if skip_iterations < 0 or active_iterations < 1:
            raise ValueError(f"Profiler.skip_iterations={skip_iterations} must be >= 0 and "
                             f"Profiler.active_iterations={active_iterations} >= 1")
        self.root_dir = root_dir
        self.folder = os.path.join(os.path.abspath(root_dir), "profile")  # (safe_paths: absolute, or root-relative)
        self.skip, self.active, self.row_limit = skip_iterations, active_iterations, row_limit
        self._seen = 0  # iterations of this process's run
        self._first: Optional[int] = None  # the first recorded iteration (the run's count)
        self._last = 0
        self._profile: Optional[torch.profiler.profile] = None
        self.done = False
        self.paths: list[str] = []
        if self.skip == 0:
            self._start(None)

    def step(self, iteration: int) -> None:
        if self.done:
            return
        self._seen += 1
        if self._profile is None:
            if self._seen == self.skip:
                self._start(iteration)
            return
        if self._first is None:
            self._first = iteration
        self._last = iteration
        if self._seen >= self.skip + self.active:
            self._write()

    def close(self) -> None:
        if self._profile is not None and not self.done:
            self._write()

    def _start(self, iteration: Optional[int]) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profile = torch.profiler.profile(activities=activities)
        self._profile.start()

    def _write(self) -> None:
        self._profile.stop()
        self.done = True
        if self._first is None:
            logging.info("profiling: the run ended before any iteration was recorded; nothing written")
            return
        span = f"{self._first}-{self._last}"
        trace = os.path.join(self.folder, f"trace-{span}.json")
        table = os.path.join(self.folder, f"top_ops-{span}.txt")
        with tempfile.TemporaryDirectory(prefix="alfish-profile-") as private:
            exported = os.path.join(private, "trace.json")
            self._profile.export_chrome_trace(exported)
            with open(exported, "rb") as f:
                write_bytes_atomic(self.root_dir, trace, f.read())
        sort_by = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        write_text_atomic(self.root_dir, table,
                          f"# iterations {span} ({self._last - self._first + 1}); sorted by {sort_by}\n"
                          f"{self._profile.key_averages().table(sort_by=sort_by, row_limit=self.row_limit)}\n")
        self.paths = [trace, table]
        logging.info("profiling: iterations %s written to %s and %s (open the trace in https://ui.perfetto.dev)",
                     span, trace, table)
