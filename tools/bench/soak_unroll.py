"""A soak of the asynchronous unroll: several unroll processes whose envs keep crashing, replaced every time
(``Trainer.restart_crashed_envs``), for ``--minutes``; the trainer's and its children's memory, the trainer's open
files and ``/dev/shm`` are sampled all along and must stay flat; nothing is lost.

    python tools/bench/soak_unroll.py [--minutes 10] [--processes 4] [--crash_every 3000] [--out soak.json]

The run: ``confs/ppo_cartpole.gin`` with PPO + V-trace from ``--processes`` unroll processes (2 envs each) on
``alfish/Latency-v0`` (CartPole, 1 ms a step) whose envs raise at their ``--crash_every``-th step, so each child
fails and is replaced about every ``crash_every`` of its env steps. At the end the trainer gets SIGTERM (it writes
a checkpoint and stops its children). Reported: the samples (trainer RSS, children RSS summed, unroll children alive,
the trainer's open file descriptors, ``/dev/shm`` entries), the first and last quarter's medians of each, the
restarts counted (``async/env_restarts``) against the replacements logged, and whether any process or shared-memory
entry outlived the run. "Nothing lost": every iteration took its steps (``train/env_steps`` is iterations x
unroll_length x envs), and the run's exit is SIGTERM's own (``128 + 15``) with a checkpoint written.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def sample(trainer: psutil.Process, shm_before: set[str]) -> dict:
    """One sample of the trainer's and its children's resources."""
    children = trainer.children(recursive=True)
    unroll = [c for c in children if _is_unroll_child(c)]
    return dict(t=time.monotonic(), trainer_rss_mb=trainer.memory_info().rss / 2**20,
                children_rss_mb=sum(_rss(c) for c in children) / 2**20, unroll_children=len(unroll),
                open_fds=trainer.num_fds(), shm_entries=len(shm_entries() - shm_before))


def _rss(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.Error:
        return 0


def _is_unroll_child(process: psutil.Process) -> bool:
    try:
        return "spawn_main" in " ".join(process.cmdline())
    except psutil.Error:
        return False


def command(args: argparse.Namespace, root: str) -> list[str]:
    envs = 2 * args.processes
    params = ["TrainerConfig.async_unroll=True", "PpoAlgorithm.off_policy_correction='vtrace'",
              "TrainerConfig.unroll_parameter_update_period=1", "TrainerConfig.unroll_queue_size=64",
              f"Trainer.num_unroll_processes={args.processes}", "Trainer.restart_crashed_envs=True",
              "Trainer.max_env_restarts_per_hour=100000", f"create_environment.num_parallel_environments={envs}",
              "create_environment.env_name='alfish/Latency-v0'",
              "create_environment.env_kwargs={'env_name': 'CartPole-v1', 'latency_s': 0.001, "
              f"'raise_at_step': {args.crash_every}}}",
              "TrainerConfig.num_env_steps=1000000000", "TrainerConfig.evaluate=False",
              "TrainerConfig.num_checkpoints=0", "TrainerConfig.summary_interval=20"]
    cmd = [sys.executable, "-m", "alfish.bin.train", "--conf", os.path.join(REPO, "confs", "ppo_cartpole.gin"),
           "--root_dir", root]
    for p in params:
        cmd += ["--conf_param", p]
    return cmd


def quarter_medians(samples: list[dict], key: str) -> tuple[float, float]:
    quarter = max(1, len(samples) // 4)
    return statistics.median(s[key] for s in samples[:quarter]), statistics.median(s[key] for s in samples[-quarter:])


def last_scalar(root: str, tag: str) -> float | None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(root, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return acc.Scalars(tag)[-1].value if tag in acc.Tags()["scalars"] else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--crash_every", type=int, default=3000, help="each env raises at this step of its life")
    parser.add_argument("--sample_s", type=float, default=10.0)
    parser.add_argument("--out", default=None, help="write the samples and the verdict as JSON here")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="alfish-soak-")
    shm_before = shm_entries()
    log_path = os.path.join(root, "stderr.txt")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command(args, root), cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    trainer = psutil.Process(proc.pid)
    samples, end = [], time.monotonic() + 60 * args.minutes
    time.sleep(min(30.0, args.sample_s * 3))  # start-up (imports, children) is not the steady state
    while time.monotonic() < end and proc.poll() is None:
        samples.append(sample(trainer, shm_before))
        time.sleep(args.sample_s)
    children = [c.pid for c in trainer.children(recursive=True)] if proc.poll() is None else []
    proc.send_signal(signal.SIGTERM)
    exit_code = proc.wait(timeout=120)
    time.sleep(2.0)
    orphans = [pid for pid in children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    stderr = open(log_path).read()
    report = dict(minutes=args.minutes, processes=args.processes, crash_every=args.crash_every, exit_code=exit_code,
                  checkpoint_written="checkpoint written" in stderr, replacements_logged=stderr.count("replacing it"),
                  env_restarts=last_scalar(root, "async/env_restarts"), env_steps=last_scalar(root, "train/env_steps"),
                  orphans=orphans, shm_left=len(shm_entries() - shm_before), samples=samples)
    for key in ("trainer_rss_mb", "children_rss_mb", "unroll_children", "open_fds", "shm_entries"):
        if samples:
            first, last = quarter_medians(samples, key)
            report[key] = dict(first_quarter=first, last_quarter=last)
            print(f"{key:18s} first quarter {first:9.1f}   last quarter {last:9.1f}")
    print(f"exit code {exit_code} (SIGTERM: {128 + signal.SIGTERM}), "
          f"checkpoint written: {report['checkpoint_written']}")
    print(f"replacements logged {report['replacements_logged']}, async/env_restarts {report['env_restarts']}, "
          f"env steps {report['env_steps']}")
    print(f"orphans {orphans}, /dev/shm entries left {report['shm_left']}; run dir {root}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
