"""The trackers of a run as one sink beside TensorBoard (``Summaries`` tees every scalar to it), where a failing
tracker costs one warning.

Whatever a tracker raises (its init fails, the network is down, a quota, a bug in its library) is logged once as a
warning naming the tracker and the error; that tracker is then disabled for the rest of the run, training goes on,
and TensorBoard stays the record. Calls come from the training thread and from the asynchronous evaluator's thread
(its results are written where they arrive): a lock keeps them one at a time.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from alfish.rundir.trackers.base import Tracker
from alfish.rundir.trackers.run_ids import RUN_IDS_FILE, read_run_ids, write_run_ids
from alfish.rundir.trackers.start_info import operative_params, run_record_info

_MAX_ERROR_CHARS = 300


class Trackers:
    """The ``trackers`` of the run in ``root_dir``; ``resume``: the training run resumed from a checkpoint, so each
    tracker continues the run stored in ``ROOT_DIR/trackers.json`` (a fresh run starts new tracker runs)."""

    def __init__(self, trackers: Sequence[Tracker], root_dir: str, resume: bool) -> None:
        self.root_dir, self.resume = root_dir, resume
        self.active: list[Tracker] = []  # started and not failed
        self._pending = list(trackers)
        self._lock = threading.Lock()

    def start(self, config_text: str, run_record: Optional[Path]) -> None:
        """Begin (or continue) each tracker's run, store the ids, then log the operative config (``config_text``:
        ``gin.operative_config_str()``) and the run record of this start (``run_record``: its folder, or None)."""
        stored = read_run_ids(self.root_dir) if self.resume else {}
        ids = dict(stored)  # (a resume keeps the ids of trackers that are off now, for a later resume with them on)
        with self._lock:
            for tracker in self._pending:
                self.active.append(tracker)
                self._guarded(tracker, lambda t: ids.update({t.name: t.start(stored.get(t.name))}))
            self._pending = []
        try:
            write_run_ids(self.root_dir, ids)
        except OSError as err:  # a resume then starts new tracker runs: not worth stopping training for
            logging.warning("could not write %s/%s (%s); a resumed run will start new tracker runs", self.root_dir,
                            RUN_IDS_FILE, err)
        params = operative_params()
        try:
            record = run_record_info(self.root_dir, run_record)
        except OSError as err:  # (its git.txt unreadable: the trackers go without the run record)
            logging.warning("the trackers get no run record: %s", err)
            record = None
        self._each(lambda t: t.log_config(config_text, params))
        if record is not None:
            self._each(lambda t: t.log_run_record(record))

    def log_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        """Scalars by TensorBoard tag at TensorBoard's ``step``."""
        self._each(lambda t: t.log_scalars(scalars, step))

    def log_video(self, path: str, step: int) -> None:
        """The evaluation video file ``path`` of the evaluation at ``step``."""
        self._each(lambda t: t.log_video(path, step))

    def close(self) -> None:
        """End every tracker run; never raises (a failure is the one warning)."""
        self._each(lambda t: t.close())
        with self._lock:
            self.active = []

    def _each(self, call: Callable[[Tracker], Any]) -> None:
        with self._lock:
            for tracker in list(self.active):
                self._guarded(tracker, call)

    def _guarded(self, tracker: Tracker, call: Callable[[Tracker], Any]) -> None:
        """``call(tracker)``; an exception disables the tracker with one warning (the lock is held)."""
        try:
            call(tracker)
        except Exception as err:  # noqa: BLE001  (whatever a tracker's library raises, training goes on)
            self.active.remove(tracker)
            message = " ".join(f"{type(err).__name__}: {err}".split())
            if len(message) > _MAX_ERROR_CHARS:
                message = message[:_MAX_ERROR_CHARS] + "..."
            logging.warning("tracker %s failed and is disabled for the rest of the run (TensorBoard stays the "
                            "record): %s", tracker.name, message)
            try:
                tracker.close()  # (what it holds, e.g. W&B's run; a second failure adds nothing to the first)
            except Exception:  # noqa: BLE001, S110
                pass
