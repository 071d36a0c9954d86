"""Storage locations (``make_storage``): memory-mapped files round trip and clean up; the host-side counters, and the
Python-int bound that answers ``holds_sequence``, stay right."""
import gc
import io

import pytest
import torch

from alfish.replay import MappedRingBuffer, ReplayBuffer, RingBuffer, UniformSampler, make_storage
from tests.replay.sync_scenario import CAPACITY, NUM_ENVS, add, fill, step


def uniform(storage, seed=0):
    return ReplayBuffer(storage, UniformSampler(torch.Generator().manual_seed(seed)))


def test_make_storage_builds_each_location_and_names_the_choices_on_a_typo(tmp_path):
    assert type(make_storage("cpu", 2, 4)) is RingBuffer
    assert make_storage("device", 2, 4, device="meta").device.type == "meta"
    assert isinstance(make_storage("mmap", 2, 4, scratch_dir=tmp_path), MappedRingBuffer)
    with pytest.raises(ValueError, match=r"^replay storage location must be one of 'cpu', 'mmap', 'device'; "
                                         r"got 'gpu'$"):
        make_storage("gpu", 2, 4)
    with pytest.raises(ValueError, match="'mmap' needs a scratch_dir"):
        make_storage("mmap", 2, 4)
    with pytest.raises(ValueError, match="is not a folder"):
        make_storage("mmap", 2, 4, scratch_dir=tmp_path / "missing")


def test_mmap_storage_makes_one_file_per_leaf_under_the_scratch_dir_and_removes_them(tmp_path):
    storage = make_storage("mmap", NUM_ENVS, CAPACITY, scratch_dir=tmp_path)
    assert storage.folder is None  # nothing before the first add
    fill(uniform(storage))
    folder = storage.folder
    assert folder.parent == tmp_path and folder.name.startswith("alfish-replay-")
    files = sorted(folder.iterdir())
    assert len(files) == len(storage.leaf_layout()) == 6  # step_type, reward, discount, observation, action, index
    assert sum(p.stat().st_size for p in files) == sum(x.numel() * x.element_size()
                                                        for x in storage.state_dict()["leaves"])
    storage.close()
    assert not folder.exists()
    other = make_storage("mmap", NUM_ENVS, CAPACITY, scratch_dir=tmp_path)
    fill(uniform(other))
    folder = other.folder
    del other
    gc.collect()
    assert not folder.exists()  # removed when the buffer is garbage-collected


def test_mmap_storage_samples_what_host_memory_samples_and_round_trips_a_checkpoint(tmp_path):
    host, mapped = uniform(make_storage("cpu", NUM_ENVS, CAPACITY)), uniform(
        make_storage("mmap", NUM_ENVS, CAPACITY, scratch_dir=tmp_path))
    for buf in (host, mapped):
        fill(buf)
        add(buf, torch.tensor([1]))
    for _ in range(3):
        (a, info_a), (b, info_b) = host.sample(5, 3), mapped.sample(5, 3)
        assert torch.equal(info_a.positions, info_b.positions)
        assert all(torch.equal(x, y) for x, y in zip(torch.utils._pytree.tree_leaves(a),
                                                     torch.utils._pytree.tree_leaves(b)))
    data = io.BytesIO()
    torch.save(mapped.state_dict(), data)
    data.seek(0)
    restored = uniform(make_storage("mmap", NUM_ENVS, CAPACITY, scratch_dir=tmp_path))
    old_folder_files = sorted(mapped.storage.folder.iterdir())
    example = step(torch.arange(1), torch.zeros(1, dtype=torch.int64))
    restored.load_state_dict(torch.load(data, weights_only=True), example)
    assert restored.storage.folder != mapped.storage.folder and len(list(restored.storage.folder.iterdir())) == 6
    assert sorted(mapped.storage.folder.iterdir()) == old_folder_files  # the first buffer's files are its own
    for buf in (mapped, restored):
        buf.sampler.generator.manual_seed(7)
    (a, info_a), (b, info_b) = mapped.sample(6, 2), restored.sample(6, 2)
    assert torch.equal(info_a.positions, info_b.positions) and torch.equal(a.observation, b.observation)
    # Loading again replaces the files: the old ones are deleted, the new ones hold the data.
    first_files = sorted(restored.storage.folder.iterdir())
    restored.load_state_dict(mapped.state_dict(), example)
    assert not any(p.exists() for p in first_files) and len(list(restored.storage.folder.iterdir())) == 6
    assert torch.equal(restored.gather_all()[0].observation, mapped.gather_all()[0].observation)


def test_counters_stay_on_the_cpu_and_holds_sequence_follows_them():
    storage = make_storage("device", NUM_ENVS, 5, device="meta")
    buf = uniform(storage)
    gen = torch.Generator().manual_seed(3)
    for i in range(40):
        if i % 7 == 3:
            buf.clear(keep_last=int(torch.randint(0, 3, (1,), generator=gen)))
        elif i < 10:
            add(buf, torch.arange(NUM_ENVS))  # lockstep
        else:
            env_ids = torch.randperm(NUM_ENVS, generator=gen)[:int(torch.randint(1, NUM_ENVS + 1, (1,),
                                                                                    generator=gen))]
            add(buf, env_ids.sort().values)
        assert storage.write_count().device.type == storage.oldest_index().device.type == "cpu"
        most = int(storage.num_stored().max())
        # (asked in a changing order: a question may refresh the bound the next one reads)
        for length in sorted(range(1, 7), key=lambda n: (n * (i + 3)) % 7):
            assert storage.holds_sequence(length) == (most >= length)
