"""``scripts/validate_confs.py``, the conf regression suite: every shipped conf declares a valid expected result; the
fast subset trains and passes (as CI runs it); a conf whose threshold cannot be reached fails with exit status 1; a
missing or malformed declaration is a one-line error (exit 2)."""
import importlib.util
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("validate_confs", REPO / "scripts" / "validate_confs.py")
validate_confs = importlib.util.module_from_spec(spec)
sys.modules["validate_confs"] = validate_confs  # (its dataclasses look their module up there)
spec.loader.exec_module(validate_confs)

pytestmark = [pytest.mark.timeout(180)]


@pytest.mark.parametrize("conf", sorted((REPO / "confs").glob("*.gin")), ids=lambda p: p.name)
def test_every_shipped_conf_declares_its_expected_result(conf):
    expectation = validate_confs.read_expectation(conf)
    assert expectation.manual or (expectation.env_steps or expectation.iterations) > 0
    assert expectation.seeds >= 1


def test_the_fast_subset_reaches_its_thresholds(tmp_path, capsys):
    assert validate_confs.main(["--fast", "--seeds", "1", "--parallel", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    results = json.loads((tmp_path / "results.json").read_text())
    assert results and all(r["passed"] for r in results.values()), results
    fast = {p.name for p in (REPO / "confs").glob("*.gin") if validate_confs.read_expectation(p).fast}
    assert set(results) == fast and len(fast) >= 2
    for name in fast:
        line = next(line for line in out.splitlines() if line.startswith(name) and line.rstrip().endswith("ok"))
        assert " 1/1 " in line, line


def test_an_unreachable_threshold_is_a_regression(tmp_path, capsys):
    text = (REPO / "confs" / "dqn_her_bitflip.gin").read_text()
    declared = next(line for line in text.splitlines() if line.startswith(validate_confs.MARKER))
    conf = tmp_path / "unreachable.gin"  # returns are <= 0 on bit flipping: 10 is never reached
    conf.write_text(text.replace(declared, '# expected_result: {"threshold": 10, "env_steps": 400, "seeds": 1}'))
    assert validate_confs.main([str(conf), "--out", str(tmp_path / "out"),
                                "--conf_param", "TrainerConfig.initial_collect_steps=80",
                                "--conf_param", "TrainerConfig.eval_interval=1"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("unreachable.gin") and ">= 10" in line)
    assert "0/1" in row and row.rstrip().endswith("REGRESSION"), out


def test_a_missing_or_malformed_declaration_is_a_one_line_error(tmp_path, capsys):
    plain = tmp_path / "plain.gin"
    plain.write_text("TrainerConfig.num_iterations = 1\n")
    assert validate_confs.main([str(plain)]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {plain} declares no expected result; add a line "
                                               "`# expected_result: {...}` to its header")
    broken = tmp_path / "broken.gin"
    broken.write_text('# expected_result: {"threshold": 1, "env_steps": }\n')
    assert validate_confs.main([str(broken)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {broken}:1: the expected_result line is not valid") and err.count("\n") == 1
    both = tmp_path / "both.gin"
    both.write_text('# expected_result: {"threshold": 1, "env_steps": 5, "iterations": 5}\n')
    assert validate_confs.main([str(both)]) == 2
    assert "give one budget, env_steps or iterations" in capsys.readouterr().err


def test_suite_of_a_conf_is_the_gymnasium_family_of_its_env_through_includes(tmp_path):
    from tests.shipped_confs import BOX2D_CONFS, MUJOCO_CONFS

    confs = sorted((REPO / "confs").glob("*.gin"))
    suites = {c.name: validate_confs.suite_of(c) for c in confs}
    assert {n for n, s in suites.items() if s == "mujoco"} == set(MUJOCO_CONFS)
    assert {n for n, s in suites.items() if s == "box2d"} == set(BOX2D_CONFS)
    assert suites["ppo_cartpole.gin"] == "classic_control"
    assert suites["dqn_her_bitflip.gin"] is None and suites["sl_sine.gin"] is None  # alfish's own env; no env
    only_include = tmp_path / "cheetah_copy.gin"  # no env binding of its own: the included conf's
    only_include.write_text(f"include '{REPO / 'confs' / 'sac_halfcheetah.gin'}'\nSacAlgorithm.gamma = 0.98\n")
    assert validate_confs.env_name_of(only_include) == "HalfCheetah-v5"
    assert validate_confs.env_name_of(REPO / "confs" / "sac_hopper.gin") == "Hopper-v5"  # its own binding wins


def test_suite_selects_its_confs_and_an_unknown_suite_is_a_one_line_error(tmp_path, capsys):
    from tests.shipped_confs import MUJOCO_CONFS

    # every MuJoCo conf is manual (hours each): without --include_manual they are listed as skipped, nothing trains
    assert validate_confs.main(["--suite", "mujoco", "--out", str(tmp_path)]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:] if line.strip()]
    assert sorted(rows) == sorted(MUJOCO_CONFS)
    assert json.loads((tmp_path / "results.json").read_text()) == {}
    assert validate_confs.main(["--suite", "mujoko"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --suite mujoko: no conf trains on a gymnasium.envs.mujoko env; the suites of these "
                          "confs are: box2d, classic_control, mujoco") and err.count("\n") == 1
