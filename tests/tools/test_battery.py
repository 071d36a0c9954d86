"""The reliability battery's cheapest scenario runs end to end (a real training run and real ``play`` subprocesses on
a tiny conf) and its table row says PASS; the table has the documented columns."""
import importlib.util
import pathlib

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
