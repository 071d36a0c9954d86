"""Train an experiment described by a gin conf.

    python -m alfish.bin.train --conf confs/sac_pendulum.gin --root_dir runs/sac [--conf_param 'Name.param=value' ...]

Re-running with the same --root_dir resumes from its newest valid checkpoint. Under torchrun, a rank that fails writes
its one-line error to torchrun's error file, so the job's failure summary ("Root Cause") names it; the full traceback
goes to the rank's stderr.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Optional, Sequence

from alfish.config import ConfError, TrainerConfig, load_conf, write_config_record


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m alfish.bin.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", required=True, help="gin conf file")
    parser.add_argument("--conf_param", action="append", default=[],
                        help="extra gin binding, e.g. 'TrainerConfig.num_iterations=100' (repeatable)")
    parser.add_argument("--root_dir", required=True, help="results directory (checkpoints, TensorBoard, config)")
    return parser.parse_args(argv)


def process_rank() -> int:
    """This process's rank in a torchrun job (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0"))


def setup_logging(root_dir: str) -> None:
    """Log to stderr; rank 0 also to root_dir/log.txt (other ranks of a torchrun job prefix their lines)."""
    os.makedirs(root_dir, exist_ok=True)
    rank = process_rank()
    prefix = f"[rank {rank}] " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
    fmt = logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    handlers = [logging.StreamHandler(sys.stderr)]
    if rank == 0:
        handlers.append(logging.FileHandler(os.path.join(root_dir, "log.txt")))
    for handler in handlers:
        handler.setFormatter(fmt)
        root.addHandler(handler)


def one_line(err: BaseException) -> str:
    """``err``'s message on one line (gin appends "In call to configurable ..." lines to errors it re-raises)."""
    return " ".join(str(err).split()) or type(err).__name__


def record_error_for_torchrun(message: str) -> None:
    """Write ``message`` to ``$TORCHELASTIC_ERROR_FILE`` (set by torchrun for each rank) in the layout torch's
    ``ErrorHandler`` writes and ``ProcessFailure`` reads, with the message as the call stack too: torchrun's failure
    summary prints the call stack under "Root Cause", and one line saying what is wrong and how to fix it reads better
    there than a traceback (which the rank still prints to its stderr). Does nothing outside torchrun."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": message,
                        "extraInfo": {"py_callstack": message, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError as err:  # the summary then lacks the message; the rank's stderr still has it
        logging.warning("could not write torchrun's error file %s: %s", path, err)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        load_conf(args.conf, args.conf_param)
        config = TrainerConfig(root_dir=args.root_dir, conf_file=args.conf)
    except (ConfError, ValueError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        record_error_for_torchrun(f"error: {one_line(err)}")
        return 2
    setup_logging(args.root_dir)
    # after the conf is known good: imports torch-heavy modules
    from alfish.trainer.build import build_trainer
    from alfish.trainer.checkpoint import CheckpointError

    try:
        trainer = build_trainer(config)
    except (ValueError, TypeError, RuntimeError, CheckpointError) as err:
        # e.g. a bad algorithm hyperparameter or an unknown env id; gin appends "In call to configurable ..." lines.
        message = f"could not build the experiment: {one_line(err)}"
        logging.error("%s", message)
        record_error_for_torchrun(message)
        return 2
    if process_rank() == 0:
        write_config_record(args.root_dir)  # logs a warning for each binding that was set but never used
    try:
        return trainer.run()
    except Exception as err:
        record_error_for_torchrun(f"{type(err).__name__}: {one_line(err)}")
        raise  # the traceback goes to stderr


if __name__ == "__main__":
    sys.exit(main())
