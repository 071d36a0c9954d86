"""tools/bench/bench_vs_sb3.py's peer plumbing: the table with SB3 and SBX columns, and SBX's own environment.

The timings themselves are benchmarks (run by hand, figures in the README), not tests."""
import importlib.util
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def bench(name: str):
    """A tools/bench script as a module (scripts, not a package: loaded from their files)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_table_has_a_column_and_a_ratio_per_peer_and_leaves_an_algorithm_a_peer_lacks_empty():
    rows = [("dqn", "default threads", {"alfish": 600.0, "sb3": 500.0, "sbx": 1200.0}),
            ("a2c", "default threads", {"alfish": 3000.0, "sb3": 2000.0})]  # SBX has no A2C
    text = bench("bench_vs_sb3").table(rows, ["sb3", "sbx"])
    assert text.splitlines() == [
        "| algorithm | threads | alfish env steps/s | SB3 env steps/s | SBX env steps/s | alfish / SB3 "
        "| alfish / SBX |",
        "|---|---|---:|---:|---:|---:|---:|",
        "| dqn | default threads | 600 | 500 | 1200 | 1.20 | 0.50 |",
        "| a2c | default threads | 3000 | 2000 |  | 1.50 |  |"]


def test_the_compiled_variant_gets_its_own_columns_and_ratios(monkeypatch):
    module = bench("bench_vs_sb3")
    monkeypatch.setattr(module, "VARIANTS", ["alfish", "alfish_compiled"])
    rows = [("sac", "default threads", {"alfish": 100.0, "alfish_compiled": 125.0, "sb3": 80.0, "sbx": 100.0}),
            ("a2c", "default threads", {"alfish": 3000.0, "sb3": 2000.0})]  # nothing to compile; SBX has no A2C
    lines = module.table(rows, ["sb3", "sbx"]).splitlines()
    assert lines[0] == ("| algorithm | threads | alfish env steps/s | alfish compiled env steps/s | SB3 env steps/s | "
                        "SBX env steps/s | alfish / SB3 | alfish / SBX | alfish compiled / SB3 | "
                        "alfish compiled / SBX |")
    assert lines[2] == "| sac | default threads | 100 | 125 | 80 | 100 | 1.25 | 1.00 | 1.56 | 1.25 |"
    assert lines[3] == "| a2c | default threads | 3000 |  | 2000 |  | 1.50 |  |  |  |"


def test_sbx_without_its_environment_is_a_one_line_error_that_says_how_to_make_one(tmp_path):
    module = bench("bench_vs_sb3")
    for path in (None, str(tmp_path / "missing" / "python")):
        with pytest.raises(SystemExit) as err:
            module.check_sbx_python(path)
        message = str(err.value)
        assert "\n" not in message and "pip install torch==2.13.0 sbx-rl" in message
    assert module.check_sbx_python(sys.executable) == sys.executable


def test_every_algorithm_run_against_sbx_has_a_jit_warm_up_and_a2c_is_not_one_of_them():
    # bench_vs_sb3 runs SBX for SBX_ALGOS; run_one times each after SBX_WARM_UP_STEPS[algo] (a missing entry would be
    # a KeyError mid-benchmark); SBX has no A2C, which run_one refuses in one line
    module = bench("run_one")
    assert set(module.SBX_WARM_UP_STEPS) == set(bench("bench_vs_sb3").SBX_ALGOS)
    assert "a2c" not in module.SBX_WARM_UP_STEPS
