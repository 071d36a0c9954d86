"""SignalRequests with real signals (in subprocesses and in-process) and the crash-time confirmation prompt."""
import os
import pathlib
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from alfish.console.signals import SignalRequests, confirm_checkpoint_on_crash

REPO = str(pathlib.Path(__file__).resolve().parents[2])
TIMEOUT = 20.0  # seconds for any single wait on a child; normally each takes milliseconds

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="POSIX signals")

# Children load signals.py by its path: it imports nothing from alfish, and this spares each child the ~1.5 s import
# of torch that `import alfish.trainer` brings (the package __init__ pulls in the trainer's modules).
LOAD_SIGNALS = f"""
import importlib.util
_spec = importlib.util.spec_from_file_location("alfish_trainer_signals", {REPO + "/alfish/console/signals.py"!r})
signals_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(signals_module)
SignalRequests = signals_module.SignalRequests
confirm_checkpoint_on_crash = signals_module.confirm_checkpoint_on_crash
"""

# A training loop stand-in: polls the flags once per "iteration" and reports what it sees on stdout.
LOOP = """
import signal, sys, time
# Behave like an interactive program even when the test runner was started in the background, where a
# non-interactive shell leaves SIGINT ignored (and SignalRequests deliberately keeps an ignored signal ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)
prev = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}
try:
    with SignalRequests() as sig:
        print("ready", flush=True)
        deadline = time.monotonic() + 30
        reported_stop = False
        while time.monotonic() < deadline:
            time.sleep(0.005)
            if sig.checkpoint_requested:
                sig.clear_checkpoint_request()  # first: a request arriving while we save is kept
                print("checkpoint", flush=True)
            if sig.stop_requested and not reported_stop:
                print("stop", sig.stop_signal, flush=True)
                reported_stop = True
                if STOP_ON_REQUEST:
                    break
        else:
            print("timeout", flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    code = 3
else:
    code = sig.exit_code()
restored = all(signal.getsignal(s) == h for s, h in prev.items())
print("restored", restored, flush=True)
sys.exit(code)
"""


class _Child:
    """A child process whose stdout lines are read with a timeout (raw reads: no lines hidden in a buffer)."""

    def __init__(self, code):
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, cwd=REPO)
        self.pid = self.proc.pid
        self._buf = b""

    def readline(self, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            ready = remaining > 0 and select.select([self.proc.stdout], [], [], remaining)[0]
            chunk = os.read(self.proc.stdout.fileno(), 4096) if ready else b""
            if not chunk:
                self.proc.kill()
                raise AssertionError(f"child said nothing in {timeout} s (or exited); seen {self._buf!r}, "
                                     f"stderr: {self.proc.stderr.read().decode()}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode().strip()

    def finish(self):
        """(exit code, rest of stdout, stderr), waiting at most TIMEOUT seconds."""
        try:
            out, err = self.proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate(timeout=TIMEOUT)
            raise
        return self.proc.returncode, (self._buf + out).decode(), err.decode()


def _start(stop_on_request):
    return _Child(LOAD_SIGNALS + f"STOP_ON_REQUEST = {stop_on_request}\n" + textwrap.dedent(LOOP))


def test_sigusr2_then_sigterm_in_a_training_loop():
    proc = _start(stop_on_request=True)
    try:
        assert proc.readline() == "ready"
        os.kill(proc.pid, signal.SIGUSR2)
        assert proc.readline() == "checkpoint"
        os.kill(proc.pid, signal.SIGUSR2)  # the request can be made again after it was cleared
        assert proc.readline() == "checkpoint"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.readline() == f"stop {int(signal.SIGTERM)}"
    finally:
        rc, out, err = proc.finish()
    assert out.strip() == "restored True"
    assert rc == 128 + 15, err
    assert "received SIGTERM; stopping after the current iteration" in err


def test_second_sigint_quits_at_once_without_a_traceback():
    proc = _start(stop_on_request=False)  # a loop that does not stop on the first request
    try:
        assert proc.readline() == "ready"
        os.kill(proc.pid, signal.SIGINT)
        assert proc.readline() == f"stop {int(signal.SIGINT)}"
        os.kill(proc.pid, signal.SIGINT)
    finally:
        rc, out, err = proc.finish()
    assert rc == 128 + signal.SIGINT, err
    assert out == ""  # os._exit: nothing after the signal ran, the loop's "restored" line included
    assert "alfish: received SIGINT again while stopping; quitting now without a checkpoint of the unfinished " \
           "iteration (no checkpoint of this run was written yet)" in err.splitlines()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


# An iteration that never ends (a hung env step): only the grace deadline can end the process.
HUNG_LOOP = """
import signal, sys, time
with SignalRequests(stop_grace_s=GRACE) as sig:
    print("ready", flush=True)
    time.sleep(3600)  # the stuck iteration
"""


def _start_hung(grace):
    return _Child(LOAD_SIGNALS + f"GRACE = {grace}\n" + textwrap.dedent(HUNG_LOOP))


def test_sigterm_ends_a_stuck_iteration_after_the_grace_period_naming_where():
    proc = _start_hung(grace=1.0)
    try:
        assert proc.readline() == "ready"
        start = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
    finally:
        rc, out, err = proc.finish()
    took = time.monotonic() - start
    assert rc == 128 + signal.SIGTERM, err
    assert 1.0 <= took < 1.0 + 3.0, took  # the grace, plus the watchdog's wake-up and a loaded machine's margin
    lines = [line for line in err.splitlines() if line]
    assert lines[0] == "alfish: received SIGTERM; stopping after the current iteration (at most 1 s); send it again " \
                       "to quit now"
    assert len(lines) == 2, err
    assert lines[1].startswith("alfish: the current iteration did not end within Trainer.stop_grace_s=1 s of SIGTERM; "
                               "quitting without a checkpoint of it (no checkpoint of this run was written yet); the "
                               "main thread was at <string>:")
    assert lines[1].endswith(" in <module>")  # (python -c has no source lines to show)


def test_a_second_sigterm_ends_a_stuck_iteration_at_once():
    proc = _start_hung(grace=60.0)
    try:
        assert proc.readline() == "ready"
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.2)
        start = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
    finally:
        rc, out, err = proc.finish()
    assert rc == 128 + signal.SIGTERM and time.monotonic() - start < 2.0, err
    assert "received SIGTERM again while stopping; quitting now" in err and "Traceback" not in err


def test_an_exit_requested_while_a_checkpoint_is_written_waits_for_it():
    code = LOAD_SIGNALS + textwrap.dedent("""
        import os, signal, time
        from alfish.console.hard_exit import critical_section
        with SignalRequests(stop_grace_s=60) as sig:
            with critical_section():
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)  # would quit at once, but a checkpoint is being written
                time.sleep(0.2)
                print("written", flush=True)
            print("after", flush=True)
    """)
    proc = _Child(code)
    rc, out, err = proc.finish()
    assert rc == 128 + signal.SIGTERM and out == "written\n", (out, err)


def test_stop_grace_s_must_be_positive():
    for bad in (0, -1.0, float("inf"), float("nan"), "30"):
        with pytest.raises(ValueError, match="stop_grace_s must be a finite number of seconds > 0"):
            SignalRequests(stop_grace_s=bad)


def test_in_process_flags_and_restore():
    def custom(signum, frame):
        pass

    previous = signal.signal(signal.SIGUSR2, custom)
    before_term, before_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        with SignalRequests() as sig:
            assert signal.getsignal(signal.SIGUSR2) == sig._on_checkpoint
            assert not (sig.stop_requested or sig.checkpoint_requested) and sig.exit_code() == 0
            signal.raise_signal(signal.SIGUSR2)
            assert sig.checkpoint_requested and not sig.stop_requested
            sig.clear_checkpoint_request()
            assert not sig.checkpoint_requested
            signal.raise_signal(signal.SIGTERM)
            assert sig.stop_requested and sig.stop_signal == signal.SIGTERM
            assert sig.exit_code() == 143
            with pytest.raises(RuntimeError, match="not reentrant"):
                sig.__enter__()
        assert signal.getsignal(signal.SIGUSR2) is custom
        assert signal.getsignal(signal.SIGTERM) == before_term
        assert signal.getsignal(signal.SIGINT) == before_int
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        with SignalRequests() as sig:
            assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
            signal.raise_signal(signal.SIGUSR2)
            assert not sig.checkpoint_requested
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_outside_main_thread_is_a_noop():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}
    seen = {}

    def body():
        with SignalRequests() as sig:
            seen["handlers"] = {s: signal.getsignal(s) for s in before}
            seen["flags"] = (sig.stop_requested, sig.checkpoint_requested)

    t = threading.Thread(target=body)
    t.start()
    t.join(timeout=TIMEOUT)
    assert not t.is_alive()
    assert seen == {"handlers": before, "flags": (False, False)}


# ---------------------------------------------------------------- confirm_checkpoint_on_crash


def test_confirm_false_never_asks():
    assert confirm_checkpoint_on_crash(False, stdin=None) is True


def test_pipe_is_never_read():
    r, w = os.pipe()
    try:
        os.write(w, b"n\n")
        with os.fdopen(r, "r", closefd=False) as stdin:
            start = time.monotonic()
            assert confirm_checkpoint_on_crash(True, stdin=stdin, timeout_s=30) is True
            assert time.monotonic() - start < 1.0
        assert os.read(r, 16) == b"n\n"  # the answer "n" is still in the pipe: nothing was read
    finally:
        os.close(r)
        os.close(w)


def test_devnull_and_closed_streams():
    with open(os.devnull) as devnull:
        start = time.monotonic()
        assert confirm_checkpoint_on_crash(True, stdin=devnull, timeout_s=30) is True
        assert time.monotonic() - start < 1.0
    assert confirm_checkpoint_on_crash(True, stdin=devnull, timeout_s=30) is True  # closed now
    with pytest.raises(ValueError, match="timeout_s"):
        confirm_checkpoint_on_crash(True, stdin=None, timeout_s=float("inf"))


@pytest.fixture
def tty():
    """A real terminal: (the stream the prompt reads, the fd a 'user' types into)."""
    pty = pytest.importorskip("pty")
    try:
        master, slave = pty.openpty()
    except OSError as e:
        pytest.skip(f"no pseudo-terminal here: {e}")
    stream = os.fdopen(slave, "r")
    yield stream, master
    stream.close()
    os.close(master)


@pytest.mark.parametrize("typed, expected", [(b"n\n", False), (b"No\n", False), (b"\n", True), (b"y\n", True)])
def test_terminal_answer(tty, capsys, typed, expected):
    stream, master = tty
    os.write(master, typed)
    assert confirm_checkpoint_on_crash(True, stdin=stream, timeout_s=TIMEOUT) is expected
    assert "Write a checkpoint before exiting? [Y/n]" in capsys.readouterr().err


def test_terminal_without_answer_times_out_to_yes(tty, capsys):
    stream, _ = tty
    start = time.monotonic()
    assert confirm_checkpoint_on_crash(True, stdin=stream, timeout_s=0.2) is True
    assert 0.2 <= time.monotonic() - start < 2.0
    assert "no answer in 0.2 s; writing the checkpoint" in capsys.readouterr().err


BACKGROUND_JOB = """
import os, pty, select, sys, time
pid, master = pty.fork()  # child: a session whose controlling terminal is the pty
if pid == 0:
    job = os.fork()
    if job == 0:
        os.setpgid(0, 0)  # a background job of that terminal, like `python train.py &`
        exec(LOAD_SIGNALS)
        os._exit(10 if confirm_checkpoint_on_crash(True, timeout_s=20) else 11)
    _, status = os.waitpid(job, os.WUNTRACED)
    if os.WIFSTOPPED(status):  # stopped by SIGTTIN: reading the terminal from the background
        os.kill(job, 9)
        os._exit(12)
    os._exit(os.waitstatus_to_exitcode(status))
os.write(master, b"n\\n")  # an answer is waiting on the terminal
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    if select.select([master], [], [], 0.05)[0]:
        try:
            os.read(master, 1024)
        except OSError:
            pass
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print(os.waitstatus_to_exitcode(status))
        break
else:
    os.kill(pid, 9)
    print("timeout")
"""


def test_background_job_of_a_terminal_is_not_asked():
    pytest.importorskip("pty")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.monotonic()
    code = f"LOAD_SIGNALS = {LOAD_SIGNALS!r}\n" + BACKGROUND_JOB
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=TIMEOUT + 10, cwd=REPO)
    assert proc.stdout.strip() == "10", (proc.stdout, proc.stderr)  # returned True, without reading "n"
    assert time.monotonic() - start < 10
