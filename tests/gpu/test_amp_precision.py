"""What AMP must keep in float32 (DESIGN.md §3.9): under fp16 or bf16 autocast the networks' matmuls run in the low
precision, but SAC's log-probabilities (and so its entropy), alpha, every loss term and the loss reductions come out
float32: a log-prob of a squashed Gaussian sums per-dimension terms of opposite sign, and alpha's loss moves with the
entropy's difference from its target, both of which fp16's 3 significant digits would lose. PPO's log-probs and
ratios likewise.
"""
from __future__ import annotations

import pytest
import torch

from alfish.algorithms import PpoAlgorithm, SacAlgorithm
from alfish.algorithms.ppo import PpoRolloutInfo
from alfish.learn.amp import AmpPolicy
from alfish.learn.learner import Learner, loss_terms
from alfish.learn.optim import OptimizerConfig
from alfish.replay.batching import WholeBufferBatches
from tests.learn.test_meta_device import B_, BOX, L_, META, OBS, meta_experience

from .helpers import AMP_DTYPES, DEVICE, NO_FINITE_READS, cuda_only, with_values

LOW_PRECISIONS = [pytest.param("fp16", marks=cuda_only("fp16 autocast")), "bf16"]


def amp_learner(alg: torch.nn.Module, precision: str) -> Learner:
    amp = AmpPolicy(True, DEVICE.type, AMP_DTYPES[precision])
    return Learner(alg, OptimizerConfig(), amp, device=DEVICE, finite_check_interval=NO_FINITE_READS)


def assert_float32(named: dict) -> None:
    wrong = {name: value.dtype for name, value in named.items() if value.dtype != torch.float32}
    assert not wrong, f"not float32 under autocast: {wrong}"


@pytest.mark.parametrize("precision", LOW_PRECISIONS)
def test_sac_keeps_log_probs_entropy_alpha_and_losses_in_float32(precision):
    torch.manual_seed(0)
    learner = amp_learner(SacAlgorithm(OBS, BOX, hidden_sizes=(64, 64)), precision)
    alg, amp = learner.algorithm, learner.amp
    batch = with_values(meta_experience(BOX, L_, B_), BOX)
    with amp.autocast():
        assert alg.actor(batch.observation[0]).dtype == amp.dtype  # the networks do run in low precision
        info = alg.train_step(batch).info
    assert_float32(dict(log_prob=info.log_prob, critic_loss=info.critic_loss, actor_loss=info.actor_loss,
                        alpha_loss=info.alpha_loss))
    loss_info = learner.update(batch)
    assert_float32(dict(per_sample_loss=loss_info.loss, mean_loss=learner.last_loss.loss,
                        priority=loss_info.priority))
    terms = loss_terms(loss_info)
    assert {"critic_loss", "actor_loss", "alpha_loss", "entropy", "alpha"} <= set(terms)
    assert_float32(terms)
    assert alg.log_alpha.dtype == torch.float32  # the parameters themselves never change dtype
    learner.check_finite()


@pytest.mark.parametrize("precision", LOW_PRECISIONS)
def test_ppo_keeps_log_probs_and_losses_in_float32(precision):
    torch.manual_seed(0)
    learner = amp_learner(PpoAlgorithm(OBS, BOX, hidden_sizes=(64, 64)), precision)
    steps = 5
    info = PpoRolloutInfo(log_prob=torch.empty(B_, steps, device=META), value=torch.empty(B_, steps, device=META))
    exp = with_values(meta_experience(BOX, B_, steps, rollout_info=info), BOX)
    exp = learner.algorithm.preprocess_experience(exp)  # [B, T-1] with advantages, as WholeBufferTraining does
    batch = next(iter(WholeBufferBatches(exp, length=1, batch_size=6).epoch()))  # time-major [1, 6]
    loss_info = learner.update(batch)
    assert_float32(dict(per_sample_loss=loss_info.loss, mean_loss=learner.last_loss.loss))
    assert_float32({name: value for name, value in loss_terms(loss_info).items() if isinstance(value, torch.Tensor)})
    learner.check_finite()
