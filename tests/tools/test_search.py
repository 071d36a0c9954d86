"""``python -m alfish.tools.search``: real Optuna studies (SQLite), real training subprocesses on a toy conf (PPO on
alfish/Chain-v0, the optimum 0.7 reached within ~8 iterations, ``Trainer.stop_value = 0.6`` ending a run that got
there).

The space is one choice: lr 3e-3 (learns: return 0.40 at the first evaluation, iteration 4) or 1e-9 (cannot: -0.70).
The median pruner with one startup trial prunes a 1e-9 trial at its first evaluation once a 3e-3 trial completed;
the random sampler with seed 6 draws 3e-3, 3e-3 (first search, 2 trials), then 1e-9, 3e-3 (seed 6 + 2, the resumed
search to 4 trials), so trial 2 is pruned: a trial that cannot learn would run its 200 iterations, so being stopped
early is the pruner's doing."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import optuna
import pytest

from alfish.tools import search
from alfish.tools.cli import ToolError
from alfish.tools.search_results import format_trials, write_importance
from alfish.tools.search_space import check_space, read_space
from alfish.tools.search_trial import stop_leftover
from tests.integration.inprocess import REPO, eval_log
from tests.tools.hparams_events import read_session

pytestmark = [pytest.mark.timeout(240)]

LEARNS, CANNOT = 3e-3, 1e-9

CHAIN = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 4
PpoAlgorithm.hidden_sizes = (64, 64)
PpoAlgorithm.lr = 3e-3
PpoAlgorithm.gamma = 0.95
PpoAlgorithm.gae_lambda = 0.9
PpoAlgorithm.entropy_coef = 0.0
TrainerConfig.algorithm_ctor = @PpoAlgorithm
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 6
TrainerConfig.unroll_length = 16
TrainerConfig.whole_replay_buffer_training = True
TrainerConfig.clear_replay_buffer = True
TrainerConfig.replay_buffer_length = 17
TrainerConfig.mini_batch_size = 32
TrainerConfig.mini_batch_length = 1
TrainerConfig.num_updates_per_train_iter = 4
TrainerConfig.summary_interval = 10
TrainerConfig.evaluate = True
TrainerConfig.eval_interval = 4
TrainerConfig.async_eval = False
TrainerConfig.epsilon_greedy = 1.0
TrainerConfig.num_eval_episodes = 10
TrainerConfig.num_eval_environments = 5
TrainerConfig.num_checkpoints = 1
Trainer.stop_value = 0.6
"""
SPACE = {"PpoAlgorithm.lr": {"type": "categorical", "choices": [LEARNS, CANNOT]}}
PRUNING = ["--sampler", "random", "--seed", "6", "--pruner", "median", "--startup_trials", "1", "--iterations", "200"]


def write_inputs(tmp: pathlib.Path, space: dict = SPACE) -> tuple[str, str]:
    (tmp / "chain.gin").write_text(CHAIN)
    (tmp / "space.json").write_text(json.dumps(space))
    return str(tmp / "chain.gin"), str(tmp / "space.json")


def run_search(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = search.main(argv)
    return code, out.getvalue(), err.getvalue()


def load(out: pathlib.Path) -> optuna.Study:
    return optuna.load_study(study_name=search.STUDY_NAME, storage=f"sqlite:///{out / search.STUDY_FILE}")


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """The pruning search: 2 trials, then resumed to 4 (see the module docstring)."""
    tmp = tmp_path_factory.mktemp("search")
    conf, space = write_inputs(tmp)
    out = tmp / "out"
    argv = ["--conf", conf, "--space", space, "--root_dir", str(out), *PRUNING]
    first = run_search([*argv, "--trials", "2"])
    logs_after_first = {k: (out / f"trial-{k}" / "log.txt").read_text() for k in (0, 1)}
    second = run_search([*argv, "--trials", "4"])
    return dict(tmp=tmp, conf=conf, out=out, first=first, second=second, logs_after_first=logs_after_first)


def test_the_median_pruner_stops_a_trial_that_cannot_learn(searched):
    assert searched["first"][0] == 0 and searched["second"][0] == 0, searched["second"]
    trials = load(searched["out"]).trials
    drawn = [t.params["PpoAlgorithm.lr"] for t in trials]
    assert drawn == [LEARNS, LEARNS, CANNOT, LEARNS], f"the random sampler drew {drawn}: pick another --seed"
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "PRUNED", "COMPLETE"]
    pruned = searched["out"] / "trial-2"
    assert list(trials[2].intermediate_values) == [4] and trials[2].value < 0.0  # reported once, then pruned
    assert "stopped by signal 15" in (pruned / "log.txt").read_text()  # SIGTERM: it checkpointed and exited
    assert eval_log(pruned)[-1]["iteration"] < 200
    assert "trial 2 pruned at iteration 4" in searched["second"][1]
    for k in (0, 1, 3):  # learned, stopped at Trainer.stop_value
        assert trials[k].value >= 0.6 and eval_log(searched["out"] / f"trial-{k}")[-1]["average_return"] >= 0.6


def test_a_resumed_search_trains_only_the_missing_trials(searched):
    out = searched["second"][1]
    assert "2 of 4 trials ended earlier; 2 to go" in out
    assert "trial 0 started" not in out and "trial 1 started" not in out
    assert "trial 2 started" in out and "trial 3 started" in out
    for k in (0, 1):  # not trained again: the log is as the first search left it
        assert (searched["out"] / f"trial-{k}" / "log.txt").read_text() == searched["logs_after_first"][k]
    assert run_search(["--conf", searched["conf"], "--space", str(searched["tmp"] / "space.json"), "--root_dir",
                       str(searched["out"]), *PRUNING, "--trials", "4"])[1].count("started") == 0


def test_the_table_best_gin_and_hparams(searched):
    out_dir = searched["out"]
    rows = json.loads((out_dir / "search_summary.json").read_text())
    assert [(r["trial"], r["state"], r["params"]["PpoAlgorithm.lr"]) for r in rows] == [
        (0, "complete", LEARNS), (1, "complete", LEARNS), (2, "pruned", CANNOT), (3, "complete", LEARNS)]
    assert rows[2]["value"] < 0.0 and rows[2]["final"] < 0.0 and rows[0]["final"] >= 0.6
    text = (out_dir / "search_summary.txt").read_text().splitlines()
    assert text[0].split() == ["trial", "state", "value", "env", "steps", "final", "best", "at", "steps/s",
                               "wall-clock", "s", "lr"]
    assert text[3].split()[:3] == ["2", "pruned", f"{rows[2]['value']:.2f}"] and text[3].split()[-1] == "1e-09"
    space = read_space(str(searched["tmp"] / "space.json"))
    markdown = format_trials(rows, space, "markdown").splitlines()
    assert markdown[0].startswith("| trial | state | value | env steps |") and markdown[1].startswith("|---|---:|")
    assert format_trials(rows, space, "csv").splitlines()[3].split(",")[:2] == ["2", "pruned"]

    best = (out_dir / "best.gin").read_text()
    assert "PpoAlgorithm.lr = 0.003\n" in best and "trial 0," in best  # the first of equal values
    assert f"--conf_param 'include \"{out_dir / 'best.gin'}\"'" in best

    for k, state in ((0, "complete"), (2, "pruned")):
        hparams, metrics, domains = read_session(out_dir / "hparams" / f"trial-{k}")
        assert hparams == {"PpoAlgorithm.lr": LEARNS if k == 0 else CANNOT, "state": state}
        assert metrics["eval/final_return"] == [pytest.approx(rows[k]["final"], abs=1e-6)]
        assert metrics["eval/best_return"] == [pytest.approx(rows[k]["best"], abs=1e-6)]
        assert domains["PpoAlgorithm.lr"] == [LEARNS, CANNOT]
    assert not (out_dir / "hparams" / "trial-4").exists()


def test_training_with_best_gin(searched, tmp_path):
    # the command best.gin's header suggests, with a shorter run
    root = tmp_path / "best-run"
    done = subprocess.run([sys.executable, "-m", "alfish.bin.train", "--conf", searched["conf"], "--root_dir",
                           str(root), "--conf_param", f"include \"{searched['out'] / 'best.gin'}\"",
                           "--conf_param", "TrainerConfig.num_iterations=4"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "PpoAlgorithm.lr = 0.003" in (root / "config" / "operative.gin").read_text()
    assert [r["iteration"] for r in eval_log(root)] == [4]


def test_a_failing_trial_is_recorded_and_the_search_goes_on(tmp_path):
    # an env id gin accepts (a string) but the trainer cannot make: every trial exits 2 at build; two at a time
    conf, space = write_inputs(tmp_path, {"create_environment.env_name": {"type": "categorical",
                                                                          "choices": ["alfish/NoSuchEnv-v0"]}})
    code, out, err = run_search(["--conf", conf, "--space", space, "--root_dir", str(tmp_path / "out"),
                                 "--trials", "2", "--parallel", "2"])
    assert code == 1, (out, err)
    assert out.index("trial 1 started") < out.index("trial 0 FAILED")  # both ran at once
    trials = load(tmp_path / "out").trials
    assert [t.state.name for t in trials] == ["FAIL", "FAIL"]
    for trial in trials:
        assert trial.user_attrs["error"].startswith("exit 2: ") and "NoSuchEnv" in trial.user_attrs["error"]
    assert "failed: trial 1" in err and "no trial completed: no best.gin" in err
    assert not (tmp_path / "out" / "best.gin").exists()


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_killed_search_requeues_its_running_trial_which_resumes_from_its_checkpoint(tmp_path):
    # The driver is SIGKILLed while trial 0 trains (it cannot stop it): the next search stops the trainer it left
    # (SIGTERM: a checkpoint), marks trial 0 interrupted and trains its bindings again as trial 1, in trial-0,
    # resuming from that checkpoint; an interrupted trial does not count towards --trials.
    conf, space = write_inputs(tmp_path)
    out = tmp_path / "out"
    argv = ["--conf", conf, "--space", space, "--root_dir", str(out), "--sampler", "random", "--seed", "6",
            "--conf_param", "Trainer.stop_value=None"]
    driver = subprocess.Popen([sys.executable, "-m", "alfish.tools.search", *argv, "--trials", "1",
                               "--iterations", "100000"], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (out / "trial-0" / "eval_log.jsonl").exists(), 120, "trial 0's first evaluation")
    finally:
        driver.kill()
        driver.wait()
    try:
        code, text, err = run_search([*argv, "--trials", "1", "--iterations", "8"])
    finally:  # the trainer the killed driver left, should the search above not have stopped it
        attrs = load(out).trials[0].user_attrs
        stop_leftover(attrs["pid"], attrs["pid_created"], str(out / "trial-0"))
    assert code == 0, (text, err)
    assert "stopped the trainer of trial 0 that an earlier search left running" in text
    assert "trial 0 was running when an earlier search stopped" in text and "trial 1 started in trial-0" in text
    trials = load(out).trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert trials[1].user_attrs["requeued_from"] == 0 and trials[1].params == trials[0].params
    log = (out / "trial-0" / "log.txt").read_text()
    assert "stopped by signal 15" in log and "resumed from" in log
    assert not (out / "trial-1").exists()
    rows = json.loads((out / "search_summary.json").read_text())
    assert [(r["trial"], r["state"]) for r in rows] == [(0, "interrupted"), (1, "complete")]



@pytest.mark.slow  # two training starts under a subprocess driver (~12 s); the killed-driver test above is the CI one
def test_a_signalled_search_stops_its_trials_cleanly_and_requeues_them(tmp_path):
    # Ctrl-C or SIGTERM to the search: it sends SIGTERM to its trials (they checkpoint), re-queues them, and exits
    # with 128 + 15; the next search trains the re-queued trial on in the same folder.
    conf, space = write_inputs(tmp_path)
    out = tmp_path / "out"
    argv = ["--conf", conf, "--space", space, "--root_dir", str(out), "--sampler", "random", "--seed", "6",
            "--conf_param", "Trainer.stop_value=None"]
    driver = subprocess.Popen([sys.executable, "-m", "alfish.tools.search", *argv, "--trials", "1",
                               "--iterations", "100000"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_for(lambda: (out / "trial-0" / "eval_log.jsonl").exists(), 120, "trial 0's first evaluation")
        driver.send_signal(signal.SIGTERM)
        text, err = driver.communicate(timeout=120)
    finally:
        driver.kill()
    assert driver.returncode == 128 + signal.SIGTERM, err
    assert "trial 0 was stopped by the search's signal 15: marked failed (interrupted) and re-queued" in text
    trials = load(out).trials
    assert [t.state.name for t in trials] == ["FAIL", "WAITING"] and trials[1].user_attrs["requeued_from"] == 0
    assert "stopped by signal 15" in (out / "trial-0" / "log.txt").read_text()
    code, text, err = run_search([*argv, "--trials", "1", "--iterations", "8"])
    assert code == 0 and "trial 1 started in trial-0" in text, (text, err)
    assert "resumed from" in (out / "trial-0" / "log.txt").read_text()
    assert [t.state.name for t in load(out).trials] == ["FAIL", "COMPLETE"]

@pytest.mark.parametrize("space, message", [
    ("{not json", "cannot read it as JSON"),
    ({}, "give a non-empty JSON object of ranges"),
    ({"PpoAlgorithm.lr": {"type": "flaot", "low": 1, "high": 2}}, "PpoAlgorithm.lr: unknown type 'flaot'"),
    ({"PpoAlgorithm.lr": {"type": "float", "low": 0.1, "high": 0.01}}, "PpoAlgorithm.lr: low 0.1 > high 0.01"),
    ({"PpoAlgorithm.lr": {"type": "float", "low": 0, "high": 1, "log": True}}, "\"log\": true needs low > 0"),
    ({"PpoAlgorithm.lr": {"type": "float", "lo": 0.1, "high": 1}}, "unknown key 'lo' for type float"),
    ({"PpoAlgorithm.lr": {"type": "categorical", "choices": []}}, "\"choices\" must be a non-empty list"),
    ({"PpoAlgorithm.lr": {"type": "categorical", "choices": [1, 1.0]}}, "are the same choice"),
    ({"TrainerConfig.unroll_length": {"type": "int", "low": 1.5, "high": 4}}, "must be a whole number"),
    ({"lr": {"type": "float", "low": 0.1, "high": 1}}, "lr: not a gin binding"),
    ({"PpoAlgorithm.lrr": {"type": "float", "low": 0.1, "high": 1}}, "has no parameter 'lrr'; did you mean 'lr'?"),
    ({"PpoAlgorithm.lr": {"type": "float", "low": -1, "high": 1}}, "PpoAlgorithm.lr=-1.0 does not fit --conf"),
])
def test_a_bad_space_is_one_line(tmp_path, space, message):
    conf, path = write_inputs(tmp_path)
    if isinstance(space, str):
        pathlib.Path(path).write_text(space)
    else:
        pathlib.Path(path).write_text(json.dumps(space))
    code, out, err = run_search(["--conf", conf, "--space", path, "--root_dir", str(tmp_path / "o"), "--trials", "1"])
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()  # nothing started


@pytest.mark.parametrize("args, message", [
    (["--conf_param", "TrainerConfig.evaluate=False"], "the conf does not evaluate: set TrainerConfig.evaluate"),
    (["--conf_param", "PpoAlgorithm.lr=1e-3"], "binds a parameter of the search space; leave it to --space"),
    (["--pruner", "none", "--min_iterations", "4"], "with --pruner none it would do nothing"),
    (["--sampler", "random", "--pruner", "hyperband", "--startup_trials", "3"], "it would do nothing"),
    (["--parallel", "0"], "--parallel 0 must be >= 1"),
])
def test_bad_arguments_are_one_line(tmp_path, args, message):
    conf, space = write_inputs(tmp_path)
    code, out, err = run_search(["--conf", conf, "--space", space, "--root_dir", str(tmp_path / "o"),
                                 "--trials", "1", *args])
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_resuming_with_another_space_is_refused(searched, tmp_path):
    other = tmp_path / "space.json"
    other.write_text(json.dumps({"PpoAlgorithm.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}))
    code, out, err = run_search(["--conf", searched["conf"], "--space", str(other), "--root_dir",
                                 str(searched["out"]), "--trials", "5"])
    assert code == 2 and "is a search with another --space" in err and err.count("\n") == 1, err
    assert len(load(searched["out"]).trials) == 4


def test_list_choices_are_bound_as_tuples_and_checked_against_the_conf(tmp_path):
    conf, path = write_inputs(tmp_path, {"PpoAlgorithm.hidden_sizes": {"type": "categorical",
                                                                        "choices": [[64, 64], [32]]},
                                         "TrainerConfig.unroll_length": {"type": "int", "low": 4, "high": 16,
                                                                         "log": True}})
    space = read_space(path)
    hidden = space["PpoAlgorithm.hidden_sizes"]
    assert hidden.optuna_choices == ("(64, 64)", "(32,)")  # Optuna stores None, bools, numbers and strings only
    assert hidden.binding("(32,)") == "PpoAlgorithm.hidden_sizes=(32,)"
    assert space["TrainerConfig.unroll_length"].distribution() == optuna.distributions.IntDistribution(4, 16, log=True)
    check_space(space, conf, [])  # each choice and each end of the range loads with the conf
    # the conf's replay_buffer_length = 17 holds one unroll of 16 steps (plus one), not of 32: the high end is refused
    wider = {**space, "TrainerConfig.unroll_length": dataclasses.replace(space["TrainerConfig.unroll_length"], high=32)}
    with pytest.raises(ToolError, match=r"TrainerConfig.unroll_length=32 does not fit --conf .*replay_buffer_length"):
        check_space(wider, conf, [])


def test_without_optuna_the_search_names_its_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # what `import optuna` meets when it is not installed
    conf, space = write_inputs(tmp_path)
    code, out, err = run_search(["--conf", conf, "--space", space, "--root_dir", str(tmp_path / "o"), "--trials", "1"])
    assert code == 2 and err == "error: python -m alfish.tools.search needs optuna: pip install 'alfish[search]'\n"


def test_the_importance_plot_needs_complete_trials_that_differ(tmp_path):
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(0))
    study.optimize(lambda t: t.suggest_float("x", 0, 1) + 0.01 * t.suggest_categorical("c", [0, 1]), n_trials=1)
    assert "not written (1 complete trials; it needs 2)" in write_importance(str(tmp_path), study)
    study.optimize(lambda t: t.suggest_float("x", 0, 1) + 0.01 * t.suggest_categorical("c", [0, 1]), n_trials=5)
    assert write_importance(str(tmp_path), study) == f"importance plot: {tmp_path / 'importance.png'}"
    assert (tmp_path / "importance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

