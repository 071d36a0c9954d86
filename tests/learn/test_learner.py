"""The Learner on a toy algorithm with hand-computed values: importance weights and masks, clipping by norm and by
value, the non-finite guard, scheduled learning rates, after_update and the update counter, state round trip, the
on-policy ``apply`` path, and the summary tags.

The toy predicts ``obs . w`` with ``w = [1, -1]``; its per-sample loss is ``(obs . w - reward)^2``, zeroed at LAST
steps. On the batch below (L=1, B=3): obs = [1,0], [0,1], [1,1]; reward = 0, 0, 3; so errors e = 1, -1, -3 and the
per-sample loss is 1, 1, 9. The gradient of ``mean(c_i * e_i^2)`` is ``(2/B) sum c_i e_i obs_i``.
"""
import io
import math

import pytest
import torch
from torch import nn

from alfish.algorithms.base import Algorithm
from alfish.data.types import AlgStep, BatchInfo, Experience, LossInfo, StepType
from alfish.errors import NonFiniteLossError
from alfish.learn.amp import AmpPolicy
from alfish.learn.learner import Learner
from alfish.learn.optim import OptimizerConfig
from alfish.schedulers import LinearScheduler, reset_progress, update_progress


class Toy(Algorithm):
    """A linear predictor of the reward with one parameter vector ``w [2]`` in one group named 'toy'."""

    def __init__(self, lr: float | LinearScheduler = 0.1):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, -1.0]))
        self.lr = lr
        self.after_update_calls = 0
        self.extra_calls = 0

    def param_groups(self) -> list[dict]:
        return [{"name": "toy", "params": [self.w], "lr": self.lr}]

    def train_step(self, exp: Experience, state=()) -> AlgStep:
        return AlgStep(info=(exp.observation * self.w).sum(-1))  # prediction [L, B]

    def calc_loss(self, exp: Experience, train_info: torch.Tensor) -> LossInfo:
        err = train_info - exp.reward
        per_sample = err.pow(2) * (exp.step_type != StepType.LAST).to(err.dtype)  # [L, B], masked at LAST

        def extra() -> dict:
            self.extra_calls += 1
            return {"critic": per_sample.detach().mean(), "l2": self.w.detach().pow(2).sum()}

        return LossInfo(loss=per_sample, extra=extra)

    def after_update(self) -> None:
        self.after_update_calls += 1


def batch(reward=(0.0, 0.0, 3.0), last=(False, False, False)) -> Experience:
    """``[L=1, B=3]`` time-major experience."""
    step_type = torch.tensor([[StepType.LAST if x else StepType.MID for x in last]], dtype=torch.int8)
    return Experience(step_type=step_type, reward=torch.tensor([reward]), discount=torch.ones(1, 3),
                      observation=torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]), action=torch.zeros(1, 3),
                      env_id=torch.arange(3).view(1, 3))


def weighted(weights) -> BatchInfo:
    return BatchInfo(env_ids=torch.arange(3), positions=torch.zeros(3, dtype=torch.int64),
                     importance_weights=torch.tensor(weights))


@pytest.fixture(autouse=True)
def fresh_progress():
    reset_progress()
    yield
    reset_progress()


def test_importance_weights_multiply_the_per_sample_loss_and_masked_entries_add_nothing():
    toy = Toy()
    learner = Learner(toy, OptimizerConfig())
    learner.update(batch(), weighted([0.5, 2.0, 1.0]))
    # loss mean(0.5*1, 2*1, 1*9) = 11.5/3; grad (2/3) (0.5*1*[1,0] + 2*(-1)*[0,1] + 1*(-3)*[1,1]) = [-5, -10]/3
    assert learner.summary()["loss/total"].item() == pytest.approx(11.5 / 3)
    assert torch.allclose(toy.w.grad, torch.tensor([-5.0, -10.0]) / 3)

    toy = Toy()
    learner = Learner(toy, OptimizerConfig())
    learner.update(batch(last=(False, False, True)), weighted([0.5, 2.0, 1.0]))
    # the third sample is masked: loss (0.5 + 2 + 0)/3, grad (2/3)(0.5*[1,0] - 2*[0,1]) = [1, -4]/3
    assert learner.summary()["loss/total"].item() == pytest.approx(2.5 / 3)
    assert torch.allclose(toy.w.grad, torch.tensor([1.0, -4.0]) / 3)


def test_without_weights_the_loss_is_the_plain_mean_and_bad_weights_are_clear_errors():
    toy = Toy()
    learner = Learner(toy)
    learner.update(batch())
    assert learner.summary()["loss/total"].item() == pytest.approx(11 / 3)
    assert torch.allclose(toy.w.grad, torch.tensor([-4.0, -8.0]) / 3)  # (2/3)([1,0] - [0,1] - 3[1,1])
    with pytest.raises(ValueError, match=r"importance weights of shape \(2,\) do not fit Toy's per-sample loss of "
                                         r"shape \(1, 3\): its last dimension must be the batch B"):
        learner.update(batch(), BatchInfo(torch.arange(2), torch.zeros(2), torch.ones(2)))
    with pytest.raises(ValueError, match="Toy.calc_loss returned a scalar loss, but the batch has importance weights"):
        learner.apply(LossInfo(loss=toy.w.sum()), weighted([1.0, 1.0, 1.0]))


def test_clipping_by_global_norm_by_value_and_both_value_first():
    raw = torch.tensor([-5.0, -10.0]) / 3  # the weighted gradient of the first test, norm sqrt(125)/3 = 3.727
    toy = Toy()
    learner = Learner(toy, OptimizerConfig(max_grad_norm=1.0))
    learner.update(batch(), weighted([0.5, 2.0, 1.0]))
    norm = math.sqrt(125) / 3
    assert torch.allclose(toy.w.grad, raw / (norm + 1e-6))
    assert learner.summary()["loss/grad_norm"].item() == pytest.approx(norm)

    toy = Toy()
    learner = Learner(toy, OptimizerConfig(max_grad_value=2.0))
    learner.update(batch(), weighted([0.5, 2.0, 1.0]))
    assert torch.allclose(toy.w.grad, torch.tensor([-5.0 / 3, -2.0]))  # only -10/3 exceeds 2
    assert "loss/grad_norm" not in learner.summary()  # no norm clipping, no norm computed

    toy = Toy()
    learner = Learner(toy, OptimizerConfig(max_grad_norm=1.0, max_grad_value=1.0))
    learner.update(batch(), weighted([0.5, 2.0, 1.0]))
    # value first: [-1, -1] (norm sqrt 2), then norm: [-1, -1] / sqrt 2 (norm first would give [-1, -2] / sqrt 5)
    assert torch.allclose(toy.w.grad, torch.tensor([-1.0, -1.0]) / (math.sqrt(2) + 1e-6))
    assert learner.summary()["loss/grad_norm"].item() == pytest.approx(math.sqrt(2))


def test_bad_max_grad_value_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"^OptimizerConfig.max_grad_value=0 must be positive or None$"):
        OptimizerConfig(max_grad_value=0)


def test_non_finite_loss_names_the_bad_term_and_changes_nothing():
    toy = Toy()
    learner = Learner(toy)
    learner.update(batch())
    before = toy.w.detach().clone()
    optimizer_state = {k: v.clone() for k, v in learner.optimizer.state[toy.w].items()}
    with pytest.raises(NonFiniteLossError) as err:
        learner.update(batch(reward=(0.0, float("nan"), 3.0)))
    message = str(err.value)
    assert message.startswith("loss is nan at update 1; non-finite loss terms: critic (nan); all terms: "
                              "{'critic': nan, 'l2': ")
    assert message.endswith("; lower the learning rates or check the env's rewards/observations for NaN/inf")
    assert torch.equal(toy.w, before) and learner.num_updates == 1 and toy.after_update_calls == 1
    assert all(torch.equal(v, optimizer_state[k]) for k, v in learner.optimizer.state[toy.w].items())


def test_non_finite_importance_weights_are_named():
    learner = Learner(Toy())
    with pytest.raises(NonFiniteLossError, match="non-finite loss terms: none of the named terms; the importance "
                                                 "weights contain NaN/inf; all terms"):
        learner.update(batch(), weighted([1.0, float("inf"), 1.0]))


def test_scheduled_learning_rate_is_set_by_update_learning_rates():
    schedule = LinearScheduler("iterations", [(0, 1.0), (10, 0.0)])
    learner = Learner(Toy(lr=schedule))
    assert learner.optimizer.param_groups[0]["lr"] == 1.0  # its value at progress 0
    update_progress(iterations=4)
    learner.update_learning_rates()
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(0.6)
    assert learner.summary()["optimizer/lr.toy"] == pytest.approx(0.6)


def test_after_update_num_updates_and_state_round_trip():
    toy = Toy()
    learner = Learner(toy)
    for _ in range(2):
        learner.update(batch())
    assert toy.after_update_calls == 2 and learner.num_updates == 2
    buffer = io.BytesIO()
    torch.save(learner.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # what checkpoints allow

    twin = Toy()
    twin.load_state_dict(toy.state_dict())
    restored = Learner(twin)
    restored.load_state_dict(state)
    assert restored.num_updates == 2
    for key, value in learner.optimizer.state[toy.w].items():
        assert torch.equal(restored.optimizer.state[twin.w][key], value)
    learner.update(batch())
    restored.update(batch())
    assert torch.equal(toy.w, twin.w) and restored.num_updates == 3


def test_apply_gives_the_same_gradient_as_update():
    a, b = Toy(), Toy()
    learner_a, learner_b = Learner(a), Learner(b)
    info = weighted([0.5, 2.0, 1.0])
    learner_a.update(batch(), info)
    with learner_b.loss_context():
        loss_info = b.calc_loss(batch(), b.train_step(batch()).info)
    returned = learner_b.apply(loss_info, info)
    assert returned is loss_info
    assert torch.equal(a.w.grad, b.w.grad) and torch.equal(a.w, b.w)
    assert learner_b.num_updates == 1 and b.after_update_calls == 1


def test_summary_has_the_trainer_tags_and_computes_loss_terms_only_when_asked():
    toy = Toy()
    learner = Learner(toy, OptimizerConfig(max_grad_norm=10.0))
    assert learner.summary() == {"optimizer/lr.toy": 0.1}  # before any update
    learner.update(batch())
    learner.update(batch())
    assert toy.extra_calls == 0  # the terms' reductions cost nothing while no summary is due
    summary = learner.summary()
    assert toy.extra_calls == 1
    assert sorted(summary) == ["loss/critic", "loss/grad_norm", "loss/l2", "loss/total", "optimizer/lr.toy"]
    assert not summary["loss/total"].requires_grad and summary["loss/total"].dim() == 0


def test_amp_bf16_loss_context_and_summary():
    learner = Learner(Toy(), amp=AmpPolicy(True))
    with learner.loss_context():
        assert torch.is_autocast_enabled("cpu")
    learner.update(batch())
    summary = learner.summary()
    assert summary["amp/loss_scale"] == 1.0 and summary["amp/skipped_steps"] == 0.0
    assert learner.state_dict()["amp"]["skipped_steps"] == 0
