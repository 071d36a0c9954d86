"""Battery scenarios about the processes a run is made of: the async unroll child, async env workers, torchrun ranks
(each SIGKILLed and SIGSTOPped: the run must end with an error naming it, within a bound), and the soak (RSS, fds and
/dev/shm of the whole process tree over a long run)."""
from __future__ import annotations

import pathlib
import signal
import sys
import time

import psutil
from harness import A2C_SLOW, SAC_SLOW, TORCHRUN, Proc, Row, shm_bytes, train, tree_rss_fds, wait_for

ASYNC_UNROLL = "TrainerConfig.async_unroll = True\nTrainerConfig.unroll_queue_size = 8\n"
ASYNC_ENVS = "create_environment.vectorization = 'async'\ncreate_environment.step_timeout_s = 5.0\n"


def _hit(proc: Proc, victim: int, sig: signal.Signals, expect: str, bound_s: float) -> tuple[bool, str]:
    """Send ``sig`` to ``victim``; the run must exit non-zero within ``bound_s`` with ``expect`` in its output."""
    import os

    os.kill(victim, sig)
    start = time.monotonic()
    rc = proc.wait(bound_s + 5)
    took = time.monotonic() - start
    text = proc.text()
    ok = rc not in (None, 0) and took <= bound_s and expect in text
    return ok, (f"{sig.name}: exit {rc} after {took:.1f} s" + ("" if expect in text else
                                                                  f" (no '{expect[:60]}' in output)"))


def _started(proc: Proc, root: pathlib.Path, find) -> list:
    if not wait_for(lambda: (root / "tb").exists() and find(proc) or proc.popen.poll() is not None, 90, 0.3):
        raise RuntimeError(f"the run did not start: {proc.text()[-300:]}")
    time.sleep(1.5)
    return find(proc)


def _unroll_children(proc: Proc) -> list[int]:
    out = []
    for p in proc.descendants():
        try:
            if "spawn_main" in " ".join(p.cmdline()):
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


def _env_workers(proc: Proc) -> list[int]:
    """Processes forked by the forkserver (the env workers), not the forkserver itself."""
    out = []
    for p in proc.descendants():
        try:
            if "forkserver" in " ".join(p.parent().cmdline()):
                out.append(p.pid)
        except (psutil.Error, AttributeError):
            pass
    return out


def async_unroll_child(work: pathlib.Path, args) -> Row:
    conf = work / "async.gin"
    conf.write_text(SAC_SLOW + ASYNC_UNROLL)
    results = []
    for sig, bound in ((signal.SIGKILL, 10.0), (signal.SIGSTOP, 30.0)):
        root = work / sig.name
        proc = train(conf, root, work / f"{sig.name}.log")
        try:
            victim = _started(proc, root, _unroll_children)[0]
            results.append(_hit(proc, victim, sig, f"async unroll child (pid {victim})", bound))
        finally:
            proc.kill_group()
    return Row("async unroll child killed / stopped", 2, all(ok for ok, _ in results),
               "; ".join(f for _, f in results) + " (bounds: 10 s killed, 30 s stopped)")


def env_workers(work: pathlib.Path, args) -> Row:
    conf = work / "workers.gin"
    conf.write_text(A2C_SLOW + ASYNC_ENVS)
    results = []
    for sig, bound, expect in ((signal.SIGKILL, 10.0, "was killed by signal SIGKILL"),
                               (signal.SIGSTOP, 15.0, "within step_timeout_s=5")):
        root = work / sig.name
        proc = train(conf, root, work / f"{sig.name}.log")
        try:
            victim = _started(proc, root, _env_workers)[0]
            results.append(_hit(proc, victim, sig, expect, bound))
            if f"(pid {victim})" not in proc.text():
                results.append((False, f"{sig.name}: the error does not name pid {victim}"))
        finally:
            proc.kill_group()
    return Row("async env worker killed / stopped (step_timeout_s=5)", 2, all(ok for ok, _ in results),
               "; ".join(f for _, f in results) + " (bounds: 10 s killed, 15 s stopped)")


def _ranks(proc: Proc) -> dict[int, psutil.Process]:
    ranks = {}
    for p in proc.descendants():
        try:
            rank = p.environ().get("RANK")
            if rank in ("0", "1") and "alfish.bin.train" in " ".join(p.cmdline()):
                ranks[int(rank)] = p
        except psutil.Error:
            pass
    return ranks


def ranks(work: pathlib.Path, args) -> Row:
    conf = work / "ddp.gin"
    conf.write_text(SAC_SLOW.replace("num_checkpoints = 1", "num_checkpoints = 0")
                    + "init_distributed.timeout_s = 10\n")
    results = []
    for sig, expect in ((signal.SIGKILL, "exitcode  : -9"), (signal.SIGSTOP, "RankStoppedError: rank 1")):
        root = work / sig.name
        proc = Proc(TORCHRUN + ["-m", "alfish.bin.train", "--conf", str(conf), "--root_dir", str(root)],
                    work / f"{sig.name}.log")
        try:
            found = _started(proc, root, lambda p: _ranks(p) if len(_ranks(p)) == 2 else {})
            results.append(_hit(proc, found[1].pid, sig, expect, 60.0))
        finally:
            proc.kill_group()
    return Row("torchrun rank killed / stopped (2 ranks, gloo, timeout_s=10)", 2, all(ok for ok, _ in results),
               "; ".join(f for _, f in results) + " (bound 60 s; root cause names rank 1)")


# Bounds for the soak, after a warm-up of a fifth of the run: RSS growth under 5 MB/min for the whole tree, at most 4
# more open fds, at most 1 MB more in /dev/shm.
RSS_MB_PER_MIN, FD_SLACK, SHM_SLACK = 5.0, 4, 1 << 20


def soak(work: pathlib.Path, args) -> Row:
    conf, root = work / "soak.gin", work / "root"
    conf.write_text(SAC_SLOW.replace("num_checkpoints = 1", "num_checkpoints = 1000") + ASYNC_ENVS
                    + "create_environment.num_parallel_environments = 2\n")
    shm0 = shm_bytes()
    proc = train(conf, root, work / "soak.log")
    samples = []
    try:
        if not wait_for(lambda: (root / "tb").exists() or proc.popen.poll() is not None, 90):
            raise RuntimeError(f"the run did not start: {proc.text()[-300:]}")
        start = time.monotonic()
        while time.monotonic() - start < args.soak_s and proc.popen.poll() is None:
            rss, fds = tree_rss_fds(proc.pid)
            samples.append((time.monotonic() - start, rss, fds, shm_bytes()))
            time.sleep(min(5.0, max(args.soak_s / 30, 1.0)))
        alive = proc.popen.poll() is None
    finally:
        proc.kill_group()
    if not alive or len(samples) < 4:
        return Row("soak", 1, False, f"the run ended early ({len(samples)} samples): {proc.text()[-300:]}")
    warm = next(s for s in samples if s[0] >= samples[-1][0] / 5)
    end = samples[-1]
    per_min = (end[1] - warm[1]) / 2**20 / max((end[0] - warm[0]) / 60, 1e-9)
    ok = per_min < RSS_MB_PER_MIN and end[2] <= warm[2] + FD_SLACK and end[3] <= max(warm[3], shm0) + SHM_SLACK
    return Row(f"soak {args.soak_s:.0f} s (SAC, 2 async env workers)", len(samples), ok,
               f"RSS {samples[0][1] / 2**20:.0f} MB at start, {warm[1] / 2**20:.0f} MB after warm-up, "
               f"{end[1] / 2**20:.0f} MB at end ({per_min:+.2f} MB/min, bound {RSS_MB_PER_MIN}); fds {samples[0][2]}"
               f" -> {end[2]}; /dev/shm {samples[0][3] >> 10} KB -> {end[3] >> 10} KB")


if __name__ == "__main__":
    sys.exit("run tools/reliability/battery.py")
