"""Loading offline data: every source kind through the one loader, round trips, and one-line errors."""
import json
import pathlib
import zipfile

import numpy as np
import pytest
import torch

from alfish.data.types import Experience, StepType
from alfish.replay.offline.alfish_format import read_dataset, write_dataset
from alfish.replay.offline.from_run import load_run_checkpoint, read_run
from alfish.replay.offline.offline_buffer import offline_storage
from alfish.replay.offline.sources import detect_kind, load_offline_data
from tests.integration.inprocess import OFF_POLICY_POINT_GOAL, run_trainer_from_text
from tests.replay.test_offline_d4rl import two_episodes

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST

# A SAC run of 2 envs whose rings (30 steps) wrapped: each ring's oldest steps are the tail of an episode.
SMALL_RUN = OFF_POLICY_POINT_GOAL.replace("num_env_steps = 1500", "num_env_steps = 76").replace(
    "num_checkpoints = 0", "num_checkpoints = 1").replace(
    "num_parallel_environments = 1", "num_parallel_environments = 2").replace(
    "initial_collect_steps = 100", "initial_collect_steps = 10").replace(
    "replay_buffer_length = 10000", "replay_buffer_length = 30") + """
SacAlgorithm.hidden_sizes = (8, 8)
TrainerConfig.algorithm_ctor = @SacAlgorithm
TrainerConfig.evaluate = False
"""


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> pathlib.Path:
    return run_trainer_from_text(tmp_path_factory.mktemp("run"), SMALL_RUN)


def ring_history(root: pathlib.Path) -> list[dict[str, np.ndarray]]:
    """Each env's readable steps in the saved rings, oldest first (straight from the checkpoint's tensors)."""
    ckpt = load_run_checkpoint(root)
    storage = ckpt.tensors["replay"]["storage"]
    names = ckpt.meta["replay_layout"]["fields"]
    out = []
    for env, (begin, end) in enumerate(zip(storage["oldest"].tolist(), storage["write_count"].tolist())):
        slots = np.arange(begin, end) % storage["leaves"][0].shape[1]
        out.append({name: leaf[env].numpy()[slots] for name, leaf in zip(names, storage["leaves"])})
    return out


def test_a_run_buffer_becomes_whole_episodes_and_survives_dataset_and_offline_buffer_step_for_step(small_run,
                                                                                                   tmp_path):
    steps = read_run(small_run)
    expected = {k: [] for k in ("step_type", "reward", "discount", "observation", "action")}
    for ring in ring_history(small_run):
        first = int(np.flatnonzero(ring["step_type"] == F)[0])  # the older steps belong to an overwritten episode
        assert first > 0  # (the rings did wrap mid-episode: the test covers the skip)
        for key in expected:
            part = ring[key][first:].copy()
            if key == "step_type":
                part[-1] = L  # the episode running at the checkpoint ends as a truncation
            expected[key].append(part)
    for key, parts in expected.items():
        np.testing.assert_array_equal(getattr(steps, key), np.concatenate(parts), err_msg=key)
    running_end = np.cumsum([len(p) for p in expected["step_type"]]) - 1
    assert (steps.discount[running_end] == 1.0).all()  # truncations bootstrap

    dataset = read_dataset(write_dataset(steps, tmp_path / "ds"))
    example = Experience(step_type=torch.zeros(1, dtype=torch.int8), reward=torch.zeros(1), discount=torch.zeros(1),
                         observation=torch.zeros(1, 1), action=torch.zeros(1, 1), env_id=torch.zeros(1))
    storage = offline_storage(dataset, example)
    stored = storage.gather(torch.tensor([0]), torch.tensor([0]), len(steps))
    for key in expected:
        np.testing.assert_array_equal(getattr(stored, key)[0].numpy(), getattr(steps, key), err_msg=key)
    assert isinstance(dataset.observation, np.memmap)  # mapped, not loaded
    assert dataset.observation_space == steps.observation_space and dataset.action_space == steps.action_space


def test_the_loader_detects_each_kind_and_accepts_a_kind_prefix(small_run, tmp_path):
    np.savez(tmp_path / "d4rl.npz", **two_episodes())
    npy_dir = tmp_path / "npy"
    npy_dir.mkdir()
    for key, value in two_episodes().items():
        np.save(npy_dir / f"{key}.npy", value)
    write_dataset(read_run(small_run), tmp_path / "ds")
    ckpt_dir = load_run_checkpoint(small_run).path
    cases = {str(small_run): "alfish_run", ckpt_dir: "alfish_run", str(tmp_path / "ds"): "alfish",
             str(tmp_path / "d4rl.npz"): "d4rl", str(npy_dir): "d4rl"}
    for path, kind in cases.items():
        assert detect_kind(path) == kind, path
        np.testing.assert_array_equal(load_offline_data(path).step_type, load_offline_data(f"{kind}:{path}").step_type)
    assert load_offline_data(str(npy_dir)).step_type.tolist() == [F, M, M, L, F, M, L]


def test_an_uncompressed_npz_is_memory_mapped_and_a_large_one_converted_once_into_a_mapped_dataset(tmp_path):
    np.savez(tmp_path / "d.npz", **two_episodes())
    cache = tmp_path / "cache"
    first = load_offline_data(str(tmp_path / "d.npz"), cache_dir=cache, in_memory_limit_bytes=0)
    assert isinstance(first.observation, np.memmap)
    (converted,) = list(cache.iterdir())
    mtime = (converted / "observation.npy").stat().st_mtime_ns
    again = load_offline_data(str(tmp_path / "d.npz"), cache_dir=cache, in_memory_limit_bytes=0)
    assert (converted / "observation.npy").stat().st_mtime_ns == mtime  # reused, not converted again
    np.testing.assert_array_equal(again.observation, load_offline_data(str(tmp_path / "d.npz")).observation)


def test_hdf5_d4rl_files_are_read_through_h5py(tmp_path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "d.hdf5", "w") as f:
        for key, value in two_episodes().items():
            f.create_dataset(key, data=value, chunks=True)
    steps = load_offline_data(str(tmp_path / "d.hdf5"))
    assert steps.step_type.tolist() == [F, M, M, L, F, M, L]
    assert steps.observation[:, 0].tolist() == [0.0, 1.0, 2.0, 20.0, 3.0, 4.0, 40.0]


def _truncate(path: pathlib.Path, keep: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def _object_npz(path: pathlib.Path) -> None:
    arrays = two_episodes()
    arrays["actions"] = np.array([None] * 5, dtype=object)
    np.savez(path, **arrays)


def _broken_dataset(tmp_path: pathlib.Path, damage) -> pathlib.Path:
    steps = load_offline_data(str(_npz(tmp_path)))
    out = write_dataset(steps, tmp_path / "broken")
    damage(out)
    return out


def _npz(tmp_path: pathlib.Path) -> pathlib.Path:
    np.savez(tmp_path / "ok.npz", **two_episodes())
    return tmp_path / "ok.npz"


@pytest.mark.parametrize("make, message", [
    (lambda p: (np.savez(p / "x.npz", **{k: v for k, v in two_episodes().items() if k != "rewards"}), p / "x.npz")[1],
     r"missing field\(s\) \['rewards'\]"),
    (lambda p: (_object_npz(p / "x.npz"), p / "x.npz")[1], "dtype object"),
    (lambda p: (np.savez(p / "x.npz", **two_episodes()), _truncate(p / "x.npz"), p / "x.npz")[2],
     "not a readable .npz|truncated"),
    (lambda p: (p.joinpath("x.txt").write_text("hi"), p / "x.txt")[1], "unknown file type '.txt'"),
    (lambda p: p / "nowhere", "does not exist"),
    (lambda p: _broken_dataset(p, lambda d: _truncate(d / "observation.npy")), "truncated"),
    (lambda p: _broken_dataset(p, lambda d: (d / "action.npy").unlink()), "the file of field 'action'"),
    (lambda p: _broken_dataset(p, lambda d: (d / "dataset.json").write_text("{")), "unreadable dataset metadata"),
    (lambda p: _broken_dataset(p, lambda d: np.save(d / "step_type.npy", np.array([0, 1, 1, 0, 1, 1, 2], np.int8))),
     "episode boundary broken at step 2"),
])
def test_malformed_offline_data_is_a_one_line_error(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(ValueError, match=message) as err:
        load_offline_data(str(path))
    assert "\n" not in str(err.value)


def test_a_dataset_with_metadata_naming_a_file_outside_it_is_refused(tmp_path):
    out = write_dataset(load_offline_data(str(_npz(tmp_path))), tmp_path / "ds")
    meta = json.loads((out / "dataset.json").read_text())
    meta["fields"]["reward"]["file"] = "../ok.npz"
    (out / "dataset.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="outside the dataset directory"):
        load_offline_data(str(out))


def test_a_compressed_npz_is_loaded_into_memory(tmp_path):
    np.savez_compressed(tmp_path / "c.npz", **two_episodes())
    with zipfile.ZipFile(tmp_path / "c.npz") as archive:
        assert archive.infolist()[0].compress_type == zipfile.ZIP_DEFLATED
    steps = load_offline_data(str(tmp_path / "c.npz"))
    assert not isinstance(steps.observation, np.memmap) and steps.reward.tolist() == [0, 1, 2, 3, 0, 4, 5]


def test_a_cut_right_after_a_first_step_keeps_whole_transitions():
    data = steps_from_two_episodes()
    assert data.step_type.tolist() == [F, M, M, L, F, M, L]
    cut = data.head(5)  # would end on the second episode's FIRST step
    assert cut.step_type.tolist() == [F, M, M, L] and cut.num_episodes == 1
    assert data.head(6).step_type.tolist() == [F, M, M, L, F, L]


def steps_from_two_episodes():
    from alfish.replay.offline.d4rl import d4rl_to_steps

    return d4rl_to_steps(two_episodes())


def test_a_run_whose_newest_step_is_an_autoreset_first_step_still_loads(tmp_path):
    # 1 env, 10-step episodes: 45 env steps end on the FIRST step of the 5th episode
    conf = SMALL_RUN.replace("num_parallel_environments = 2", "num_parallel_environments = 1").replace(
        "num_env_steps = 76", "num_env_steps = 45").replace("replay_buffer_length = 30", "replay_buffer_length = 100")
    root = run_trainer_from_text(tmp_path, conf)
    steps = read_run(root)
    assert steps.step_type[-1] == L and steps.step_type[-2] != L
    assert len(steps) == 44 and steps.num_episodes == 4
