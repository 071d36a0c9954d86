"""``python -m alfish.bin.export``: a trained policy as a ``.pt2`` (torch.export) or ONNX program that maps raw
observations to play's greedy action, data transformers included with frozen statistics.

Tiny runs are trained in this process (SAC on alfish/PointGoal-v0 with an ObservationNormalizer, DQN on
alfish/Chain-v0, recurrent PPO with a GRU on alfish/MemoryCue-v0). The exported files are checked here independently
of the command's own check: loaded as a deployment would load them, and compared with the policy that play restores
from the same results directory.
"""
import argparse
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import gin
import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.bin import export, play, stored_run
from alfish.data.types import StepType, TimeStep
from alfish.envs.spec import EnvSpec
from alfish.export.formats import load_program
from alfish.export.policy_module import ExportedPolicy
from alfish.export.verify import ReferencePolicy, check_sampled
from alfish.rundir.checkpoint import Checkpointer

from .inprocess import REPO, run_trainer_from_text
from .test_collect import DQN_CHAIN, SAC_POINT_GOAL
from .test_recurrent_learning import RECURRENT_PPO_MEMORY_CUE

NORMALIZED_SAC = SAC_POINT_GOAL + "TrainerConfig.data_transformer_ctor = [@ObservationNormalizer]\n"
# 15 iterations: the GRU policy answers the cue by then (return 1 on every greedy episode, seed 0, ~2 s here).
RECURRENT_PPO = RECURRENT_PPO_MEMORY_CUE.replace("num_iterations = 24", "num_iterations = 15").replace(
    "num_checkpoints = 0", "num_checkpoints = 1").replace("TrainerConfig.evaluate = True",
                                                          "TrainerConfig.evaluate = False")
TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def clear_gin():
    yield
    gin.clear_config()  # export leaves the stored config parsed, as a CLI may


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, pathlib.Path]:
    work = tmp_path_factory.mktemp("runs")
    try:
        return {"sac": run_trainer_from_text(work, NORMALIZED_SAC, name="sac"),
                "dqn": run_trainer_from_text(work, DQN_CHAIN, name="dqn"),
                "rppo": run_trainer_from_text(work, RECURRENT_PPO, name="rppo")}
    finally:
        gin.clear_config()


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory) -> dict[tuple[str, str], pathlib.Path]:
    """Every run exported to both formats by the command (in this process), keyed by (run, format)."""
    out_dir = tmp_path_factory.mktemp("exported")
    files = {}
    formats = ["pt2"] + (["onnx"] if has_module("onnxscript") else [])  # (the onnx tests skip without it)
    for name, root in runs.items():
        for fmt in formats:
            out = out_dir / f"{name}.{fmt}"
            assert export.main(["--root_dir", str(root), "--format", fmt, "--out", str(out)]) == 0
            gin.clear_config()
            files[(name, fmt)] = out
    return files


def restored(root: pathlib.Path):
    """The policy play restores from ``root``: (env of one copy, transformer, algorithm)."""
    ckpt = stored_run.load_checkpoint(str(root), None)
    config = stored_run.load_stored_config(str(root), ckpt, ("alfish",))
    env = play.create_env(argparse.Namespace(render=False, record_file=None, seed=0), ("alfish",))
    transformer, algorithm = stored_run.restore_policy(config, env, ckpt)
    return env, transformer, algorithm


def has_module(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def runner(exported: dict, name: str, fmt: str):
    """Run ``name``'s exported ``fmt`` file, loaded as a deployment would (the ONNX tests skip without the export
    extra)."""
    if fmt == "onnx":
        pytest.importorskip("onnxscript")
        pytest.importorskip("onnxruntime")
    return load_program(str(exported[(name, fmt)]), fmt)


def play_action(transformer, algorithm, observation: torch.Tensor) -> np.ndarray:
    """play's greedy action for a batch of observations (MID steps) of a stateless policy, clipped as the env clips
    it."""
    n = observation.shape[0]
    time_step = TimeStep(step_type=torch.full((n,), StepType.MID, dtype=torch.int8), reward=torch.zeros(n),
                         discount=torch.ones(n), observation=observation, prev_action=torch.zeros(n),
                         env_id=torch.arange(n))
    with torch.inference_mode():
        action = algorithm.predict_step(transformer.rollout_view(update_stats=False)(time_step)).output
    space = algorithm.action_space
    return action.numpy() if isinstance(space, gym.spaces.Discrete) else np.clip(action.numpy(), space.low, space.high)


# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
@pytest.mark.parametrize("name", ["sac", "dqn"])
def test_program_equals_the_torch_policy_with_batches_of_1_and_1000(runs, exported, name, fmt):
    run = runner(exported, name, fmt)
    env, transformer, algorithm = restored(runs[name])
    env.observation_space.seed(123)
    observations = torch.as_tensor(np.stack([env.observation_space.sample() for _ in range(1000)]))
    want = play_action(transformer, algorithm, observations)
    for batch in (1, 1000):  # one program, the batch dimension dynamic
        (got,) = run([observations[:batch].numpy()])
        assert got.shape == want[:batch].shape and got.dtype.kind == want.dtype.kind
        np.testing.assert_allclose(got, want[:batch], rtol=0, atol=TOLERANCE)
    env.close()


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_observation_normalizer_is_inside_the_program(runs, exported, fmt):
    """The statistics are the checkpoint's (not a fresh normalizer's) and they change the action."""
    run = runner(exported, "sac", fmt)
    env, transformer, algorithm = restored(runs["sac"])
    stats = transformer.transformers[0].stats
    assert float(stats.count) > 10 and abs(float(stats.mean[0]) - 0.0) > 0.1  # PointGoal starts at x = 0.8
    observations = torch.linspace(-2, 2, 1000).unsqueeze(1)
    (got,) = run([observations.numpy()])
    np.testing.assert_allclose(got, play_action(transformer, algorithm, observations), rtol=0, atol=TOLERANCE)
    without_normalizer = play_action(type(transformer)([]), algorithm, observations)
    assert np.abs(got - without_normalizer).max() > 1e-3
    env.close()


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
@pytest.mark.parametrize("name", ["sac", "dqn", "rppo"])
def test_program_acts_as_play_on_a_rollout(runs, exported, name, fmt):
    """play's loop steps the env; the program sees each observation with the state it returned the step before,
    reset to zeros at each episode's first step, as the README tells a caller to do."""
    run = runner(exported, name, fmt)
    env, transformer, algorithm = restored(runs[name])
    view = transformer.rollout_view(update_stats=False)
    info = json.loads(pathlib.Path(f"{exported[(name, fmt)]}.json").read_text())
    zeros = [np.zeros([1] + s["shape"][1:], np.float32) for s in info["outputs"][1:]]
    program_state, state = zeros, algorithm.initial_state(1)
    time_step, returns, episode_return = env.reset(seed=5), [], 0.0
    for _ in range(60):
        if int(time_step.step_type[0]) == StepType.FIRST:
            program_state = zeros
        with torch.inference_mode():
            seen = view(time_step)
            alg_step = algorithm.predict_step(seen, algorithm.reset_state(state, seen.step_type))
        action, state = alg_step.output, alg_step.state
        got, *program_state = run([time_step.observation.numpy(), *program_state])
        space = algorithm.action_space
        want = action.numpy() if algorithm.discrete else np.clip(action.numpy(), space.low, space.high)
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE)
        time_step = env.step(action)
        episode_return += float(time_step.reward[0])
        if int(time_step.step_type[0]) == StepType.LAST:
            returns.append(episode_return)
            episode_return = 0.0
    env.close()
    if name == "rppo":  # the cue is visible at the first step only: answering it needs the carried state
        assert len(returns) >= 8 and returns == [1.0] * len(returns), returns


def test_sidecar_json_and_recurrent_state(exported, runs):
    info = json.loads(pathlib.Path(f"{exported[('rppo', 'pt2')]}.json").read_text())
    assert info["format"] == "pt2" and info["recurrent"] is True
    assert info["inputs"] == [{"name": "observation", "shape": ["batch", 2], "dtype": "float32"},
                              {"name": "state", "shape": ["batch", 16], "dtype": "float32"}]
    assert [o["name"] for o in info["outputs"]] == ["action", "next_state"]
    assert info["action_space"] == {"type": "Discrete", "n": 2, "start": 0}
    assert info["checkpoint"]["step"] == 15 and info["checkpoint"]["path"].endswith("ckpt-15")
    assert info["versions"]["alfish"] and info["export_seconds"] > 0
    assert [r["count"] for r in info["check"]["results"]] == [1000, 200]
    assert all(v <= TOLERANCE for r in info["check"]["results"] for v in r["max_abs_diff"].values())
    sac = json.loads(pathlib.Path(f"{exported[('sac', 'pt2')]}.json").read_text())
    assert sac["action_space"] == {"type": "Box", "shape": [1], "dtype": "float32", "low": [-1.0], "high": [1.0]}
    assert sac["observation_space"]["shape"] == [1] and sac["recurrent"] is False and sac["state"] is None


def test_onnx_file_is_a_valid_model_with_named_dynamic_inputs(exported):
    pytest.importorskip("onnxscript")
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    path = str(exported[("rppo", "onnx")])
    onnx.checker.check_model(onnx.load(path), full_check=True)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape, i.type) for i in session.get_inputs()] == [
        ("observation", ["batch", 2], "tensor(float)"), ("state", ["batch", 16], "tensor(float)")]
    assert [o.name for o in session.get_outputs()] == ["action", "next_state"]


def test_the_check_catches_a_program_of_another_policy(runs, exported):
    """check_sampled against a policy whose weights differ from the program's reports the difference."""
    env, transformer, algorithm = restored(runs["sac"])
    with torch.no_grad():
        for p in algorithm.parameters():
            p.add_(0.5)
    policy = ExportedPolicy(transformer, algorithm, EnvSpec.of(env))
    result = check_sampled(policy, ReferencePolicy(transformer, algorithm, env.action_space),
                           runner(exported, "sac", "pt2"), env.observation_space, 100, seed=0)
    assert result.worst > 1e-2, result
    env.close()


# ---------------------------------------------------------------------------------------------------- errors ----
def export_error(capsys, *args: str, code: int = 2) -> str:
    """export's main in this process; asserts it failed with ``code`` and returns its one error line."""
    assert export.main([str(a) for a in args]) == code
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("error: "), line
    assert "wrote" not in captured.out
    return line


def test_bad_format_and_out_are_one_line(runs, tmp_path, capsys):
    root = runs["dqn"]
    assert export_error(capsys, "--root_dir", root, "--format", "tflite") == (
        "error: --format 'tflite' is not one of pt2, onnx")
    assert export_error(capsys, "--root_dir", root) == "error: --format is required: pt2 or onnx"
    assert export_error(capsys, "--root_dir", root, "--format", "pt2", "--out", tmp_path / "p.onnx") == (
        f"error: --out {str(tmp_path / 'p.onnx')!r} must end with .pt2 for --format pt2")


def test_missing_export_packages_are_one_line(runs, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # what Python does for a module that is not installed
    assert export_error(capsys, "--root_dir", runs["dqn"], "--format", "onnx") == (
        "error: --format onnx needs the onnx package, which is not installed: pip install 'alfish[export]'")


def test_onnx_without_onnxruntime_is_written_and_the_check_skipped(runs, tmp_path, capsys, monkeypatch):
    pytest.importorskip("onnxscript")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    out = tmp_path / "p.onnx"
    assert export.main(["--root_dir", str(runs["dqn"]), "--format", "onnx", "--out", str(out)]) == 0
    assert "check skipped: onnxruntime is not installed" in capsys.readouterr().out
    assert out.stat().st_size > 0
    assert json.loads(pathlib.Path(f"{out}.json").read_text())["check"] == {"tolerance": 1e-5, "skipped": True,
                                                                            "results": []}


def copy_run(root: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    shutil.copytree(root, dest)
    return dest


def test_corrupted_checkpoint_is_one_line(runs, tmp_path, capsys):
    root = copy_run(runs["dqn"], tmp_path / "run")
    (step,) = Checkpointer(str(root / "checkpoints")).steps()
    algorithm_pt = root / "checkpoints" / f"ckpt-{step}" / "algorithm.pt"
    algorithm_pt.write_bytes(algorithm_pt.read_bytes()[:-10] + b"0123456789")
    line = export_error(capsys, "--root_dir", root, "--format", "pt2", "--checkpoint_step", step)
    assert "algorithm.pt" in line and "sha256" in line, line
    # the newest checkpoint by default: the checkpointer logs which file failed, then this error
    assert export_error(capsys, "--root_dir", root, "--format", "pt2") == (
        f"error: no valid checkpoint under {root}/checkpoints; train first (python -m alfish.bin.train --root_dir "
        f"{root} ...)")
    assert not (root / "export").exists()


def test_frame_stacker_is_refused_naming_it(tmp_path, capsys):
    root = run_trainer_from_text(tmp_path, SAC_POINT_GOAL + "TrainerConfig.data_transformer_ctor = [@FrameStacker]\n")
    gin.clear_config()
    line = export_error(capsys, "--root_dir", root, "--format", "pt2")
    assert line.startswith("error: data transformer FrameStacker keeps a per-env state in the rollout view"), line
    assert not (root / "export").exists()


def tamper(root: pathlib.Path, operative_config: str) -> None:
    """Replaces the stored config and re-seals the manifest, as an attacker who controls the directory would."""
    (step,) = Checkpointer(str(root / "checkpoints")).steps()
    path = root / "checkpoints" / f"ckpt-{step}"
    meta = json.loads((path / "meta.json").read_text())
    meta["operative_config"] = operative_config
    data = json.dumps(meta).encode()
    (path / "meta.json").write_bytes(data)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["meta.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.cli
@pytest.mark.timeout(120)
def test_cli_exports_and_refuses_an_untrusted_import(runs, tmp_path):
    """Real processes: a pt2 export (exit 0, the checks printed) and, from a copy whose stored config imports a
    module, exit 2 with one line, the module never imported."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    out = tmp_path / "policy.pt2"
    proc = subprocess.run([sys.executable, "-m", "alfish.bin.export", "--root_dir", str(runs["sac"]), "--format",
                           "pt2", "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("exported ") and " as pt2 in " in lines[0], proc.stdout
    assert lines[1].startswith("check: 1000 sampled observations: max abs diff action ")
    assert lines[2].startswith("check: rollout of 200 steps in alfish/PointGoal-v0: max abs diff action ")
    assert lines[3] == f"wrote {out} and {out}.json"
    (action,) = torch.export.load(str(out)).module()(torch.zeros(3, 1))  # a tuple: (action, *next_state)
    assert action.shape == (3, 1)

    root = copy_run(runs["sac"], tmp_path / "evil")
    (tmp_path / "export_test_marker.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    (step,) = Checkpointer(str(root / "checkpoints")).steps()
    meta = json.loads((root / "checkpoints" / f"ckpt-{step}" / "meta.json").read_text())
    tamper(root, "import export_test_marker\n" + meta["operative_config"])
    proc = subprocess.run([sys.executable, "-m", "alfish.bin.export", "--root_dir", str(root), "--format", "onnx"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line == (f"error: {root}/checkpoints/ckpt-{step}/meta.json[operative_config]:1: import of module "
                    "'export_test_marker' is not allowed in a stored config (trusted: 'alfish'); if you trust that "
                    "module, pass --allow_import export_test_marker")
    assert not (tmp_path / "imported").exists() and not (root / "export").exists()


def test_bad_allow_import_is_one_line(runs, capsys):
    assert export_error(capsys, "--root_dir", runs["dqn"], "--format", "pt2", "--allow_import", "my-envs").startswith(
        "error: --allow_import 'my-envs' is not a module name")


def test_best_exports_the_best_evaluated_policy(tmp_path, capsys):
    """--best reads RUN/checkpoints/best (kept by runs that evaluate); a run without one is a one-line error."""
    root = run_trainer_from_text(tmp_path, RECURRENT_PPO_MEMORY_CUE.replace("num_iterations = 24",
                                                                            "num_iterations = 6"), name="evaluated")
    out = tmp_path / "best.pt2"
    assert export.main(["--root_dir", str(root), "--format", "pt2", "--best", "--out", str(out)]) == 0
    record = json.loads(out.with_name("best.pt2.json").read_text())
    assert "/checkpoints/best/ckpt-" in record["checkpoint"]["path"], record["checkpoint"]
    capsys.readouterr()
    no_best = run_trainer_from_text(tmp_path, RECURRENT_PPO, name="unevaluated")
    assert export_error(capsys, "--root_dir", no_best, "--format", "pt2", "--best").startswith(
        "error: no best checkpoint under")
