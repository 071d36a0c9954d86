"""The device policy's choices and errors; the Learner's lazily read non-finite guard (latched on the device, read
every ``finite_check_interval`` updates, naming the first bad update; a fused optimizer skips it); an update of a real
algorithm makes no syncing call (``SyncCounter``); the compiled update and its fallback."""
import logging

import gymnasium as gym
import pytest
import torch

from alfish.algorithms.sac import SacAlgorithm
from alfish.data.types import BatchInfo, Experience, StepType
from alfish.errors import NonFiniteLossError
from alfish.learn.device import DevicePolicy, resolve_device
from alfish.learn.learner import CompiledLoss, Learner
from alfish.learn.optim import OptimizerConfig
from alfish.learn.sync_debug import SyncCounter
from tests.learn.test_learner import Toy, batch

NO_CUDA = not torch.cuda.is_available()


# ----------------------------------------------------------------------------------------------- device policy ----
def test_auto_is_the_cpu_without_cuda_and_cpu_is_always_there():
    assert resolve_device("cpu") == torch.device("cpu")
    if NO_CUDA:
        assert DevicePolicy().training_device(local_rank=3) == torch.device("cpu")


@pytest.mark.skipif(not NO_CUDA, reason="checks the errors of a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_asking_for_cuda_without_it_is_a_one_line_error(name):
    with pytest.raises(ValueError, match=rf"^DevicePolicy.device='{name}' but this machine has no usable CUDA "
                                         r"device \(torch .*\); use 'cpu' or 'auto'$"):
        DevicePolicy(device=name).training_device()


@pytest.mark.parametrize("name, message", [
    ("gpu0", r"DevicePolicy.rollout_device='gpu0' is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ("meta", r"DevicePolicy.rollout_device='meta': alfish trains on 'cpu' or 'cuda' devices \('auto' picks one\)"),
])
def test_unknown_devices_are_named(name, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        DevicePolicy(rollout_device=name).acting_device()


@pytest.mark.parametrize("name, local_rank, visible, expected", [
    ("cuda", "3", 4, "cuda:3"),  # torchrun: each rank's children act on that rank's GPU
    ("cuda", "3", 2, "cuda:1"),  # fewer GPUs than local ranks: LOCAL_RANK % device_count(), as for training
    ("cuda", None, 4, "cuda:0"),  # no torchrun
    ("cuda:2", "3", 4, "cuda:2"),  # an explicit GPU stays that GPU
    ("cpu", "3", 4, "cpu"),
])
def test_the_acting_device_under_torchrun_is_the_local_ranks_gpu(monkeypatch, name, local_rank, visible, expected):
    """``DevicePolicy.rollout_device`` resolves with the local rank, as ``DevicePolicy.device`` does (the resolution
    alone: CUDA's presence is faked; nothing is placed there)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert DevicePolicy(rollout_device=name).acting_device() == torch.device(expected)
    assert DevicePolicy(rollout_device=name).acting_device(local_rank=1) == torch.device(
        expected if name != "cuda" else f"cuda:{1 % visible}")


def test_bad_replay_storage_lists_the_choices():
    with pytest.raises(ValueError, match=r"^DevicePolicy.replay_storage='gpu' must be one of \['cpu', 'mmap', "
                                         r"'device'\]$"):
        DevicePolicy(replay_storage="gpu")


# ------------------------------------------------------------------------------------------- non-finite guard ----
def test_a_non_finite_update_is_skipped_and_named_when_the_guard_is_read():
    toy = Toy()
    learner = Learner(toy, OptimizerConfig(fused=True), finite_check_interval=4)
    learner.update(batch())
    learner.update(batch())
    after_two = toy.w.detach().clone()
    learner.update(batch(reward=(0.0, float("nan"), 3.0)))  # update 2: not read yet, skipped by the fused Adam
    assert torch.equal(toy.w, after_two) and learner.num_updates == 3
    with pytest.raises(NonFiniteLossError) as err:
        learner.update(batch())  # update 3 is the 4th: the read is due before it changes anything
    assert str(err.value).startswith("loss is nan at update 2; non-finite loss terms: critic (nan); all terms: ")
    assert torch.equal(toy.w, after_two) and learner.num_updates == 3
    assert torch.isfinite(learner.optimizer.state[toy.w]["exp_avg"]).all()


def test_check_finite_reads_the_latch_on_demand_and_clears_it():
    learner = Learner(Toy(), finite_check_interval=100)
    learner.update(batch())
    learner.check_finite()  # nothing bad: no error
    learner.update(batch(reward=(float("inf"), 0.0, 0.0)))
    learner.update(batch(reward=(float("nan"), 0.0, 0.0)))
    with pytest.raises(NonFiniteLossError, match=r"^loss is inf at update 1; "):  # the first, not the latest
        learner.check_finite()
    learner.update(batch())
    learner.check_finite()  # cleared: the next window starts clean


def test_the_default_interval_reads_every_update_on_the_cpu():
    assert Learner(Toy()).finite_guard.check_interval == 1


# ------------------------------------------------------------------------------------------------ no host sync ----
def sac_batch(length: int = 2, size: int = 32) -> Experience:
    """A time-major ``[L, B]`` SAC batch of 3-d observations and 1-d actions."""
    return Experience(step_type=torch.full((length, size), int(StepType.MID), dtype=torch.int8),
                      reward=torch.randn(length, size), discount=torch.ones(length, size),
                      observation=torch.randn(length, size, 3), action=torch.rand(length, size, 1) * 4 - 2,
                      env_id=torch.zeros(length, size, dtype=torch.int64))


@pytest.mark.parametrize("amp", [False, True])
def test_sac_updates_make_no_syncing_call(amp):
    """N consecutive non-summary updates (loss, backward, norm clip, fused Adam, Polyak) make no ``.item()``,
    ``float()``, ``bool()``, ``.cpu()``, ... call: on a GPU none of them would wait for the device. The fused Adam
    keeps its step counter on the device (stock non-fused Adam reads a CPU counter: not used here)."""
    from alfish.learn.amp import AmpPolicy

    torch.manual_seed(0)
    sac = SacAlgorithm(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (1,)), hidden_sizes=(16,),
                       target_update_period=2)
    learner = Learner(sac, OptimizerConfig(max_grad_norm=1.0, fused=True), AmpPolicy(amp), finite_check_interval=1000)
    batches = [sac_batch() for _ in range(6)]
    weights = BatchInfo(env_ids=torch.zeros(32, dtype=torch.int64), positions=torch.zeros(32, dtype=torch.int64),
                        importance_weights=torch.rand(32) + 0.5)
    learner.update(batches[0], weights)  # the optimizer state and the guard's latch are created here
    with SyncCounter() as syncs:
        for b in batches[1:]:
            loss_info = learner.update(b, weights)
            assert loss_info.priority.shape == (32,)
    assert syncs.calls == [], syncs.report()
    learner.check_finite()


def test_the_counter_sees_each_kind_of_sync():
    t = torch.tensor([1.5, 0.0])
    with SyncCounter() as syncs:
        t[0].item(), float(t[0]), bool(t[0]), t.tolist(), t.cpu(), t.numpy(), t.nonzero(), t[t > 0]
    assert syncs.calls == ["item", "__float__", "__bool__", "tolist", "cpu", "numpy", "nonzero",
                           "__getitem__[bool mask]"]
    assert all(where.startswith(__file__) for where in syncs.sites)


# ------------------------------------------------------------------------------------------------- compile ----
def test_a_failing_compiler_falls_back_to_eager_with_one_warning(caplog):
    def broken_backend(graph_module, example_inputs):
        raise RuntimeError("no compiler here")

    toy, eager_toy = Toy(), Toy()
    learner, eager = Learner(toy), Learner(eager_toy)
    learner._compute_loss = CompiledLoss(learner.loss_module, "default", backend=broken_backend)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            learner.update(batch())
            eager.update(batch())
    warnings = [r.getMessage() for r in caplog.records if "torch.compile failed" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("Learner.compile_mode='default': torch.compile failed (")
    assert torch.equal(toy.w, eager_toy.w)


def test_an_unknown_compile_mode_is_a_conf_error():
    with pytest.raises(ValueError, match=r"^Learner.compile_mode='fastest': Unrecognized mode=fastest"):
        Learner(Toy(), compile_mode="fastest")


def test_cuda_graphs_on_the_cpu_are_refused():
    with pytest.raises(ValueError, match=r"^Learner.compile_mode='reduce-overhead' captures CUDA graphs, but "
                                         r"training runs on cpu; use 'default' \(or None\) there$"):
        Learner(Toy(), compile_mode="reduce-overhead")
