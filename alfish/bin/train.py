"""Train an experiment described by a gin conf.

    python -m alfish.bin.train --conf confs/sac_pendulum.gin --root_dir runs/sac [--conf_param 'Name.param=value' ...]

Re-running with the same --root_dir resumes from its newest checkpoint that verifies (newer ones that do not are moved
to ROOT_DIR/checkpoints.damaged-<time>/); when checkpoints exist and none verifies, it refuses to start. --fresh
starts over, moving the previous checkpoints, TensorBoard events and eval log to ROOT_DIR/before-fresh-<time>/.
Nothing is deleted either way.

Exit status: 0 when training finished; 2 for a problem found before training starts (the conf, a root_dir that is
not a writable directory, checkpoints that do not verify), reported in one line; 1 for a failure during training (a
write the disk refused, a NaN loss, a dead or hung child, env worker or rank, an env breaking its contract: reported
by their message alone; anything else, i.e. a bug, with its traceback); 128+N when stopped by signal N. An in-process
env step that hangs past create_environment.step_timeout_s ends the process with 1, an iteration that outlives
Trainer.stop_grace_s after the signal (or a second signal) with 128+N, each in one line, without a checkpoint of the
unfinished iteration (alfish/console/hard_exit.py).
Under torchrun, a rank that fails writes its one-line error to torchrun's error file, so the job's failure summary
("Root Cause") names it; a traceback goes to the rank's stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
import time
from typing import Optional, Sequence

from alfish.config import ConfError, TrainerConfig, load_conf
from alfish.console.printable import printable
from alfish.rundir.config_files import write_config_record


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m alfish.bin.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", required=True, help="gin conf file")
    parser.add_argument("--conf_param", action="append", default=[],
                        help="extra gin binding, e.g. 'TrainerConfig.num_iterations=100' (repeatable)")
    parser.add_argument("--root_dir", required=True, help="results directory (checkpoints, TensorBoard, config)")
    parser.add_argument("--fresh", action="store_true",
                        help="start over from iteration 0 even if ROOT_DIR has checkpoints (intact or damaged): they "
                             "are moved, with the TensorBoard events and eval log, to ROOT_DIR/before-fresh-<time>/, "
                             "never deleted")
    return parser.parse_args(argv)


def process_rank() -> int:
    """This process's rank in a torchrun job (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0"))


class LogFileHandler(logging.FileHandler):
    """``root_dir/log.txt``. When the disk refuses a write (full, over quota), file logging stops with one warning on
    stderr instead of logging's "--- Logging error ---" traceback for every later record; stderr logging goes on.

    The file is opened for appending through ``alfish.rundir.safe_paths`` relative to ``root_dir`` (the directory
    of ``path`` when None): a symlinked, FIFO or hard-linked log.txt is refused (UnsafePathError), not written."""

    def __init__(self, path: str, root_dir: Optional[str] = None) -> None:
        self.root_dir = root_dir if root_dir is not None else os.path.dirname(os.path.abspath(path))
        super().__init__(path, encoding="utf-8")
        self.failed = False

    def _open(self):  # logging's name: FileHandler opens its stream here
        from alfish.rundir.safe_paths import open_in_root

        return open_in_root(self.root_dir, self.baseFilename, "a", encoding=self.encoding, errors=self.errors)

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802  (logging's name)
        from alfish.rundir.disk import write_failure

        err = sys.exc_info()[1]
        if not isinstance(err, OSError):
            super().handleError(record)
            return
        self.failed = True
        with contextlib.suppress(OSError):
            self.close()  # its flush may fail again
        note = logging.makeLogRecord({"levelno": logging.WARNING, "levelname": "WARNING",
                                      "msg": f"{write_failure('log file', self.baseFilename, err)}; logging to "
                                             "stderr only"})
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(self.format(note) + "\n")


def setup_logging(root_dir: str) -> None:
    """Log to stderr; rank 0 also to root_dir/log.txt (other ranks of a torchrun job prefix their lines).

    Raises:
        DiskWriteError: root_dir cannot be created or log.txt cannot be opened (one line saying what to change).
    """
    from alfish.rundir.disk import DiskWriteError, write_failure

    rank = process_rank()
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    try:
        os.makedirs(root_dir, exist_ok=True)
        if rank == 0:
            handlers.append(LogFileHandler(os.path.join(root_dir, "log.txt"), root_dir))
    except OSError as e:
        raise DiskWriteError(write_failure("", e.filename or root_dir, e)) from e
    prefix = f"[rank {rank}] " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
    fmt = logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in handlers:
        handler.setFormatter(fmt)
        root.addHandler(handler)


def disk_failure(err: BaseException, root_dir: str) -> Optional[str]:
    """The one-line report of ``err`` if it is the disk refusing a write under ``root_dir`` (alfish's own
    ``DiskWriteError``, or a full disk, quota or read-only file system anywhere in its chain), else None. It ends by
    saying which checkpoint is intact. A path alfish refused to open (``UnsafePathError``: a symlink, FIFO or hard
    link inside the root_dir) is reported as its own one line."""
    from alfish.rundir.checkpoint import Checkpointer, CheckpointWriteError
    from alfish.rundir.disk import DiskWriteError, disk_error_in, write_failure
    from alfish.rundir.safe_paths import unsafe_path_in

    refused = unsafe_path_in(err)
    if refused is not None:
        return str(refused)
    if isinstance(err, CheckpointWriteError):
        return str(err)  # names the last checkpoint already
    if isinstance(err, DiskWriteError):
        message = str(err)
    else:
        os_err = disk_error_in(err)
        if os_err is None:
            return None
        message = (write_failure("", os_err.filename, os_err) if os_err.filename
                   else write_failure("under", root_dir, os_err))
    return f"{message}; {Checkpointer(os.path.join(root_dir, 'checkpoints'), root_dir=root_dir).last_checkpoint_note()}"


def one_line(err: BaseException) -> str:
    """``err``'s message on one line (gin appends "In call to configurable ..." lines to errors it re-raises), what is
    not printable escaped (it may quote content of the results directory)."""
    return printable(" ".join(str(err).split())) or type(err).__name__


def record_error_for_torchrun(message: str, consequence: bool = False) -> None:
    """Write ``message`` to ``$TORCHELASTIC_ERROR_FILE`` (set by torchrun for each rank) in the layout torch's
    ``ErrorHandler`` writes and ``ProcessFailure`` reads, with the message as the call stack too: torchrun's failure
    summary prints the call stack under "Root Cause", and one line saying what is wrong and how to fix it reads better
    there than a traceback (which the rank still prints to its stderr). Does nothing outside torchrun.

    torchrun names as root cause the failure with the smallest timestamp, in whole seconds, and breaks a tie by the
    order it noticed the ranks exit. A failure that is only the ``consequence`` of another rank's (a collective whose
    peer went away: ``failed_because_a_peer_did``) happens after that rank wrote its own error, so its time is rounded
    up and a cause's down: the cause then sorts first even within the same second, whichever rank exits first."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    now = time.time()
    timestamp = math.ceil(now) if consequence else math.floor(now)
    data = {"message": {"message": message, "extraInfo": {"py_callstack": message, "timestamp": str(timestamp)}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError as err:  # the summary then lacks the message; the rank's stderr still has it
        logging.warning("could not write torchrun's error file %s: %s", path, err)


def known_run_failures() -> tuple[type[BaseException], ...]:
    """The errors alfish raises after diagnosing a failure during training; reported as their message alone (an env
    worker's message carries the worker's own traceback)."""
    from alfish.collect.child_process import ChildProcessFailed
    from alfish.envs.contract import EnvContractError
    from alfish.envs.workers import EnvWorkerError
    from alfish.errors import NonFiniteLossError
    from alfish.learn.distributed import RankStoppedError

    return NonFiniteLossError, ChildProcessFailed, EnvWorkerError, EnvContractError, RankStoppedError


def _peer_failed(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because another rank went away (its consequence, not a cause)."""
    from alfish.learn.distributed import failed_because_a_peer_did  # (torch: imported by then)

    return failed_because_a_peer_did(error)


class TrainError(Exception):
    """A problem ``run_training`` diagnosed: ``str()`` is one line saying what is wrong and what to change.

    exit_code: the command's exit status for it (2: found before training started; 1: during training).
    reported: already logged (stderr and ROOT_DIR/log.txt); when False (logging was not set up yet) the command
        prints ``detail``, the error's own text, on stderr.
    """

    def __init__(self, message: str, exit_code: int, reported: bool, detail: Optional[str] = None) -> None:
        super().__init__(message)
        self.exit_code, self.reported = exit_code, reported
        self.detail = message if detail is None else detail


@dataclasses.dataclass(frozen=True)
class Finished:
    """How a run that raised nothing ended: ``exit_code`` 0 (trained to the end) or 128+N (stopped by signal N), and
    where its counters stood."""

    exit_code: int
    iterations: int
    env_steps: int


def _reported(message: str, exit_code: int, error: BaseException) -> TrainError:
    """``message`` (about ``error``) logged and recorded for torchrun, as a ``TrainError`` to raise."""
    logging.error("%s", message)
    record_error_for_torchrun(message, consequence=_peer_failed(error))
    return TrainError(message, exit_code, reported=True)


def run_training(conf: str, root_dir: str, conf_params: Sequence[str] = (), fresh: bool = False) -> Finished:
    """What ``python -m alfish.bin.train`` does once its flags are parsed (``alfish.train`` calls it too): load the
    conf and its ``conf_params`` bindings, check the root_dir, log to stderr and ROOT_DIR/log.txt, build the trainer
    (resuming from ROOT_DIR's checkpoints unless ``fresh``), write the config record, train.

    Raises:
        TrainError: a problem found before or during training (module docstring), one line; also written to
            torchrun's error file under torchrun.
        Exception: anything else (a bug), as raised, after its line was written to torchrun's error file.
    """
    try:
        load_conf(conf, conf_params)
        config = TrainerConfig(root_dir=root_dir, conf_file=conf)
    except (ConfError, ValueError, TypeError) as err:
        record_error_for_torchrun(f"error: {one_line(err)}")
        raise TrainError(one_line(err), 2, reported=False, detail=str(err)) from err
    from alfish.rundir.disk import DiskWriteError, check_root_dir  # light: no torch

    try:
        check_root_dir(root_dir)  # before anything is built: a file, a read-only folder, a full disk
        setup_logging(root_dir)
    except DiskWriteError as err:
        record_error_for_torchrun(f"error: {err}")
        raise TrainError(one_line(err), 2, reported=False, detail=str(err)) from err
    # after the conf is known good: imports torch-heavy modules
    from alfish.rundir.checkpoint import CheckpointError
    from alfish.trainer.build import build_trainer

    try:
        trainer = build_trainer(config, fresh=fresh)
    except Exception as err:
        message = disk_failure(err, root_dir)
        if message is None and isinstance(err, CheckpointError):
            message = one_line(err)  # e.g. no checkpoint verifies: says what to do
        elif message is None and isinstance(err, (ValueError, TypeError, RuntimeError)):
            # e.g. a bad algorithm hyperparameter or an unknown env id; gin appends "In call to configurable ..."
            message = f"could not build the experiment: {one_line(err)}"
        elif message is None:
            raise
        raise _reported(message, 2, err) from err
    if process_rank() == 0:
        try:
            write_config_record(root_dir)  # logs a warning for each binding that was set but never used
        except OSError as err:
            trainer.close()
            raise _reported(disk_failure(err, root_dir) or f"cannot write the config record: {one_line(err)}",
                            2, err) from err
    try:
        exit_code = trainer.run()
    except Exception as err:
        message = disk_failure(err, root_dir)
        if message is None and isinstance(err, known_run_failures()):
            # a failure alfish diagnosed (NaN loss, dead or hung child, worker or rank, broken env contract): its
            # message says what happened and what to do, a traceback of the trainer would only bury it
            logging.error("training stopped: %s: %s", type(err).__name__, err)
            record_error_for_torchrun(f"{type(err).__name__}: {one_line(err)}", consequence=_peer_failed(err))
            raise TrainError(f"training stopped: {type(err).__name__}: {one_line(err)}", 1, reported=True) from err
        if message is None:
            record_error_for_torchrun(f"{type(err).__name__}: {one_line(err)}", consequence=_peer_failed(err))
            raise  # the traceback goes to stderr
        raise _reported(message, 1, err) from err  # the disk refused a write: one line, no traceback
    return Finished(exit_code, trainer.counters.iteration, trainer.counters.env_steps)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        return run_training(args.conf, args.root_dir, args.conf_param, args.fresh).exit_code
    except TrainError as err:
        if not err.reported:
            print(f"error: {err.detail}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C before the trainer's signal handlers are in place (imports, building)
        print("alfish: interrupted before training started; no checkpoint was written", file=sys.stderr)
        sys.exit(130)
