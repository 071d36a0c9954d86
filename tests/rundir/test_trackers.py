"""Experiment trackers beside TensorBoard (``Trainer.trackers``; ``alfish/rundir/trackers/``), with the real libraries
and no network: W&B in offline mode (its run file read back record by record) and MLflow with a local file store
(read back with its client). A short PPO run on alfish/Chain-v0 (~1 s) gives both every TensorBoard scalar at the
same steps, the operative config, the run record and an evaluation video; a resume continues the same tracker runs;
a tracker that fails costs one warning and the run finishes; bad settings fail before training, in one line.

Measured here (wandb 0.31, mlflow-skinny 3.17): W&B's offline start (its wandb-core service process) ~0.6 s and its
finish ~0.2 s; MLflow's import ~1 s, its file store a few ms per call (its SQLite store needs ~7 s to create its
tables, hence the file store, which MLflow 3 allows with ``MLFLOW_ALLOW_FILE_STORE=true``).
"""
from __future__ import annotations

import glob
import json
import logging
import os
import struct
import sys

import gin
import pytest

from alfish.config import ConfError, TrainerConfig, load_conf
from alfish.rundir.trackers.run_ids import RUN_IDS_FILE, parse_run_ids, read_run_ids, write_run_ids
from alfish.trainer.build import build_trainer
from alfish.trainer.callbacks import TrainerCallback
from tests.integration.inprocess import tb_scalars

wandb = pytest.importorskip("wandb")
pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402
from wandb.proto import wandb_internal_pb2  # noqa: E402

pytestmark = [pytest.mark.timeout(120)]

PPO = """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 2
PpoAlgorithm.hidden_sizes = (8,)
TrainerConfig.algorithm_ctor = @PpoAlgorithm
Trainer.num_threads = 1
TrainerConfig.random_seed = 1
TrainerConfig.num_iterations = 4
TrainerConfig.unroll_length = 4
TrainerConfig.whole_replay_buffer_training = True
TrainerConfig.clear_replay_buffer = True
TrainerConfig.replay_buffer_length = 8
TrainerConfig.mini_batch_size = 4
TrainerConfig.mini_batch_length = 1
TrainerConfig.num_updates_per_train_iter = 1
TrainerConfig.summary_interval = 2
TrainerConfig.summarize_first_interval = False
TrainerConfig.evaluate = True
TrainerConfig.async_eval = False
TrainerConfig.eval_interval = 2
TrainerConfig.num_eval_episodes = 1
TrainerConfig.num_eval_environments = 1
TrainerConfig.num_checkpoints = 1
wandb_tracker.mode = 'offline'
wandb_tracker.project = 'alfish-tests'
mlflow_tracker.experiment_name = 'alfish-tests'
"""


@pytest.fixture
def stores(tmp_path, monkeypatch):
    """W&B offline under tmp_path (no login, no network), MLflow's file store under tmp_path."""
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "HOME"):
        os.makedirs(tmp_path / name.lower(), exist_ok=True)
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "MLFLOW_TRACKING_URI",
                 "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return tmp_path / "wandb_dir", "file:" + str(tmp_path / "mlruns")


def train(tmp_path, params, callback=None, name="run"):
    """Train ``PPO`` + ``params`` into ``tmp_path/name`` in this process; returns the root_dir."""
    conf = tmp_path / "ppo.gin"
    conf.write_text(PPO)
    try:
        load_conf(str(conf), list(params))
        trainer = build_trainer(TrainerConfig(root_dir=str(tmp_path / name), conf_file=str(conf)))
        if callback is not None:
            trainer.callbacks.callbacks.append(callback)
        assert trainer.run() == 0
    finally:
        gin.clear_config()
    return tmp_path / name


# ---------------------------------------------------------------------------------------- reading W&B's run file ----
def wandb_records(path) -> list:
    """The records of a W&B run file (``run-<id>.wandb``): a LevelDB-style log (a 7-byte header ':W&B', magic,
    version; then 32 KiB blocks of chunks, each with a CRC, a length and a type: full, first, middle, last)."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, block, payloads, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            payloads.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            payloads.append(pending + chunk)
    records = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def wandb_runs(wandb_dir) -> list[dict]:
    """Each offline W&B run folder's id, history rows and config, oldest first."""
    runs = []
    for path in sorted(glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb"))):
        run = {"dir": os.path.dirname(path), "history": [], "config": {}}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["id"] = record.run.run_id
                run["config"].update({u.key: json.loads(u.value_json) for u in record.run.config.update})
            elif kind == "config":
                run["config"].update({u.key: json.loads(u.value_json) for u in record.config.update})
            elif kind == "history":
                run["history"].append({"/".join(i.nested_key) or i.key: i.value_json for i in record.history.item})
        runs.append(run)
    return runs


def wandb_scalar(run: dict, tag: str) -> list[tuple[int, float]]:
    return [(int(row["step"]), float(row[tag])) for row in run["history"] if tag in row]


def mlflow_scalar(client, run_id, tag) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, tag))


# -------------------------------------------------------------------------------------------------- the tests ----
def test_both_trackers_get_the_scalars_config_run_record_and_video_and_a_resume_continues_their_runs(
        tmp_path, stores):
    wandb_dir, uri = stores
    params = ["Trainer.trackers = ['wandb', 'mlflow']", f"mlflow_tracker.tracking_uri = '{uri}'",
              "Trainer.eval_video_interval = 2", "Trainer.eval_video_format = 'gif'"]
    root = train(tmp_path, params)
    ids = json.loads((root / RUN_IDS_FILE).read_text())
    (first,) = wandb_runs(wandb_dir)
    assert first["id"] == ids["wandb"]["run_id"]
    client = MlflowClient(tracking_uri=uri)
    mlflow_id = ids["mlflow"]["run_id"]
    tb = tb_scalars(root)
    # every TensorBoard scalar, at TensorBoard's steps (env steps: 2 envs x 4 steps per iteration)
    assert tb["train/env_steps"] == [(2, 16.0), (4, 32.0)]
    for tag in ("train/env_steps", "loss/total", "eval/average_return", "eval_vs_env_steps/average_return"):
        assert wandb_scalar(first, tag) == [(s, pytest.approx(v)) for s, v in tb[tag]], tag
        assert mlflow_scalar(client, mlflow_id, tag) == [(s, pytest.approx(v)) for s, v in tb[tag]], tag
    assert {t for row in first["history"] for t in row} - {"step", "_step", "_timestamp", "_runtime"} >= set(tb)
    assert set(client.get_run(mlflow_id).data.metrics) == set(tb)
    # the operative config, as the run's config / parameters and as a file
    assert first["config"]["TrainerConfig.num_iterations"] == 4
    assert first["config"]["Trainer.trackers"] == ["wandb", "mlflow"]
    mlflow_run = client.get_run(mlflow_id)
    assert mlflow_run.data.params["TrainerConfig.num_iterations"] == "4"
    assert mlflow_run.data.params["TrainerConfig.algorithm_ctor"] == "@PpoAlgorithm"
    assert mlflow_run.info.status == "FINISHED" and mlflow_run.info.run_name == "run"
    operative = client.download_artifacts(mlflow_id, "config/operative.gin", str(tmp_path))
    assert "TrainerConfig.num_iterations = 4" in open(operative).read()
    assert "TrainerConfig.num_iterations = 4" in open(os.path.join(first["dir"], "files", "config",
                                                                   "operative.gin")).read()
    # the run record: git facts as tags, its files as artifacts
    (record,) = os.listdir(root / "run_record")
    recorded = sorted(os.listdir(root / "run_record" / record))
    assert "packages.txt" in recorded and "command.txt" in recorded
    artifacts = [os.path.basename(a.path) for a in client.list_artifacts(mlflow_id, f"run_record/{record}")]
    assert set(recorded) <= set(artifacts) | {"conf", "alfish_source", "user_modules"}
    assert os.path.isfile(os.path.join(first["dir"], "files", "run_record", record, "packages.txt"))
    if "git.txt" in recorded:  # (a checkout: the commit)
        commit = (root / "run_record" / record / "git.txt").read_text().split()[1]
        assert mlflow_run.data.tags["alfish.git_commit"] == commit == first["config"]["run_record"]["git_commit"]
        assert mlflow_run.data.tags["alfish.git_dirty"] in ("true", "false")
    # the evaluation video of the 2nd evaluation (iteration 4)
    assert os.listdir(root / "videos") == ["eval-4.gif"]
    assert [a.path for a in client.list_artifacts(mlflow_id, "videos")] == ["videos/eval-4.gif"]
    videos = [row for row in first["history"] if "eval/video/path" in row]
    assert len(videos) == 1 and videos[0]["step"] == "4"
    assert os.path.isfile(os.path.join(first["dir"], "files", json.loads(videos[0]["eval/video/path"])))

    # resume with more iterations: the same runs continue, from step 6
    train(tmp_path, params + ["TrainerConfig.num_iterations = 8"])
    assert json.loads((root / RUN_IDS_FILE).read_text()) == ids
    first_again, second = wandb_runs(wandb_dir)
    assert second["id"] == first["id"]  # (offline: a folder per start, the same run id; `wandb sync` joins them)
    tb = tb_scalars(root)
    assert [s for s, _ in tb["train/env_steps"]] == [2, 4, 6, 8]
    assert wandb_scalar(second, "train/env_steps") == [(6, 48.0), (8, 64.0)]
    assert mlflow_scalar(client, mlflow_id, "train/env_steps") == [(2, 16.0), (4, 32.0), (6, 48.0), (8, 64.0)]
    assert second["config"]["TrainerConfig.num_iterations"] == 8
    assert client.get_run(mlflow_id).data.params["TrainerConfig.num_iterations"] == "4"  # MLflow keeps the first
    assert "TrainerConfig.num_iterations = 8" in open(
        client.download_artifacts(mlflow_id, "config/operative.gin", str(tmp_path / "again"))).read()
    assert len(client.search_runs([client.get_run(mlflow_id).info.experiment_id])) == 1


class DeleteMlflowRun(TrainerCallback):
    """At iteration 2, deletes the run's MLflow run (as someone might in the UI): its next log raises."""

    def __init__(self, uri):
        self.uri = uri

    def after_iteration(self, trainer):
        if trainer.counters.iteration == 2:
            run_id = json.loads(open(os.path.join(trainer.config.root_dir, RUN_IDS_FILE)).read())["mlflow"]["run_id"]
            MlflowClient(tracking_uri=self.uri).delete_run(run_id)


def test_a_failing_tracker_costs_one_warning_and_the_run_finishes(tmp_path, stores, caplog):
    _, uri = stores
    # W&B online without an API key: its init fails (at once: no network is tried); MLflow's run is deleted after
    # the first summary, so its next log fails
    params = ["Trainer.trackers = ['wandb', 'mlflow']", f"mlflow_tracker.tracking_uri = '{uri}'",
              "wandb_tracker.mode = 'online'", "TrainerConfig.summary_interval = 1"]
    with caplog.at_level(logging.WARNING):
        root = train(tmp_path, params, DeleteMlflowRun(uri))
    # (pytest also captures loggers that do not propagate to the root, such as W&B's own "wandb" logger, which keeps
    # the traceback of its failed init in its debug.log; alfish's log.txt and stderr never see it)
    failures = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.split(".")[0] != "wandb"]
    assert len(failures) == 2, failures
    assert failures[0].startswith("tracker wandb failed and is disabled for the rest of the run (TensorBoard stays "
                                  "the record): UsageError: ")
    assert failures[1].startswith("tracker mlflow failed and is disabled")
    assert all("\n" not in f for f in failures)
    assert [s for s, _ in tb_scalars(root)["train/env_steps"]] == [1, 2, 3, 4]  # TensorBoard got everything
    run_id = json.loads((root / RUN_IDS_FILE).read_text())["mlflow"]["run_id"]
    history = mlflow_scalar(MlflowClient(tracking_uri=uri), run_id, "train/env_steps")
    assert history == [(1, 8.0), (2, 16.0)]  # logged until the run was deleted


def test_bad_tracker_settings_fail_before_training_in_one_line(tmp_path, stores, monkeypatch):
    conf = tmp_path / "ppo.gin"
    conf.write_text(PPO)
    try:
        with pytest.raises(ConfError, match=r"Trainer.trackers = \['wandb', 'tensorboardx'\]: expected .*one of "
                                            r"'wandb', 'mlflow'"):
            load_conf(str(conf), ["Trainer.trackers = ['wandb', 'tensorboardx']"])
    finally:
        gin.clear_config()
    monkeypatch.setitem(sys.modules, "mlflow", None)  # (Python's own "not installed": importing it fails)
    try:
        load_conf(str(conf), ["Trainer.trackers = ['mlflow']"])
        with pytest.raises(ValueError, match=r"^Trainer.trackers=\['mlflow'\] needs mlflow: pip install "
                                             r"'alfish\[mlflow\]'$"):
            build_trainer(TrainerConfig(root_dir=str(tmp_path / "run")))
    finally:
        gin.clear_config()
    assert not (tmp_path / "run" / "tb").exists()  # refused before anything was built


def test_run_options_refuse_an_unknown_or_repeated_tracker_name():
    from alfish.trainer.options import RunOptions

    with pytest.raises(ValueError, match=r"^Trainer.trackers: 'neptune' is not a tracker; the known ones are "
                                         r"'wandb', 'mlflow'"):
        RunOptions(trackers=["neptune"])
    with pytest.raises(ValueError, match=r"must be a list of tracker names, e.g. \['wandb'\]"):
        RunOptions(trackers="wandb")
    with pytest.raises(ValueError, match="names a tracker twice"):
        RunOptions(trackers=["mlflow", "mlflow"])
    assert RunOptions().trackers == ()


# --------------------------------------------------------------------- ROOT_DIR/trackers.json: untrusted input ----
def test_run_ids_round_trip_and_a_bad_file_is_one_warning_and_ignored(tmp_path, caplog):
    write_run_ids(str(tmp_path), {"mlflow": "0123abcd", "wandb": "x1y2-z_3"})
    assert read_run_ids(str(tmp_path)) == {"wandb": "x1y2-z_3", "mlflow": "0123abcd"}
    assert read_run_ids(str(tmp_path / "none")) == {}
    bad = {
        "not json": b"{'wandb': 1}",
        "a list": b"[1, 2]",
        "unknown tracker": b'{"neptune": {"run_id": "a"}}',
        "id with a slash": b'{"wandb": {"run_id": "../../etc"}}',
        "id a number": b'{"mlflow": {"run_id": 12}}',
        "too deep": b"[" * 100 + b"]" * 100,
        "too large": b'{"wandb": {"run_id": "' + b"a" * (70 << 10) + b'"}}',
    }
    for what, raw in bad.items():
        (tmp_path / RUN_IDS_FILE).write_bytes(raw)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert read_run_ids(str(tmp_path)) == {}, what
        assert len(caplog.records) == 1 and "the trackers start new runs" in caplog.records[0].getMessage(), what
    (tmp_path / RUN_IDS_FILE).unlink()
    (tmp_path / "elsewhere.json").write_text('{"wandb": {"run_id": "abc"}}')
    os.symlink(tmp_path / "elsewhere.json", tmp_path / RUN_IDS_FILE)
    with caplog.at_level(logging.WARNING):
        assert read_run_ids(str(tmp_path)) == {}  # a symlink is not followed
    with pytest.raises(ValueError, match="run_id must be"):
        parse_run_ids({"wandb": {"run_id": ""}})
