"""The evaluation and checkpoint lifecycle, built on trainer callbacks: stop_value ends a run early (as finished), the
best checkpoint is the best evaluated policy (with async evaluation: the evaluated snapshot, not the parameters when
the result arrived), an evaluation at iteration 0, evaluation videos, the scalars CSV, timed checkpoints,
max_checkpoints_to_keep, warm start, the evaluate-only command reproducing training's records, and user callbacks.

Runs: PPO on CartPole-v1 at the shipped conf's settings (8 envs x 32 steps per iteration: 256 env steps), ~0.06 s per
iteration here; it first evaluates >= 400 around iteration 20."""
import json
import os
import re

import gin
import pytest
import torch

from alfish.bin import evaluate, play
from alfish.config import TrainerConfig, load_conf
from alfish.rundir.checkpoint import Checkpointer, CheckpointError
from alfish.trainer.build import build_trainer
from alfish.trainer.callbacks import TrainerCallback
from alfish.trainer.lifecycle import TimedCheckpoints, best_checkpointer
from tests.integration.inprocess import CONFS, eval_log, tb_scalars

pytestmark = [pytest.mark.timeout(120)]

PPO = (CONFS / "ppo_cartpole.gin").read_text() + """
TrainerConfig.num_env_steps = 0
TrainerConfig.num_iterations = 40
TrainerConfig.eval_interval = 5
TrainerConfig.num_checkpoints = 0
TrainerConfig.async_eval = False
Trainer.num_threads = 1
"""


def build(tmp_path, conf_text, params=(), name="run"):
    conf = tmp_path / f"{name}.gin"
    conf.write_text(conf_text)
    load_conf(str(conf), list(params))
    return build_trainer(TrainerConfig(root_dir=str(tmp_path / name)))


def train(tmp_path, conf_text, params=(), name="run"):
    try:
        trainer = build(tmp_path, conf_text, params, name)
        assert trainer.run() == 0
    finally:
        gin.clear_config()
    return trainer


def returns_by_iteration(root):
    return {r["iteration"]: r["average_return"] for r in eval_log(root)}


def test_stop_value_ends_the_run_at_the_evaluation_that_reached_it_with_a_final_checkpoint(tmp_path):
    trainer = train(tmp_path, PPO, ["Trainer.stop_value = 400", "TrainerConfig.num_checkpoints = 1"])
    log = eval_log(trainer.config.root_dir)
    reached = [r for r in log if r["average_return"] >= 400]
    assert reached and reached[0] is log[-1], log  # it stopped at the first evaluation that reached the value
    assert trainer.counters.iteration == log[-1]["iteration"] < 40
    assert Checkpointer(os.path.join(trainer.config.root_dir, "checkpoints")).steps() == [trainer.counters.iteration]


def test_without_stop_value_the_same_run_goes_on(tmp_path):
    trainer = train(tmp_path, PPO, ["TrainerConfig.num_iterations = 30"])
    assert trainer.counters.iteration == 30


def test_best_checkpoint_is_the_best_evaluated_policy_and_play_picks_it(tmp_path, capsys):
    trainer = train(tmp_path, PPO, ["TrainerConfig.num_checkpoints = 8"])  # one checkpoint per evaluation
    root = trainer.config.root_dir
    returns = returns_by_iteration(root)
    best_iteration = max(returns, key=lambda it: (returns[it], -it))  # the first of the best
    best = best_checkpointer(root).load_latest()
    assert best.meta["iteration"] == best_iteration
    assert best.meta["best"]["average_return"] == returns[best_iteration]
    assert sorted(best.tensors) == ["algorithm", "transformers"]  # weights only: not resumable
    same = Checkpointer(os.path.join(root, "checkpoints")).load(best_iteration).tensors["algorithm"]
    assert all(torch.equal(best.tensors["algorithm"][k], v) for k, v in same.items())
    capsys.readouterr()
    assert play.main(["--root_dir", root, "--best", "--num_episodes", "1"]) == 0
    assert f"checkpoints/best/ckpt-{best_iteration})" in capsys.readouterr().out


@pytest.mark.slow  # 10 s; the synchronous best-checkpoint tests stay in the default run
def test_with_async_evaluation_the_best_checkpoint_holds_the_evaluated_snapshot(tmp_path):
    # An evaluation takes up to ~1 s (1 ms a step, 2 episodes of up to 500 steps): its result arrives iterations after
    # its parameters were sent.
    trainer = train(tmp_path, PPO, [
        "TrainerConfig.async_eval = True", "TrainerConfig.num_checkpoints = 8",
        "eval/create_environment.env_name = 'alfish/Latency-v0'",
        "eval/create_environment.env_kwargs = {'env_name': 'CartPole-v1', 'latency_s': 0.001}",
        "TrainerConfig.num_eval_episodes = 2", "TrainerConfig.num_eval_environments = 2"])
    root = trainer.config.root_dir
    returns = returns_by_iteration(root)
    best = best_checkpointer(root).load_latest()
    best_iteration = best.meta["iteration"]
    assert returns[best_iteration] == max(returns.values())
    # the parameters of the evaluated iteration (its checkpoint), not those of a later iteration
    same = Checkpointer(os.path.join(root, "checkpoints")).load(best_iteration).tensors["algorithm"]
    assert all(torch.equal(best.tensors["algorithm"][k], v) for k, v in same.items())
    later = Checkpointer(os.path.join(root, "checkpoints")).load(40).tensors["algorithm"]
    if best_iteration != 40:
        assert not all(torch.equal(best.tensors["algorithm"][k], v) for k, v in later.items())


def test_a_resumed_run_keeps_the_best_so_far(tmp_path):
    train(tmp_path, PPO, ["TrainerConfig.num_iterations = 25", "TrainerConfig.num_checkpoints = 1"])
    root = tmp_path / "run"
    first_best = best_checkpointer(str(root)).load_latest().meta["best"]["average_return"]
    train(tmp_path, PPO, ["TrainerConfig.num_checkpoints = 2"])
    returns = returns_by_iteration(root)
    best = best_checkpointer(str(root)).load_latest()
    assert best.meta["best"]["average_return"] == max(returns.values()) >= first_best
    assert len(os.listdir(root / "checkpoints" / "best")) == 1  # one best kept


def test_evaluation_at_iteration_0_videos_and_the_scalars_csv(tmp_path):
    imageio = pytest.importorskip("imageio.v2")
    trainer = train(tmp_path, PPO, ["TrainerConfig.num_iterations = 10", "Trainer.evaluate_at_start = True",
                                    "Trainer.eval_video_interval = 2", "Trainer.eval_video_format = 'gif'",
                                    "Trainer.scalars_csv = True", "TrainerConfig.summary_interval = 5"])
    root = trainer.config.root_dir
    assert [r["iteration"] for r in eval_log(root)] == [0, 5, 10]
    assert sorted(os.listdir(os.path.join(root, "videos"))) == ["eval-5.gif"]  # the 2nd of 3 evaluations
    frames = imageio.mimread(os.path.join(root, "videos", "eval-5.gif"))
    assert len(frames) >= 9 and frames[0].shape[-1] in (3, 4)  # a CartPole episode lasts >= 9 steps
    with open(os.path.join(root, "scalars.csv")) as f:
        header, *rows = f.read().splitlines()
    assert header == "step,tag,value,wall_time"
    csv_returns = [(int(s), float(v)) for s, tag, v, _ in (r.split(",") for r in rows) if tag == "eval/average_return"]
    assert csv_returns == [(s, pytest.approx(v)) for s, v in tb_scalars(root)["eval/average_return"]]
    assert any(r.split(",")[1] == "loss/total" for r in rows)


def test_eval_videos_and_stop_value_need_evaluation(tmp_path):
    try:
        with pytest.raises(ValueError, match=r"^Trainer.stop_value acts on evaluations, and "
                                             r"TrainerConfig.evaluate=False"):
            build(tmp_path, PPO, ["TrainerConfig.evaluate = False", "Trainer.stop_value = 100"])
    finally:
        gin.clear_config()


def test_timed_checkpoints_follow_the_clock():
    now = [100.0]
    timed = TimedCheckpoints(60.0, clock=lambda: now[0])
    assert not timed.wants_checkpoint()
    now[0] = 160.0
    assert timed.wants_checkpoint()
    timed.after_checkpoint(None, "ckpt")
    assert not timed.wants_checkpoint()
    now[0] = 219.0
    assert not timed.wants_checkpoint()


def test_timed_checkpoints_in_a_run_and_max_to_keep(tmp_path):
    # 1 ms per env step, 8 envs stepped in turn: an iteration takes >= 0.26 s, so a checkpoint every 0.5 s falls every
    # ~2 iterations; the run ends with one (num_checkpoints = 0: the timed ones ask for it), wherever the last timed
    # one fell (on a loaded machine, at iteration 11 once)
    trainer = train(tmp_path, PPO, [
        "create_environment.env_name = 'alfish/Latency-v0'",
        "create_environment.env_kwargs = {'env_name': 'CartPole-v1', 'latency_s': 0.001}",
        "TrainerConfig.num_iterations = 12", "TrainerConfig.evaluate = False", "Trainer.checkpoint_interval_s = 0.5",
        "Trainer.max_checkpoints_to_keep = 2"])
    kept = Checkpointer(os.path.join(trainer.config.root_dir, "checkpoints")).steps()
    assert len(kept) == 2 and kept[-1] == 12, kept  # the final one, and the timed one before it
    assert kept[0] < 12


def test_older_checkpoints_are_deleted_only_after_the_newest_verifies(tmp_path, monkeypatch):
    checkpointer = Checkpointer(str(tmp_path), max_to_keep=1)
    checkpointer.save(1, {"a": torch.zeros(2)}, {"iteration": 1})

    def unreadable(path, step):
        raise CheckpointError(f"checkpoint {path} does not verify")

    monkeypatch.setattr(Checkpointer, "_verify", staticmethod(unreadable))  # as if ckpt-2 read back damaged
    with pytest.raises(CheckpointError):
        checkpointer.save(2, {"a": torch.ones(2)}, {"iteration": 2})
    assert checkpointer.steps() == [1, 2]  # ckpt-1 was not deleted
    monkeypatch.undo()
    checkpointer.save(3, {"a": torch.ones(2)}, {"iteration": 3})
    assert checkpointer.steps() == [3]


def test_warm_start_from_another_run(tmp_path):
    teacher = train(tmp_path, PPO, ["TrainerConfig.num_checkpoints = 1"], name="teacher")
    final = eval_log(teacher.config.root_dir)[-1]["average_return"]
    assert final >= 150  # it learned (a random policy: ~20)
    student = train(tmp_path, PPO, [f"Trainer.warm_start_from = '{teacher.config.root_dir}'",
                                    "Trainer.evaluate_at_start = True", "TrainerConfig.num_iterations = 1"],
                    name="student")
    start = eval_log(student.config.root_dir)[0]
    assert start["iteration"] == 0  # before any training: the teacher's policy, far above a random one's ~20
    assert start["average_return"] >= 100, start
    fresh = train(tmp_path, PPO, ["Trainer.evaluate_at_start = True", "TrainerConfig.num_iterations = 1"],
                  name="fresh")
    assert eval_log(fresh.config.root_dir)[0]["average_return"] < 60  # the same conf without the warm start


def test_warm_start_errors_are_one_line(tmp_path):
    teacher = train(tmp_path, PPO, ["TrainerConfig.num_iterations = 5", "TrainerConfig.num_checkpoints = 1"],
                    name="teacher")
    for params, message in [
        ([f"Trainer.warm_start_from = '{tmp_path / 'nowhere'}'"], "is not a directory"),
        ([f"Trainer.warm_start_from = '{teacher.config.root_dir}'", "PpoAlgorithm.hidden_sizes = (32,)"],
         "does not fit this conf's networks"),
        ([f"Trainer.warm_start_from = '{teacher.config.root_dir}/checkpoints/best'",
          "Trainer.warm_start = 'weights_and_optimizer'"],
         re.escape("has no learner (a best checkpoint holds weights")),
    ]:
        try:
            trainer = build(tmp_path, PPO, params, name="student")
            with pytest.raises(CheckpointError, match=message):
                trainer.run()
        finally:
            gin.clear_config()


def test_evaluate_command_reproduces_trainings_records(tmp_path, capsys):
    trainer = train(tmp_path, PPO, ["TrainerConfig.num_iterations = 15", "TrainerConfig.num_checkpoints = 3"])
    root = trainer.config.root_dir
    assert evaluate.main(["--root_dir", root, "--all"]) == 0
    records = eval_log(os.path.join(root, "evaluations"))
    training = eval_log(root)
    assert [(r["iteration"], r["env_steps"], r["average_return"]) for r in records] == \
        [(r["iteration"], r["env_steps"], r["average_return"]) for r in training]
    scalars = tb_scalars(os.path.join(root, "evaluations"))
    assert [s for s, _ in scalars["eval/average_return"]] == [5, 10, 15]
    capsys.readouterr()
    assert evaluate.main(["--root_dir", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("error: no valid checkpoint under")


class CountingCallback(TrainerCallback):
    def __init__(self):
        self.calls = []

    def before_run(self, trainer):
        self.calls.append(("before_run", trainer.counters.iteration))

    def after_evaluation(self, trainer, evaluation):
        self.calls.append(("after_evaluation", evaluation.iteration))

    def after_checkpoint(self, trainer, path):
        self.calls.append(("after_checkpoint", os.path.basename(path)))

    def after_run(self, trainer):
        self.calls.append(("after_run", trainer.counters.iteration))


def test_a_users_callback_from_gin_sees_every_hook_in_order(tmp_path):
    callback = CountingCallback()
    gin.external_configurable(lambda: callback, "counting_callback")
    try:
        trainer = train(tmp_path, PPO, ["TrainerConfig.num_iterations = 10", "TrainerConfig.num_checkpoints = 1",
                                        "Trainer.callbacks = [@counting_callback()]"])
    finally:
        gin.clear_config()
    assert callback.calls == [("before_run", 0), ("after_evaluation", 5), ("after_evaluation", 10),
                              ("after_checkpoint", "ckpt-10"), ("after_run", 10)]
    assert trainer.counters.iteration == 10


@pytest.mark.slow  # a two-rank job (9 s); stop_value on one process stays in the default run
def test_stop_value_on_two_ranks_stops_both_at_the_same_iteration(tmp_path):
    import subprocess

    from tests.trainer.test_distributed import ENV, REPO, TORCHRUN, WORKER

    conf = tmp_path / "conf.gin"
    conf.write_text(PPO.replace("Trainer.num_threads = 1", "") + "Trainer.stop_value = 300\n")
    proc = subprocess.run(TORCHRUN + [WORKER, "train", str(tmp_path), str(conf), str(tmp_path / "root")], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    finished = [line for line in proc.stderr.splitlines() if "training finished" in line]
    assert len(finished) == 2, proc.stderr[-3000:]
    iterations = {line.split("training finished: ")[1].split()[0] for line in finished}
    assert len(iterations) == 1 and int(iterations.pop()) < 40, finished
    params = [torch.load(tmp_path / f"params-rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    assert all(torch.equal(params[0][k], params[1][k]) for k in params[0])
    assert json.loads((tmp_path / "root" / "eval_log.jsonl").read_text().splitlines()[-1])["average_return"] >= 300
