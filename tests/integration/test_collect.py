"""``python -m alfish.bin.collect``: datasets rolled out from a results directory (its trained policy, or a random one)
or exported from its saved replay buffer, in alfish's step convention, read back by the offline loaders.

Tiny runs are trained in this process (SAC on alfish/PointGoal-v0, DQN on alfish/Chain-v0, a few dozen env steps);
collect runs in this process through ``main(argv)``, and in subprocesses where its exit status and stderr are tested.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import gin
import numpy as np
import pytest

from alfish.bin import collect
from alfish.config import TrainerConfig, load_conf
from alfish.data.types import StepType
from alfish.replay.offline.alfish_format import read_dataset
from alfish.replay.offline.from_run import read_run
from alfish.replay.offline.sources import load_offline_data
from alfish.replay.offline.steps import check_steps
from alfish.rundir.config_files import write_config_record

from .inprocess import OFF_POLICY_POINT_GOAL, REPO

pytestmark = [pytest.mark.cli]

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
FIELDS = ("step_type", "reward", "discount", "observation", "action")

# SAC on PointGoal: 10 random warm-up steps, then 30 iterations of one step and one update; one checkpoint.
SAC_POINT_GOAL = OFF_POLICY_POINT_GOAL.replace("num_env_steps = 1500", "num_env_steps = 40").replace(
    "initial_collect_steps = 100", "initial_collect_steps = 10").replace(
    "mini_batch_size = 128", "mini_batch_size = 8").replace(
    "num_checkpoints = 0", "num_checkpoints = 1") + """
SacAlgorithm.hidden_sizes = (8, 8)
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.evaluate = False
"""
# DQN on Chain (Discrete actions, episodes that terminate at the goal), 2 envs; one checkpoint.
DQN_CHAIN = SAC_POINT_GOAL.replace("alfish/PointGoal-v0", "alfish/Chain-v0").replace(
    "num_parallel_environments = 1", "num_parallel_environments = 2").replace(
    "SacAlgorithm.hidden_sizes", "DqnAlgorithm.hidden_sizes").replace("@SacAlgorithm", "@DqnAlgorithm")


def train(tmp_path: pathlib.Path, conf_text: str, name: str) -> pathlib.Path:
    """What ``python -m alfish.bin.train`` does, in this process: build, write the config record, run."""
    from alfish.trainer.build import build_trainer

    conf, root = tmp_path / f"{name}.gin", tmp_path / name
    conf.write_text(conf_text)
    load_conf(str(conf), [])
    try:
        trainer = build_trainer(TrainerConfig(root_dir=str(root)))
        write_config_record(str(root))
        assert trainer.run() == 0
    finally:
        gin.clear_config()
    return root


@pytest.fixture(scope="module")
def sac_run(tmp_path_factory) -> pathlib.Path:
    return train(tmp_path_factory.mktemp("sac"), SAC_POINT_GOAL, "run")


@pytest.fixture(scope="module")
def dqn_run(tmp_path_factory) -> pathlib.Path:
    return train(tmp_path_factory.mktemp("dqn"), DQN_CHAIN, "run")


@pytest.fixture(scope="module")
def run_without_checkpoints(sac_run, tmp_path_factory) -> pathlib.Path:
    """The SAC run with its checkpoints removed: only config/operative.gin (and TensorBoard events) are left."""
    root = tmp_path_factory.mktemp("nockpt") / "run"
    shutil.copytree(sac_run, root)
    shutil.rmtree(root / "checkpoints")
    return root


@pytest.fixture(autouse=True)
def clear_gin():
    yield
    gin.clear_config()  # collect leaves the stored config parsed, as a CLI may


def run_collect(capsys, *args) -> str:
    """collect's main in this process; asserts it succeeded and returns its one summary line."""
    rc = collect.main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return lines[0]


def episodes(step_type: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) index of each episode."""
    return list(zip(np.flatnonzero(step_type == F).tolist(), np.flatnonzero(step_type == L).tolist()))


def assert_same_steps(a, b) -> None:
    for key in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(a, key)), np.asarray(getattr(b, key)), err_msg=key)


def assert_point_goal_steps(steps) -> None:
    """PointGoal's dynamics tie each step to the one before: the reward and observation of a non-FIRST step follow
    from the previous observation and action (x += 0.25 a, reward -|x|), so fields cannot be shifted by a step."""
    obs, act, st = steps.observation[:, 0], steps.action[:, 0], steps.step_type
    assert np.all(obs[st == F] == np.float32(0.8)) and np.all(steps.reward[st == F] == 0)
    follows = st[1:] != F
    expected = np.clip(obs[:-1] + 0.25 * act[:-1], -2, 2)
    np.testing.assert_allclose(obs[1:][follows], expected[follows], atol=1e-6)
    np.testing.assert_allclose(steps.reward[st != F], -np.abs(obs[st != F]), atol=1e-6)
    assert np.all(act[st == L] == 0)  # the env ignores a LAST step's action
    assert np.all(np.abs(act) <= 1)


# (a) ---------------------------------------------------------------------------------------------------------------
def test_random_collection_needs_no_checkpoint_and_stores_whole_episodes_cut_as_a_truncation(
        run_without_checkpoints, tmp_path, capsys):
    out = tmp_path / "random"
    line = run_collect(capsys, "--root_dir", run_without_checkpoints, "--num_steps", 50, "--random", "--out", out)
    assert line.startswith(f"wrote 50 steps, 5 episodes to {out} (alfish); mean return ")
    assert ("over 4 complete episodes, 1 cut at the step budget; a uniformly random policy in alfish/PointGoal-v0 x 1"
            in line)
    steps = read_dataset(out)
    check_steps(steps)
    assert len(steps) == 50 and steps.num_episodes == 5
    spans = episodes(steps.step_type)
    assert [last - first + 1 for first, last in spans] == [11, 11, 11, 11, 6]  # 10 transitions + LAST; the cut one
    assert steps.step_type.tolist() == ([F] + [M] * 9 + [L]) * 4 + [F] + [M] * 4 + [L]
    assert np.all(steps.discount == 1)  # PointGoal never terminates: time-limit LASTs and the cut end bootstrap
    assert steps.step_type[-1] == L
    assert_point_goal_steps(steps)
    assert steps.observation.dtype == np.float32 and steps.action.dtype == np.float32
    assert steps.observation_space.shape == (1,) and steps.action_space.shape == (1,)
    meta = json.loads((out / "dataset.json").read_text())
    assert meta["source"] == f"alfish.bin.collect {run_without_checkpoints}"
    returns = [steps.reward[first:last + 1].sum() for first, last in spans[:4]]
    assert f"mean return {np.mean(returns):.2f} over 4 complete episodes" in line
    assert_same_steps(load_offline_data(str(out)), steps)  # it loads as offline data


def test_several_envs_store_their_episodes_env_after_env_and_a_lone_reset_step_is_left_out(
        run_without_checkpoints, tmp_path, capsys):
    out = tmp_path / "two_envs"
    run_collect(capsys, "--root_dir", run_without_checkpoints, "--num_steps", 50, "--num_envs", 2, "--random",
                "--out", out)
    steps = read_dataset(out)
    per_env = ([F] + [M] * 9 + [L]) * 2 + [F, M, L]  # 25 steps each: two whole episodes, then a cut one
    assert steps.step_type.tolist() == per_env * 2
    assert_point_goal_steps(steps)
    # 23 steps over 2 envs: env 0's 12th step would be the FIRST of a new episode, which holds no transition
    out = tmp_path / "lone_first"
    line = run_collect(capsys, "--root_dir", run_without_checkpoints, "--num_steps", 23, "--num_envs", 2, "--random",
                       "--out", out)
    steps = read_dataset(out)
    assert steps.step_type.tolist() == ([F] + [M] * 9 + [L]) * 2
    assert "wrote 22 steps, 2 episodes" in line and "0 cut at the step budget" in line


# (b) ---------------------------------------------------------------------------------------------------------------
def test_greedy_collection_is_reproducible_and_epsilon_samples_depend_on_the_seed(sac_run, tmp_path, capsys):
    datasets = {}
    for name, flags in {"greedy1": [], "greedy2": [], "eps1": ["--epsilon_greedy", 0.5],
                        "eps2": ["--epsilon_greedy", 0.5], "eps_seed": ["--epsilon_greedy", 0.5, "--seed", 3]}.items():
        line = run_collect(capsys, "--root_dir", sac_run, "--num_steps", 30, "--out", tmp_path / name, *flags)
        assert f"the policy of {sac_run}/checkpoints/ckpt-" in line
        datasets[name] = read_dataset(tmp_path / name)
    assert_same_steps(datasets["greedy1"], datasets["greedy2"])
    assert (tmp_path / "greedy1" / "dataset.json").read_text() == (tmp_path / "greedy2" / "dataset.json").read_text()
    assert_same_steps(datasets["eps1"], datasets["eps2"])
    assert not np.array_equal(datasets["eps1"].action, datasets["greedy1"].action)
    assert not np.array_equal(datasets["eps1"].action, datasets["eps_seed"].action)
    for steps in datasets.values():
        assert_point_goal_steps(steps)
        assert steps.step_type.tolist() == ([F] + [M] * 9 + [L]) * 2 + [F] + [M] * 6 + [L]


def test_discrete_actions_and_terminations_from_a_dqn_run_with_several_envs(dqn_run, tmp_path, capsys):
    out = tmp_path / "chain"
    run_collect(capsys, "--root_dir", dqn_run, "--num_steps", 60, "--num_envs", 2, "--epsilon_greedy", 1.0,
                "--out", out)
    steps = read_dataset(out)
    check_steps(steps)
    # 30 steps per env, env 0's then env 1's; an env whose 30th step is the FIRST of a new episode keeps 29
    env0 = 30 if steps.step_type[29] == L else 29
    assert steps.step_type[env0 - 1] == L and steps.step_type[env0] == F and len(steps) - env0 in (29, 30)
    assert steps.action.dtype == np.int64 and steps.action.shape == (len(steps),)
    assert set(steps.action.tolist()) <= {0, 1}
    cell = steps.observation.argmax(1)
    st = steps.step_type
    follows = st[1:] != F
    moved = np.clip(cell[:-1] + np.where(steps.action[:-1] == 1, 1, -1), 0, 4)
    np.testing.assert_array_equal(cell[1:][follows], moved[follows])  # each action moved the agent one cell
    goal = (cell == 4) & (st != F)
    np.testing.assert_array_equal(st[goal], L)  # reaching the goal ends the episode ...
    np.testing.assert_array_equal(steps.discount[goal], 0)  # ... as a termination
    np.testing.assert_array_equal(steps.reward[goal], 1.0)
    assert np.all(steps.discount[~goal] == 1)
    assert goal.any()  # (uniform actions reach the goal of a 5-cell chain within 60 steps)
    assert np.all(steps.action[st == L] == 0)


# (c) ---------------------------------------------------------------------------------------------------------------
def test_from_replay_exports_the_saved_buffer_as_read_run_reads_it(sac_run, tmp_path, capsys):
    out = tmp_path / "replay"
    line = run_collect(capsys, "--root_dir", sac_run, "--from_replay", "--out", out)
    expected = read_run(sac_run)
    steps = read_dataset(out)
    assert_same_steps(steps, expected)
    assert steps.num_episodes == expected.num_episodes
    assert steps.observation_space == expected.observation_space and steps.action_space == expected.action_space
    assert line.startswith(f"wrote {len(expected)} steps, {expected.num_episodes} episodes to {out} (alfish)")
    # --num_steps keeps the first steps; the cut episode ends as a truncation (LAST, discount kept)
    run_collect(capsys, "--root_dir", sac_run, "--from_replay", "--num_steps", 16, "--out", tmp_path / "head")
    head = read_dataset(tmp_path / "head")
    assert len(head) == 16 and head.step_type[-1] == L and head.discount[-1] == 1
    for key in ("reward", "discount", "observation", "action"):
        np.testing.assert_array_equal(getattr(head, key), getattr(expected, key)[:16], err_msg=key)
    # a cut on the FIRST step of an episode leaves that step out (it holds no transition)
    assert expected.step_type[11] == F
    run_collect(capsys, "--root_dir", sac_run, "--from_replay", "--num_steps", 12, "--out", tmp_path / "first")
    assert read_dataset(tmp_path / "first").step_type.tolist() == [F] + [M] * 9 + [L]


# (d) ---------------------------------------------------------------------------------------------------------------
def collect_subprocess(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "alfish.bin.collect", *map(str, args)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert proc.stdout == ""
    return lines[0]


def test_an_existing_out_and_a_run_without_checkpoints_are_one_line_errors(sac_run, run_without_checkpoints,
                                                                          tmp_path):
    existing = tmp_path / "existing"
    existing.mkdir()
    line = one_error_line(collect_subprocess("--root_dir", sac_run, "--num_steps", 20, "--random", "--out", existing))
    assert line == f"error: --out '{existing}' already exists; choose a new directory for the dataset"
    assert list(existing.iterdir()) == []
    line = one_error_line(collect_subprocess("--root_dir", run_without_checkpoints, "--num_steps", 20,
                                             "--out", tmp_path / "new"))
    assert line == (f"error: no valid checkpoint under {run_without_checkpoints}/checkpoints; train first "
                    f"(python -m alfish.bin.train --root_dir {run_without_checkpoints} ...)")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("flags, message", [
    (["--random"], "--num_steps is required"),
    (["--num_steps", "1", "--random"], "--num_steps 1 must be >= 2"),
    (["--num_steps", "5", "--num_envs", "3", "--random"], "leaves an env fewer than 2 steps"),
    (["--num_steps", "20", "--epsilon_greedy", "1.5"], "--epsilon_greedy 1.5 must lie in [0, 1]"),
    (["--num_steps", "20", "--random", "--epsilon_greedy", "0.1"], "--epsilon_greedy applies to the trained policy"),
    (["--from_replay", "--random"], "--random applies to rollouts"),
    (["--from_replay", "--num_envs", "2"], "--num_envs applies to rollouts"),
    (["--num_steps", "20", "--random", "--dataset_id", "a/b-v0"], "--dataset_id names a Minari dataset"),
    (["--num_steps", "20", "--allow_import", "not a module"], "--allow_import 'not a module' is not a module name"),
    (["--num_steps", "20", "--checkpoint_step", "7"], "no checkpoint at step 7"),
    (["--from_replay", "--checkpoint_step", "7"], "no checkpoint at step 7"),
])
def test_bad_flags_are_one_line_errors_before_anything_is_written(sac_run, tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    assert collect.main(["--root_dir", str(sac_run), "--out", str(out), *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("error: ") and message in line, line
    assert not out.exists()


def test_a_missing_root_dir_and_an_untrusted_env_name_are_refused(sac_run, tmp_path, capsys):
    assert collect.main(["--root_dir", str(tmp_path / "nope"), "--num_steps", "20", "--random",
                         "--out", str(tmp_path / "out")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    # a results directory whose config names 'module:EnvId' would make gymnasium import that module
    root = tmp_path / "evil"
    (root / "config").mkdir(parents=True)
    text = (sac_run / "config" / "operative.gin").read_text().replace(
        "'alfish/PointGoal-v0'", "'evil_module:Evil-v0'")
    (root / "config" / "operative.gin").write_text(text)
    assert collect.main(["--root_dir", str(root), "--num_steps", "20", "--random", "--out",
                         str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "evil_module" in line and "--allow_import evil_module" in line
    assert "evil_module" not in sys.modules
    # trusted but not installed: still one line
    assert collect.main(["--root_dir", str(root), "--num_steps", "20", "--random", "--out", str(tmp_path / "out"),
                         "--allow_import", "evil_module"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: No module named 'evil_module'"), line


# (e) ---------------------------------------------------------------------------------------------------------------
def test_minari_format_reads_back_equal_to_the_alfish_format(sac_run, tmp_path, capsys, monkeypatch):
    pytest.importorskip("minari")
    monkeypatch.chdir(tmp_path)  # a relative --out
    flags = ["--root_dir", sac_run, "--num_steps", 40, "--num_envs", 2, "--epsilon_greedy", 0.5]
    run_collect(capsys, *flags, "--out", "as_alfish")
    line = run_collect(capsys, *flags, "--out", "as_minari", "--format", "minari", "--dataset_id", "alfish/test-v0")
    assert "to as_minari (minari)" in line
    from_minari = load_offline_data("as_minari")
    from_alfish = load_offline_data("as_alfish")
    assert_same_steps(from_minari, from_alfish)
    assert from_minari.num_episodes == from_alfish.num_episodes == 4
    metadata = json.loads((tmp_path / "as_minari" / "data" / "metadata.json").read_text())
    assert metadata["dataset_id"] == "alfish/test-v0"
    assert "alfish.envs.toy:PointGoal" in metadata["env_spec"]  # a registered class, stored by its import name
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left


@pytest.mark.parametrize("env_name, entry_point", [
    ("CartPole-v1", "gymnasium.envs.classic_control.cartpole:CartPoleEnv"),
    ("alfish/PointGoal-v0", "alfish.envs.toy:PointGoal")])
def test_a_minari_dataset_from_a_registered_env_recovers_it_through_minari(tmp_path, capsys, env_name, entry_point):
    """What d3rlpy's Minari loader does: ``MinariDataset(path).recover_environment()`` needs the stored env spec."""
    minari = pytest.importorskip("minari")
    run = tmp_path / "run"
    (run / "config").mkdir(parents=True)
    (run / "config" / "operative.gin").write_text(f"create_environment.env_name = '{env_name}'\n")
    run_collect(capsys, "--root_dir", run, "--random", "--num_steps", 12, "--out", tmp_path / "ds", "--format",
                "minari")
    dataset = minari.MinariDataset(tmp_path / "ds" / "data")
    assert dataset.env_spec.id == env_name and dataset.env_spec.entry_point == entry_point
    env = dataset.recover_environment()
    try:
        assert env.spec.id == env_name
        assert env.observation_space == dataset.observation_space and env.action_space == dataset.action_space
    finally:
        env.close()
    metadata = json.loads((tmp_path / "ds" / "data" / "metadata.json").read_text())
    assert "alfish_no_env_spec" not in metadata


def test_a_minari_dataset_without_an_env_spec_says_why_and_still_reads(sac_run, tmp_path, capsys):
    minari = pytest.importorskip("minari")
    out = tmp_path / "replay"
    run_collect(capsys, "--root_dir", sac_run, "--from_replay", "--out", out, "--format", "minari")
    metadata = json.loads((out / "data" / "metadata.json").read_text())
    assert "env_spec" not in metadata
    assert metadata["alfish_no_env_spec"] == (f"exported from the replay buffer of {sac_run} (--from_replay), whose "
                                              "env is not read; recover_environment() cannot rebuild the env")
    with pytest.raises(ValueError, match="env_spec is None"):
        minari.MinariDataset(out / "data").recover_environment()
    steps, expected = load_offline_data(str(out)), read_run(sac_run)  # alfish's reader needs only the spaces
    assert len(steps) == len(expected) and steps.num_episodes == expected.num_episodes
    np.testing.assert_array_equal(steps.observation, expected.observation)


@pytest.mark.timeout(90)
def test_a_recurrent_policy_carries_its_state_through_the_episode(tmp_path, capsys):
    """Recurrent PPO trained on alfish/MemoryCue-v0 (the cue is visible at the first step only): its greedy episodes
    all return 1 only if the state it acted from is carried from step to step and reset at each episode's start."""
    from .test_recurrent_learning import RECURRENT_PPO_MEMORY_CUE

    root = train(tmp_path, RECURRENT_PPO_MEMORY_CUE.replace("num_checkpoints = 0", "num_checkpoints = 1"), "run")
    out = tmp_path / "cue"
    run_collect(capsys, "--root_dir", root, "--num_steps", 120, "--num_envs", 4, "--out", out)
    steps = read_dataset(out)
    check_steps(steps)
    answered = steps.step_type == L
    assert answered.sum() >= 16  # 6-step episodes, 30 steps per env
    np.testing.assert_array_equal(steps.reward[answered & (steps.discount == 0)], 1.0)
