"""TrainerConfig.profiling, TrainerConfig.code_snapshots, Trainer.run_record and no_thread_env_for_conf: each writes
(or does not write) what it says."""
import json
import os
import pathlib
import re
import sys

import gin
import pytest

from alfish.config import TrainerConfig, load_conf
from alfish.trainer.build import build_trainer

CONF = """
create_environment.env_name = 'alfish/PointGoal-v0'
SacAlgorithm.hidden_sizes = (8, 8)
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.random_seed = 1
TrainerConfig.num_iterations = 10
TrainerConfig.unroll_length = 1
TrainerConfig.initial_collect_steps = 4
TrainerConfig.whole_replay_buffer_training = False
TrainerConfig.mini_batch_size = 8
TrainerConfig.mini_batch_length = 2
TrainerConfig.num_updates_per_train_iter = 1
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 0
"""


def run(tmp_path: pathlib.Path, params=(), conf: str = CONF, name: str = "run"):
    path = tmp_path / f"{name}.gin"
    path.write_text(conf)
    load_conf(str(path), list(params))
    try:
        trainer = build_trainer(TrainerConfig(root_dir=str(tmp_path / name), conf_file=str(path)))
    finally:
        gin.clear_config()
    assert trainer.run() == 0
    return tmp_path / name


def text_summaries(root: pathlib.Path) -> dict[str, str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(root / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    return {tag.removesuffix("/text_summary"): acc.Tensors(tag)[0].tensor_proto.string_val[0].decode()
            for tag in acc.Tags()["tensors"]}


def test_profiling_records_the_window_after_the_skipped_iterations(tmp_path):
    root = run(tmp_path, ["TrainerConfig.profiling=True", "Profiler.skip_iterations=2",
                          "Profiler.active_iterations=3"])
    assert sorted(os.listdir(root / "profile")) == ["top_ops-3-5.txt", "trace-3-5.json"]
    trace = json.loads((root / "profile" / "trace-3-5.json").read_text())
    assert any(e.get("name", "").startswith("aten::") for e in trace["traceEvents"])
    table = (root / "profile" / "top_ops-3-5.txt").read_text()
    assert table.startswith("# iterations 3-5 (3); sorted by self_cpu_time_total") and "aten::addmm" in table


def test_a_run_that_ends_inside_the_window_writes_what_it_recorded_and_profiling_off_writes_nothing(tmp_path):
    root = run(tmp_path, ["TrainerConfig.profiling=True", "TrainerConfig.num_iterations=4",
                          "Profiler.skip_iterations=2", "Profiler.active_iterations=5"])
    assert sorted(os.listdir(root / "profile")) == ["top_ops-3-4.txt", "trace-3-4.json"]
    assert not (run(tmp_path, name="off") / "profile").exists()


def test_code_snapshots_are_tensorboard_text_and_a_missing_file_fails_before_start(tmp_path):
    root = run(tmp_path, ["TrainerConfig.code_snapshots=['algorithms/sac.py']"])
    texts = text_summaries(root)
    assert "class SacAlgorithm" in texts["code/algorithms/sac.py"]
    with pytest.raises(ValueError, match="TrainerConfig.code_snapshots: 'no/such.py' is not a file"):
        run(tmp_path, ["TrainerConfig.code_snapshots=['no/such.py']"], name="missing")
    assert not (tmp_path / "missing").exists()  # refused before the root_dir was made


def test_the_run_record_traces_the_result_to_code_and_keeps_copies_off_the_import_path(tmp_path, monkeypatch):
    modules = tmp_path / "mods"
    modules.mkdir()
    (modules / "my_rl_env_for_record.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(modules))
    root = run(tmp_path, conf="import my_rl_env_for_record\n" + CONF)
    (record,) = (root / "run_record").iterdir()
    assert re.match(r"commit [0-9a-f]{40}\n", (record / "git.txt").read_text())
    assert (record / "git.diff").exists()
    packages = (record / "packages.txt").read_text().splitlines()
    assert any(line.startswith("torch==") for line in packages) and any(line.startswith("gin-config==")
                                                                         for line in packages)
    assert (record / "conf" / "run.gin").read_text().startswith("import my_rl_env_for_record")
    assert (record / "user_modules" / "my_rl_env_for_record.py.txt").read_text() == "VALUE = 1\n"
    assert not list(record.rglob("*.py"))  # copies are text, never importable modules
    sys.modules.pop("my_rl_env_for_record", None)
    assert not (run(tmp_path, ["Trainer.run_record=False"], name="off") / "run_record").exists()


def test_no_thread_env_for_conf_is_accepted_and_changes_nothing(tmp_path):
    assert TrainerConfig(root_dir=str(tmp_path), algorithm_ctor=object, no_thread_env_for_conf=True,
                         num_iterations=1).no_thread_env_for_conf is True
