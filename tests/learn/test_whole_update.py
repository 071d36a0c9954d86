"""The whole update as one compiled function (``Learner.compile_scope='update'``, the CPU's default with a
``compile_mode``): its Adam step against torch's fused one, its clipping against ``OptimizerConfig.clip``, a
non-finite loss that changes nothing, importance weights, and where it does not apply. Every algorithm's whole update
against its eager update and without recompiles: ``tests/learn/test_compiled_no_recompile.py``."""
from __future__ import annotations

import copy
import logging

import pytest
import torch

from alfish.errors import NonFiniteLossError, OneLineValueError
from alfish.learn import whole_update
from alfish.learn.amp import AmpPolicy
from alfish.learn.learner import Learner
from alfish.learn.optim import OptimizerConfig
from alfish.learn.whole_update import adam_step, clip_gradients
from tests.learn.test_learner import Toy, batch, weighted


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name, weight_decay", [("adam", 0.0), ("adam", 0.1), ("adamw", 0.1)])
def test_adam_step_is_torchs_fused_adam(name, weight_decay):
    torch.manual_seed(0)
    ours, theirs = torch.randn(5, 3), torch.nn.Parameter(torch.randn(5, 3))
    ours.copy_(theirs.detach())
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    optimizer = cls([theirs], lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=weight_decay, fused=True)
    state = dict(step=torch.zeros(()), exp_avg=torch.zeros(5, 3), exp_avg_sq=torch.zeros(5, 3))
    group = dict(betas=(0.8, 0.99), eps=1e-6, weight_decay=weight_decay)
    for k in range(6):
        grad = torch.randn(5, 3) * (k + 1)
        theirs.grad = grad.clone()
        optimizer.step()
        adam_step(ours, grad, state, torch.tensor(0.01), group, name == "adamw", torch.tensor(True))
    torch.testing.assert_close(ours, theirs.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(state["exp_avg_sq"], optimizer.state[theirs]["exp_avg_sq"], rtol=1e-6, atol=1e-9)
    assert float(state["step"]) == float(optimizer.state[theirs]["step"]) == 6.0


def test_adam_step_on_a_non_finite_loss_writes_nothing():
    param, grad = torch.ones(3), torch.tensor([1.0, float("nan"), 2.0])
    state = dict(step=torch.tensor(2.0), exp_avg=torch.full((3,), 0.5), exp_avg_sq=torch.full((3,), 0.25))
    before = {k: v.clone() for k, v in state.items()}
    adam_step(param, grad, state, torch.tensor(0.1), dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0), False,
              torch.tensor(False))
    assert torch.equal(param, torch.ones(3)) and all(torch.equal(state[k], before[k]) for k in state)


def test_clipping_is_optimizer_configs():
    # by hand: grads [3, 4] and [12]: values clamped to 5 -> [3, 4] and [5], total norm sqrt(9 + 16 + 25) = 7.0711;
    # scaled by 2 / (7.0711 + 1e-6) = 0.28284
    grads = [torch.tensor([3.0, 4.0]), torch.tensor([12.0])]
    clipped, total = clip_gradients(grads, OptimizerConfig(max_grad_norm=2.0, max_grad_value=5.0))
    assert float(total) == pytest.approx(50 ** 0.5)
    torch.testing.assert_close(clipped[0], torch.tensor([0.848528, 1.131371]))
    torch.testing.assert_close(clipped[1], torch.tensor([1.414214]))
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    OptimizerConfig(max_grad_norm=2.0, max_grad_value=5.0).clip(params)
    assert all(torch.allclose(p.grad, c) for p, c in zip(params, clipped))
    unclipped, none = clip_gradients(grads, OptimizerConfig())
    assert none is None and all(torch.equal(a, b) for a, b in zip(unclipped, grads))


def learners(**config) -> tuple[Learner, Learner]:
    """A whole-update Learner (aot_eager: the graphs without code generation) and its eager twin on the toy."""
    toy = Toy()
    eager = Learner(copy.deepcopy(toy), OptimizerConfig(**config))
    whole = Learner(toy, OptimizerConfig(**config), compile_mode="default", compile_backend="aot_eager")
    return whole, eager


def test_whole_updates_with_importance_weights_and_clipping_are_the_eager_ones():
    whole, eager = learners(max_grad_norm=0.5)
    for k in range(5):
        info = whole.update(batch(reward=(0.0, float(k), 3.0)), weighted([1.0, 0.5, 0.25]))
        eager.update(batch(reward=(0.0, float(k), 3.0)), weighted([1.0, 0.5, 0.25]))
        torch.testing.assert_close(whole.algorithm.w, eager.algorithm.w, rtol=1e-5, atol=1e-5)  # (float rounding)
        torch.testing.assert_close(whole.last_loss.loss, eager.last_loss.loss)
    assert whole.compile_stats()["compiled_updates"] == 5 and whole.num_updates == 5
    assert whole.algorithm.after_update_calls == 5
    assert info.loss.shape == (1, 3) and not info.loss.requires_grad
    # the summaries read the same values: the named terms, the norm before clipping, the learning rate
    ours, theirs = whole.summary(), eager.summary()
    assert set(ours) == set(theirs)
    # ("loss/l2" reads w: compiled, its terms are evaluated inside the update, before the step, as compile_scope='loss'
    # evaluates them; eagerly the lazy term reads w when the summary does, after it)
    for tag in ("loss/total", "loss/critic", "loss/grad_norm"):
        torch.testing.assert_close(ours[tag], theirs[tag])


def test_a_non_finite_loss_changes_nothing_and_is_named():
    whole, _ = learners()
    whole.update(batch())
    w, state = whole.algorithm.w.detach().clone(), copy.deepcopy(whole.optimizer.state[whole.algorithm.w])
    with pytest.raises(NonFiniteLossError, match=r"^loss is nan at update 1; non-finite loss terms: critic \(nan\)"):
        whole.update(batch(reward=(0.0, float("nan"), 3.0)))
    assert torch.equal(whole.algorithm.w, w) and whole.num_updates == 1
    assert all(torch.equal(v, state[k]) for k, v in whole.optimizer.state[whole.algorithm.w].items())


def test_where_the_whole_update_does_not_apply_the_cpu_default_trains_eagerly_after_one_warning(caplog):
    with caplog.at_level(logging.WARNING):
        sgd = Learner(Toy(), OptimizerConfig(name="sgd"), compile_mode="default", compile_backend="aot_eager")
    assert [r.getMessage() for r in caplog.records] == [
        "Learner.compile_mode='default' cannot compile the whole update here (it writes the Adam and AdamW steps "
        "only, not SGD's), and on the CPU the loss module compiled alone is no faster than eager "
        "(tools/bench/bench_compiled_update.py): eager updates (compile_scope='loss' compiles it anyway)"]
    assert sgd._whole is None and sgd._compiled is None
    w = sgd.algorithm.w.detach().clone()
    sgd.update(batch())
    assert not torch.equal(sgd.algorithm.w, w) and sgd.compile_stats() is None  # (eager: no compiled object)


def test_where_the_whole_update_does_not_apply_scope_update_compiles_the_loss_after_one_warning(caplog):
    with caplog.at_level(logging.WARNING):
        sgd = Learner(Toy(), OptimizerConfig(name="sgd"), compile_mode="default", compile_backend="aot_eager",
                      compile_scope="update")
        amp = Learner(Toy(), OptimizerConfig(), amp=AmpPolicy(True, "cpu", "bfloat16"), compile_mode="default",
                      compile_backend="aot_eager", compile_scope="update")
    assert [r.getMessage() for r in caplog.records] == [
        "Learner.compile_scope='update' cannot compile the whole update here (it writes the Adam and AdamW steps "
        "only, not SGD's): compiling the loss module only (compile_scope='loss')",
        "Learner.compile_scope='update' cannot compile the whole update here (AMP's autocast and gradient scaler "
        "wrap the loss and the step): compiling the loss module only (compile_scope='loss')"]
    for learner in (sgd, amp):
        learner.update(batch())
        assert learner.compile_stats()["compiled_updates"] == 1  # the loss module's compiled forward ran


def test_compile_scope_errors_are_one_line():
    with pytest.raises(OneLineValueError, match=r"^Learner.compile_scope='everything': use 'update'"):
        Learner(Toy(), compile_mode="default", compile_scope="everything")
    with pytest.raises(OneLineValueError, match=r"^Learner.compile_scope='loss' is set but compile_mode is None"):
        Learner(Toy(), compile_scope="loss")


def test_a_whole_update_learner_resumes_from_its_checkpoint_exactly():
    # 6 updates in one go, against 3, a checkpoint (the algorithm's and the Learner's state), a fresh Learner that
    # loads it (its optimizer state: new tensors, which the compiled update must read), and 3 more
    data = [batch(reward=(0.0, float(k), 3.0)) for k in range(6)]
    straight, _ = learners(max_grad_norm=0.5)
    for b in data:
        straight.update(b)
    first, _ = learners(max_grad_norm=0.5)
    for b in data[:3]:
        first.update(b)
    saved = copy.deepcopy((first.algorithm.state_dict(), first.state_dict()))
    resumed, _ = learners(max_grad_norm=0.5)
    resumed.algorithm.load_state_dict(saved[0])
    resumed.load_state_dict(saved[1])
    for b in data[3:]:
        resumed.update(b)
    assert torch.equal(resumed.algorithm.w, straight.algorithm.w) and resumed.num_updates == 6
    ours, theirs = (learner.optimizer.state[learner.algorithm.w] for learner in (resumed, straight))
    assert all(torch.equal(ours[k], theirs[k]) for k in ("step", "exp_avg", "exp_avg_sq"))


def test_a_torch_whose_dynamo_cannot_trace_the_gradients_compiles_the_loss_only(monkeypatch, caplog):
    # alfish.DETECTED_TORCH_FEATURES: without trace_autograd_ops the whole update cannot be one graph
    monkeypatch.setattr(whole_update, "dynamo_traces_gradients", lambda: False)
    with caplog.at_level(logging.WARNING):
        learner = Learner(Toy(), OptimizerConfig(), compile_mode="default", compile_backend="aot_eager",
                          compile_scope="update")
    assert learner._whole is None and learner._compiled is not None
    assert [r.getMessage() for r in caplog.records] == [
        f"Learner.compile_scope='update' cannot compile the whole update here (torch {torch.__version__}'s dynamo "
        "cannot trace torch.autograd.grad (trace_autograd_ops)): compiling the loss module only (compile_scope='loss')"]
