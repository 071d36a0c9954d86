"""The reliability battery's cheapest scenario runs end to end (a real training run and real ``play`` subprocesses on
a tiny conf) and its table row says PASS; the table has the documented columns; the malicious scenario's measurements
(outside directory, one-line refusals, hangs, peak RSS) tell a failure from a pass."""
import importlib.util
import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("reliability_battery", REPO / "tools" / "reliability" / "battery.py")
battery = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(battery)


@pytest.mark.timeout(60)
def test_nan_scenario_passes_and_the_table_says_so(capsys):
    assert battery.main(["--only", "nan"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| scenario | trials | result | figure |"
    [row] = [line for line in out if line.startswith("| NaN")]
    assert "| 1 | PASS |" in row and "non-finite loss terms: value_loss" in row, row


def test_a_crashing_scenario_is_a_fail_row_and_the_battery_goes_on(monkeypatch):
    def boom(work, args):
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setitem(battery.SCENARIOS, "nan", boom)
    row = battery.run_scenario("nan", None)
    assert (row.result, row.figure) == ("FAIL", "the scenario crashed: RuntimeError: disk on fire")


# The malicious scenario's measurements, on commands that take milliseconds (``python -c``): a scenario that could not
# see a write through a planted link, a hang, a memory blow-up or a traceback would pass what it should fail.
malicious = battery.malicious
watch = sys.modules["watch"]
TRUSTING = malicious.Case("test case", lambda root, outside: None)


def measured(tmp_path, code: str, timeout_s: float = 20.0):
    """``python -c code`` run as the scenario runs a command, with ``tmp_path/outside`` watched; its Outcome."""
    outside = tmp_path / "outside"
    before = watch.tree_digest(outside)
    opened = watch.OpenWatch(outside)
    opened.start()
    try:
        finished = watch.run_measured([sys.executable, "-c", code], tmp_path, dict(os.environ), timeout_s,
                                      tmp_path / "logs", malicious.KILL_RSS_MB)
        touched = opened.touched()
    finally:
        opened.close()
    changes = watch.digest_changes(before, watch.tree_digest(outside)) + [f"{t} (inotify)" for t in touched]
    return malicious.judge(TRUSTING, "play", finished, timeout_s, changes)


@pytest.fixture
def planted(tmp_path):
    """root/log.txt, a link to outside/log.txt."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "log.txt").write_text("outside\n")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "log.txt").symlink_to(tmp_path / "outside" / "log.txt")
    return tmp_path


def test_a_write_or_a_read_through_a_planted_link_fails_and_names_the_outside_file(planted):
    link = planted / "root" / "log.txt"
    wrote = measured(planted, f"open({str(link)!r}, 'a').write('x')")
    assert not wrote.ok and "outside touched: changed log.txt" in wrote.why, wrote.why
    read = measured(planted, f"open({str(link)!r}).read()")
    assert not read.ok and read.why == "outside touched: read log.txt (inotify)", read.why
    untouched = measured(planted, f"import os; os.lstat({str(link)!r})")  # looking at the link is not following it
    assert untouched.ok and untouched.outside == [], untouched.why


def test_a_one_line_refusal_passes_and_a_traceback_or_more_lines_fail(planted):
    refusal = measured(planted, "import sys; print('INFO starting', file=sys.stderr); "
                                "sys.exit('error: root/log.txt is a symbolic link; remove it')")
    assert refusal.ok and refusal.rc == 1 and refusal.one_line, refusal.why
    assert refusal.last_line == "error: root/log.txt is a symbolic link; remove it"
    crashed = measured(planted, "raise OverflowError('cannot convert float infinity to integer')")
    assert not crashed.ok and crashed.why == ("a traceback on stderr: OverflowError: cannot convert float infinity "
                                              "to integer"), crashed.why
    two = measured(planted, "import sys; print('error: a', file=sys.stderr); sys.exit('error: b')")
    assert not two.ok and two.why.startswith("2 error lines"), two.why


def test_a_hang_and_a_memory_blow_up_are_failures(planted, monkeypatch):
    hang = measured(planted, "import time; time.sleep(30)", timeout_s=1.0)
    assert hang.rc is None and hang.why == "hang: killed after 1 s" and hang.wall_s < 5
    monkeypatch.setattr(malicious, "MAX_RSS_MB", 150)
    big = measured(planted, "import time; x = b'1' * (300 << 20); time.sleep(0.5)")
    assert big.rc == 0 and big.max_rss_mb > 300 and big.why == f"peak RSS {big.max_rss_mb:.0f} MB > 150 MB"


def test_a_command_that_used_the_damaged_newest_checkpoint_fails_and_a_fall_back_passes():
    unusable = malicious.Case("compressed", lambda root, outside: None, "play", unusable=True)
    played = watch.Finished(0, "average return over 1 episodes: -1.00 (checkpoint /r/checkpoints/ckpt-3)\n", "", 5.0,
                            250.0)
    assert malicious.judge(unusable, "play", played, 30, []).why == ("used the damaged newest checkpoint (ckpt-3) "
                                                                     "instead of refusing it")
    fell_back = watch.Finished(0, "average return over 1 episodes: -1.00 (checkpoint /r/checkpoints/ckpt-2)\n",
                               "WARNING /r/checkpoints/ckpt-3 does not verify; playing ckpt-2\n", 5.0, 250.0)
    assert malicious.judge(unusable, "play", fell_back, 30, []).ok
    assert all(case.quick in malicious.COMMANDS and set(case.flags) <= set(malicious.COMMANDS)
               for case in malicious.CASES)
