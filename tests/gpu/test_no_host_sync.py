"""The update path makes no host synchronization on a GPU (DESIGN.md §3.12), checked by CUDA itself:
``torch.cuda.set_sync_debug_mode('error')`` around updates that write no summary.

Trainers are built from the learning tests' confs with ``DevicePolicy.device`` set, exactly as ``alfish.bin.train``
builds them, and warmed up; then each iteration collects outside the guard (acting reads actions back to the host:
that sync is the env's, not the update's) and runs the training step's update part inside it: for sampled replay
(SAC, TD3, DQN with prioritized replay) ``SampledReplayTraining._train`` (sample, transform, copy to the device,
update, new priorities); for PPO both the mini-batch updates alone and the whole ``WholeBufferTraining._train``
(gather the buffer, GAE, epochs of mini-batches, clear). The replay buffer lives in host memory or on the device
(``DevicePolicy.replay_storage``). ``Learner.finite_check_interval`` is far above the number of updates, so none of
the non-finite guard's reads (one sync each, by design) falls inside.

fp16 with the gradient scaler: no sync per update either (fused Adam, the default, takes the scaler's ``found_inf``
on the device), and an overflowing step is skipped on the device and counted in ``AmpPolicy.skipped_steps``.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from alfish.algorithms import SacAlgorithm
from alfish.data.types import LossInfo
from alfish.learn.amp import AmpPolicy
from alfish.learn.learner import Learner
from alfish.learn.optim import OptimizerConfig
from alfish.trainer.training import SampledReplayTraining, WholeBufferTraining
from tests.integration.test_dqn_learning import DQN_CHAIN, PRIORITIZED
from tests.integration.test_learning import PPO_CHAIN, SAC_POINT_GOAL
from tests.integration.test_td3_learning import TD3_POINT_GOAL
from tests.learn.test_meta_device import B_, BOX, L_, OBS, meta_experience

from .helpers import (
    DEVICE,
    NO_FINITE_READS,
    assert_on_device,
    cuda_only,
    device_bindings,
    no_host_syncs,
    started_trainer,
    with_values,
)

WARM_ITERATIONS = 5  # unguarded: CUDA's lazy initialization, the optimizer's state, the first priorities
GUARDED_ITERATIONS = 50
FINITE = f"\nLearner.finite_check_interval = {NO_FINITE_READS}\n"
OFF_POLICY = {"sac": SAC_POINT_GOAL, "td3": TD3_POINT_GOAL,
              "dqn-prioritized": DQN_CHAIN + "\n".join(PRIORITIZED) + "\n"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("storage", ["cpu", "device"], ids=["host-replay", "device-replay"])
@pytest.mark.parametrize("algo", sorted(OFF_POLICY))
def test_sampled_replay_updates_make_no_host_sync(tmp_path, algo, storage):
    conf = OFF_POLICY[algo] + device_bindings(replay_storage=storage) + FINITE
    with started_trainer(tmp_path, conf) as trainer:
        training = trainer.training
        assert isinstance(training, SampledReplayTraining)
        rings = trainer.replay.storage.device
        assert rings.type == (DEVICE.type if storage == "device" else "cpu"), f"replay_storage='{storage}': {rings}"
        for _ in range(WARM_ITERATIONS):
            training.collector.collect(1)
            training._train()
        before = trainer.learner.num_updates
        for _ in range(GUARDED_ITERATIONS):
            training.collector.collect(1)
            with no_host_syncs():
                training._train()
        assert trainer.learner.num_updates == before + GUARDED_ITERATIONS * training.num_updates
        trainer.learner.check_finite()
        assert_on_device(trainer.algorithm)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scope", ["mini-batch-updates", "whole-training-step"])
def test_ppo_updates_make_no_host_sync(tmp_path, monkeypatch, scope):
    with started_trainer(tmp_path, PPO_CHAIN + device_bindings() + FINITE) as trainer:
        training, learner = trainer.training, trainer.learner
        assert isinstance(training, WholeBufferTraining)
        steps = trainer.config.unroll_length
        training.collector.collect(steps)
        training._train()  # warm
        if scope == "mini-batch-updates":
            update = learner.update

            def guarded_update(*args, **kwargs) -> LossInfo:
                with no_host_syncs():
                    return update(*args, **kwargs)

            monkeypatch.setattr(learner, "update", guarded_update)
        before = learner.num_updates
        for _ in range(3):
            training.collector.collect(steps)
            with no_host_syncs() if scope == "whole-training-step" else contextlib.nullcontext():
                training._train()
        assert learner.num_updates > before
        learner.check_finite()
        assert_on_device(trainer.algorithm)


# ------------------------------------------------------------------------------------------------------ fp16 ---

def fp16_sac_learner() -> Learner:
    """SAC (64x64) on ``DEVICE`` with fp16 autocast, the gradient scaler and the default (fused) Adam."""
    torch.manual_seed(0)
    alg = SacAlgorithm(OBS, BOX, hidden_sizes=(64, 64))
    return Learner(alg, OptimizerConfig(), AmpPolicy(True, DEVICE.type, "float16"), device=DEVICE,
                   finite_check_interval=NO_FINITE_READS)


def scale_loss(monkeypatch: pytest.MonkeyPatch, alg: SacAlgorithm, factor: float) -> None:
    """Make ``alg``'s per-sample loss ``factor`` times larger: finite in float32, but its gradients, multiplied by
    the loss scale, overflow fp16 (max 65504) on the way back through the autocast (fp16) layers."""
    calc_loss = alg.calc_loss

    def scaled(exp, train_info) -> LossInfo:
        loss_info = calc_loss(exp, train_info)
        return loss_info._replace(loss=loss_info.loss * factor)

    monkeypatch.setattr(alg, "calc_loss", scaled)


@cuda_only("fp16 loss scaling")
@pytest.mark.timeout(120)
def test_fp16_updates_make_no_host_sync_and_an_overflowing_step_is_skipped_and_counted(monkeypatch):
    learner = fp16_sac_learner()
    assert learner.optimizer.defaults.get("fused"), "fused Adam is the default (no sync for the scaler's found_inf)"
    assert learner.amp.scaler.is_enabled()
    batch = with_values(meta_experience(BOX, L_, B_), BOX)
    for _ in range(WARM_ITERATIONS):
        learner.update(batch)
    with no_host_syncs():
        for _ in range(GUARDED_ITERATIONS):
            learner.update(batch)
    skipped, scale = learner.amp.skipped_steps, learner.amp.scaler.get_scale()  # reads: outside the guard

    params = [p.detach().clone() for p in learner.params]
    scale_loss(monkeypatch, learner.algorithm, 1e30)
    with no_host_syncs():
        learner.update(batch)
    assert learner.amp.skipped_steps == skipped + 1
    assert learner.amp.scaler.get_scale() == scale * learner.amp.scaler.get_backoff_factor()
    assert all(torch.equal(p, q) for p, q in zip(params, learner.params)), "a skipped step changed parameters"
    learner.check_finite()  # the float32 loss was finite: not a non-finite-loss error

    monkeypatch.undo()  # the loss back to normal: the next step is taken
    learner.update(batch)
    assert learner.amp.skipped_steps == skipped + 1
    assert any(not torch.equal(p, q) for p, q in zip(params, learner.params))
    assert learner.amp.summary()["skipped_steps"] == skipped + 1

