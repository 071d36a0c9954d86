"""A compiled update whose backward fails during the warm-up falls back to eager updates (``compile_scope='loss'``),
and so does a whole update that fails to compile (``compile_scope='update'``, the default).

AOTAutograd compiles the backward lazily, at the first backward of each graph, and CUDA graphs record there too: an
inductor failure or an out-of-memory during a capture comes out of ``backward``, not out of the compiled forward.
The backend below is ``aot_eager`` whose compiled backward raises ``torch.OutOfMemoryError`` at a chosen call, as a
failed CUDA-graph capture would. During the warm-up the update is redone eagerly (same batch, same random numbers:
exactly the eager update), one warning is logged and the compiled code is released; after it, the error is raised.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Callable

import gymnasium as gym
import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

import alfish.learn.compiled
from alfish.algorithms import SacAlgorithm
from alfish.learn.learner import Learner
from alfish.learn.optim import OptimizerConfig
from tests.learn.compiled_checks import batches, flat

OOM = "CUDA out of memory (simulated: capturing the backward's CUDA graph)"


class FailingBackward:
    """``aot_eager`` whose compiled backward raises ``torch.OutOfMemoryError`` at its ``fail_at``-th call."""

    def __init__(self, fail_at: int):
        self.fail_at, self.backward_calls = fail_at, 0
        self._backend = aot_autograd(fw_compiler=lambda graph, _: make_boxed_func(graph.forward),
                                     bw_compiler=self._backward)

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        return self._backend(graph, example_inputs)

    def _backward(self, graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        run = make_boxed_func(graph.forward)

        def backward(args: list) -> Any:
            self.backward_calls += 1
            if self.backward_calls == self.fail_at:
                raise torch.OutOfMemoryError(OOM)
            return run(args)

        backward._boxed_call = True
        return backward


@pytest.fixture
def resets(monkeypatch) -> list[int]:
    """Counts ``torch.compiler.reset`` calls (and resets dynamo around the test)."""
    torch._dynamo.reset()
    calls: list[int] = []
    original = torch.compiler.reset
    monkeypatch.setattr(torch.compiler, "reset", lambda: (calls.append(1), original())[1])
    yield calls
    torch._dynamo.reset()


def sac_learners(backend: FailingBackward, check_interval: int | None = None) -> tuple[Learner, Learner]:
    """A compiled SAC learner on ``backend`` and an eager twin with the same parameters (SAC samples actions in its
    update: the random numbers matter)."""
    torch.manual_seed(0)
    sac = SacAlgorithm(gym.spaces.Box(-1.0, 1.0, (3,)), gym.spaces.Box(-2.0, 2.0, (1,)), hidden_sizes=(8,))
    eager = Learner(copy.deepcopy(sac), OptimizerConfig(), finite_check_interval=check_interval)
    return Learner(sac, OptimizerConfig(), finite_check_interval=check_interval, compile_mode="default",
                   compile_backend=backend, compile_scope="loss"), eager


def fallback_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]


# check interval None: the CPU's loss read every update; 100: the device latch, which keeps each update's loss info
@pytest.mark.parametrize("check_interval", [None, 100])
def test_a_failing_first_compiled_backward_redoes_the_update_eagerly(caplog, resets, check_interval):
    backend = FailingBackward(fail_at=1)
    compiled, eager = sac_learners(backend, check_interval)
    data = batches("sac", torch.device("cpu"))
    with caplog.at_level(logging.WARNING):
        for k in range(3):
            for learner in (compiled, eager):
                torch.manual_seed(k)
                learner.update(data[k])
            # The first update is the eager one, not lost and not doubled; the next ones are eager too.
            assert torch.equal(flat(compiled.params), flat(eager.params)), f"update {k}"
            assert compiled.num_updates == eager.num_updates == k + 1
    assert backend.backward_calls == 1
    assert fallback_warnings(caplog) == ["Learner.compile_mode='default': the compiled backward failed "
                                         f"(OutOfMemoryError: {OOM}); training eagerly"]
    assert compiled.compile_stats()["compiled"] is False
    assert resets == [1]  # the compiled code (and on CUDA the CUDA-graph pool) released, once
    if check_interval == 100:  # the failed compiled update's loss info (and graph) is not kept: one per update
        assert [index for index, *_ in compiled.finite_guard._pending] == [0, 1, 2]


def test_a_failing_compiled_backward_after_the_warm_up_is_an_error(caplog, resets, monkeypatch):
    monkeypatch.setattr(alfish.learn.compiled, "WARM_UP_UPDATES", 2)
    backend = FailingBackward(fail_at=3)  # SAC is one graph: one backward per update
    compiled, _ = sac_learners(backend)
    data = batches("sac", torch.device("cpu"))
    with caplog.at_level(logging.WARNING):
        compiled.update(data[0])
        compiled.update(data[1])
        with pytest.raises(torch.OutOfMemoryError, match="simulated"):
            compiled.update(data[2])
    assert fallback_warnings(caplog) == [] and resets == []
    assert compiled.compile_stats()["compiled"] and compiled.num_updates == 2


class FailingCompiler:
    """A backend that raises at compile time, as an inductor failure on an op it cannot lower."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.calls += 1
        raise RuntimeError("simulated: no lowering for an op of the whole update")


def test_a_whole_update_that_fails_to_compile_is_done_eagerly_after_one_warning(caplog, resets):
    torch.manual_seed(0)
    sac = SacAlgorithm(gym.spaces.Box(-1.0, 1.0, (3,)), gym.spaces.Box(-2.0, 2.0, (1,)), hidden_sizes=(8,))
    eager = Learner(copy.deepcopy(sac), OptimizerConfig())
    backend = FailingCompiler()
    whole = Learner(sac, OptimizerConfig(), compile_mode="default", compile_backend=backend)
    data = batches("sac", torch.device("cpu"))
    with caplog.at_level(logging.WARNING):
        for k in range(3):
            for learner in (whole, eager):
                torch.manual_seed(k)
                learner.update(data[k])
            # the failed first update is the eager one (same random numbers), not lost and not doubled
            assert torch.equal(flat(whole.params), flat(eager.params)), f"update {k}"
    assert backend.calls == 1 and len(resets) == 1
    assert [r.getMessage() for r in caplog.records if "failed" in r.getMessage()] == [
        "Learner.compile_mode='default', compile_scope='update': compiling the whole update failed (RuntimeError: "
        "simulated: no lowering for an op of the whole update); training without it"]
    assert whole.compile_stats()["compiled"] is False and whole.num_updates == eager.num_updates == 3
