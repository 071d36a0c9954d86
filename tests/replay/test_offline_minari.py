"""Minari datasets <-> alfish steps (``alfish.replay.offline.minari_format``), checked by hand on two episodes: one
terminated, one truncated. Skipped where the optional ``minari`` package (``alfish[offline]``) is not installed."""
import dataclasses
import json
import os
import sys

import gymnasium as gym
import numpy as np
import pytest

minari = pytest.importorskip("minari")

from minari.data_collector import EpisodeBuffer  # noqa: E402
from minari.dataset.minari_storage import MinariStorage  # noqa: E402

from alfish.data.types import StepType  # noqa: E402
from alfish.replay.offline.minari_format import read_minari, registered_env_spec, write_minari  # noqa: E402
from alfish.replay.offline.sources import load_offline_data  # noqa: E402
from alfish.replay.offline.steps import Steps  # noqa: E402

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
OBS_SPACE = gym.spaces.Box(-100.0, 100.0, (1,), np.float32)
ACT_SPACE = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)


def hand_steps() -> Steps:
    """Episode A: 2 transitions, terminated. Episode B: 3 transitions, truncated by a time limit."""
    return Steps(step_type=np.array([F, M, L, F, M, M, L], np.int8),
                 reward=np.array([0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 5.0], np.float32),
                 discount=np.array([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0], np.float32),
                 observation=np.array([[0.0], [1.0], [2.0], [10.0], [11.0], [12.0], [13.0]], np.float32),
                 action=np.array([[0.5], [-0.5], [0.0], [0.25], [-0.25], [0.75], [0.0]], np.float32),
                 num_episodes=2, observation_space=OBS_SPACE, action_space=ACT_SPACE, source="hand")


def test_two_hand_checked_episodes_through_minari(tmp_path):
    out = write_minari(hand_steps(), tmp_path / "ds")
    assert out == tmp_path / "ds"
    assert sorted(os.listdir(out)) == ["data"]
    assert sorted(os.listdir(out / "data")) == ["main_data.hdf5", "metadata.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]  # no temporary directory left behind

    # what Minari itself sees: T + 1 observations, T actions/rewards, termination vs truncation on the last one
    a, b = list(minari.MinariDataset(out / "data"))
    assert a.observations[:, 0].tolist() == [0.0, 1.0, 2.0]
    assert a.actions[:, 0].tolist() == [0.5, -0.5]
    assert a.rewards.tolist() == [1.0, 2.0]
    assert a.terminations.tolist() == [False, True] and a.truncations.tolist() == [False, False]
    assert b.observations[:, 0].tolist() == [10.0, 11.0, 12.0, 13.0]
    assert b.actions[:, 0].tolist() == [0.25, -0.25, 0.75]
    assert b.rewards.tolist() == [3.0, 4.0, 5.0]
    assert b.terminations.tolist() == [False, False, False] and b.truncations.tolist() == [False, False, True]

    steps = read_minari(out)
    assert steps.step_type.tolist() == [F, M, L, F, M, M, L]
    assert steps.reward.tolist() == [0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 5.0]  # a reward sits on the step after its action
    assert steps.discount.tolist() == [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]  # only A's termination ends the bootstrap
    assert steps.observation[:, 0].tolist() == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0, 13.0]
    assert steps.action[:, 0].tolist() == [0.5, -0.5, 0.0, 0.25, -0.25, 0.75, 0.0]  # LAST steps: zero actions
    assert (steps.observation.dtype, steps.action.dtype, steps.step_type.dtype) == (np.float32, np.float32, np.int8)
    assert (steps.num_episodes, steps.dropped, steps.source) == (2, 0, str(out))
    assert steps.observation_space == OBS_SPACE and steps.action_space == ACT_SPACE


def test_an_episode_written_by_minari_maps_to_steps(tmp_path):
    """A dataset made on Minari's side (float64 data, as its collector stores it), read into float32 steps."""
    (tmp_path / "ds").mkdir()  # (MinariStorage.new makes only the last directory)
    storage = MinariStorage.new(tmp_path / "ds" / "data", observation_space=OBS_SPACE, action_space=ACT_SPACE)
    storage.update_metadata({"dataset_id": "test/made-v0", "minari_version": minari.__version__})
    storage.update_episodes([EpisodeBuffer(observations=np.array([[0.0], [1.0], [2.0], [3.0]]),
                                           actions=np.array([[0.1], [0.2], [0.3]]), rewards=np.array([1.0, 2.0, 3.0]),
                                           terminations=np.array([False, False, False]),
                                           truncations=np.array([False, False, False]))])  # the data's cut end
    steps = read_minari(tmp_path / "ds")
    assert steps.step_type.tolist() == [F, M, M, L]
    assert steps.reward.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert steps.discount.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert steps.observation[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert steps.action[:, 0].tolist() == pytest.approx([0.1, 0.2, 0.3, 0.0])
    assert (steps.observation.dtype, steps.action.dtype) == (np.float32, np.float32)


def test_round_trip_of_a_dict_observation_and_discrete_actions(tmp_path):
    rng = np.random.default_rng(0)
    st = np.array([F, M, M, L, F, L, F, M, L], np.int8)
    n = len(st)
    obs_space = gym.spaces.Dict({
        "pos": gym.spaces.Box(-10.0, 10.0, (2,), np.float32),
        # 32x32 uint8 in [0, 255]: what Minari calls an image, JPEG-encoded (lossy) unless told otherwise
        "pixels": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8)})
    action = rng.integers(0, 4, n)
    action[st == L] = 0
    steps = Steps(step_type=st, reward=np.where(st == F, 0.0, rng.normal(size=n)).astype(np.float32),
                  discount=np.array([1, 1, 1, 0, 1, 1, 1, 1, 1], np.float32),
                  observation={"pos": rng.normal(size=(n, 2)).astype(np.float32),
                               "pixels": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)},
                  action=action.astype(np.int64), num_episodes=3, observation_space=obs_space,
                  action_space=gym.spaces.Discrete(4), source=str(tmp_path / "ds"))
    back = read_minari(write_minari(steps, tmp_path / "ds", dataset_id="test/round-trip-v1"))
    for name in ("step_type", "reward", "discount", "action"):
        got, want = getattr(back, name), getattr(steps, name)
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    assert sorted(back.observation) == ["pixels", "pos"]
    for key in back.observation:
        got, want = back.observation[key], steps.observation[key]
        assert got.dtype == want.dtype and np.array_equal(got, want), key
    assert (back.num_episodes, back.dropped, back.source) == (3, 0, steps.source)
    assert back.observation_space == obs_space and back.action_space == gym.spaces.Discrete(4)


def test_offline_loader_detects_and_reads_a_minari_directory(tmp_path):
    out = write_minari(hand_steps(), tmp_path / "ds")
    for spec in (str(out), "minari:" + str(out)):
        steps = load_offline_data(spec)
        assert steps.step_type.tolist() == [F, M, L, F, M, M, L]
        assert steps.discount.tolist() == [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def _one_line_value_error(call, *words):
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message
    return message


def test_a_directory_that_is_not_a_minari_dataset_is_a_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()
    _one_line_value_error(lambda: read_minari(tmp_path / "empty"), str(tmp_path / "empty"), "metadata.json")
    _one_line_value_error(lambda: read_minari(tmp_path / "missing"), str(tmp_path / "missing"))
    (tmp_path / "junk" / "data").mkdir(parents=True)
    (tmp_path / "junk" / "data" / "metadata.json").write_text("{not json")
    (tmp_path / "junk" / "data" / "main_data.hdf5").write_bytes(b"not hdf5")
    _one_line_value_error(lambda: read_minari(tmp_path / "junk"), str(tmp_path / "junk"))


def test_a_truncated_main_data_file_is_a_one_line_error(tmp_path):
    out = write_minari(hand_steps(), tmp_path / "ds")
    main = out / "data" / "main_data.hdf5"
    os.truncate(main, main.stat().st_size // 2)
    _one_line_value_error(lambda: read_minari(out), str(out), "truncated")


def test_a_dataset_without_stored_spaces_is_refused_without_building_its_env(tmp_path):
    out = write_minari(hand_steps(), tmp_path / "ds")
    meta = out / "data" / "metadata.json"
    data = json.loads(meta.read_text())
    del data["observation_space"]
    data["env_spec"] = json.dumps({"id": "Evil-v0", "entry_point": "os:system"})  # never imported
    meta.write_text(json.dumps(data))
    _one_line_value_error(lambda: read_minari(out), str(out), "observation_space")


def test_unsupported_spaces_are_refused(tmp_path):
    (tmp_path / "ds").mkdir()
    storage = MinariStorage.new(tmp_path / "ds" / "data", observation_space=OBS_SPACE,
                                action_space=gym.spaces.MultiBinary(2))
    storage.update_metadata({"dataset_id": "test/mb-v0", "minari_version": minari.__version__})
    storage.update_episodes([EpisodeBuffer(observations=np.zeros((2, 1), np.float32),
                                           actions=np.zeros((1, 2), np.int8), rewards=np.zeros(1),
                                           terminations=np.array([True]), truncations=np.array([False]))])
    _one_line_value_error(lambda: read_minari(tmp_path / "ds"), str(tmp_path / "ds"), "MultiBinary", "Discrete")


def test_write_minari_needs_spaces_and_a_new_directory(tmp_path):
    no_spaces = dataclasses.replace(hand_steps(), observation_space=None, action_space=None)
    _one_line_value_error(lambda: write_minari(no_spaces, tmp_path / "a"), "observation_space", "action_space")
    assert not (tmp_path / "a").exists()
    _one_line_value_error(lambda: write_minari(hand_steps(), tmp_path / "b", dataset_id="no version"), "dataset_id")
    (tmp_path / "c").mkdir()
    with pytest.raises(FileExistsError):
        write_minari(hand_steps(), tmp_path / "c")


def test_missing_minari_package_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "minari", None)  # `import minari` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'alfish\[offline\]'"):
        read_minari(tmp_path)


def test_the_env_spec_of_a_registered_env_merges_its_kwargs_and_names_a_class_entry_point_by_import_name():
    import alfish.envs.toy  # noqa: F401  (registers alfish/MemoryCueContinuous-v0 with a class entry point)

    spec, why_none = registered_env_spec("Pendulum-v1", {"g": 9.0})
    assert why_none == "" and spec.id == "Pendulum-v1" and spec.kwargs == {"g": 9.0}
    spec, _ = registered_env_spec("alfish/MemoryCueContinuous-v0", {"delay": 2})
    assert spec.entry_point == "alfish.envs.toy:MemoryCue" and spec.kwargs == {"continuous": True, "delay": 2}
    assert gym.envs.registration.EnvSpec.from_json(spec.to_json()).kwargs == spec.kwargs


def test_an_env_without_a_storable_spec_says_why(tmp_path):
    gym.register(id="alfish_test/Lambda-v0", entry_point=lambda: gym.make("CartPole-v1"))
    try:
        for name, why in (("ALE/Pong-v5", "Atari preprocessing"), ("NoSuchEnv-v3", "not a registered gymnasium id"),
                          ("alfish_test/Lambda-v0", "cannot be stored as JSON"),
                          ("CartPole-v1", "cannot be stored as JSON")):
            spec, why_none = registered_env_spec(name, {"f": print} if name == "CartPole-v1" else None)
            assert spec is None and why in why_none and "\n" not in why_none, (name, why_none)
    finally:
        del gym.registry["alfish_test/Lambda-v0"]
    write_minari(hand_steps(), tmp_path / "ds", no_env_spec="made by hand")
    metadata = json.loads((tmp_path / "ds" / "data" / "metadata.json").read_text())
    assert "env_spec" not in metadata
    assert metadata["alfish_no_env_spec"] == "made by hand; recover_environment() cannot rebuild the env"
    assert read_minari(tmp_path / "ds").num_episodes == 2
