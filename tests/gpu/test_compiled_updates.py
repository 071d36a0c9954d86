"""``Learner.compile_mode``: a compiled update (``'reduce-overhead'``: CUDA graphs on a GPU; ``'default'`` when the
tests run on the CPU) computes what the eager one does, and nothing it captured goes stale.

CUDA graphs replay kernels on the memory addresses they were captured with. The failure seen elsewhere: weights
pushed into the model afterwards (a ``load_state_dict`` that replaces tensors, a policy copy updated by assignment)
are not what the replayed graph reads, so the policy or the update silently keeps using old weights. Here: after
optimizer steps and after ``load_state_dict`` the (eager) policy acts differently, and the compiled update continues
from the pushed weights exactly as an eager update would. A short SAC run with compiled updates learns, which it
could not if its updates or its acting policy missed the new parameters.

Comparing parameters: the first Adam steps move each weight by about ``lr * sign(gradient)``, so a gradient within
rounding of zero (different kernels, different rounding) can flip one weight's step; the test therefore bounds the
distance between the compiled and eager parameter vectors by 1% of how far the eager ones moved, which a stale or
wrong update (a distance comparable to the move itself) cannot meet.
"""
from __future__ import annotations

import copy
import inspect
from typing import Iterator

import pytest
import torch
import torch._inductor.config

from alfish.algorithms import DqnAlgorithm, SacAlgorithm, Td3Algorithm
from alfish.learn.learner import Learner
from alfish.learn.optim import OptimizerConfig
from tests.integration.inprocess import eval_log, run_trainer_from_text
from tests.integration.test_learning import SAC_POINT_GOAL
from tests.learn.test_meta_device import B_, BOX, DISCRETE, L_, OBS, meta_experience, meta_time_step

from .helpers import DEVICE, NO_FINITE_READS, ON_CUDA, device_bindings, with_values

MODE = "reduce-overhead" if ON_CUDA else "default"
# TD3: two graphs (actor due / not due), and no actor gradient on the steps it is not due, compiled as eagerly.
ALGORITHMS = {"sac": (SacAlgorithm, BOX, L_), "dqn": (DqnAlgorithm, DISCRETE, 2), "td3": (Td3Algorithm, BOX, L_)}


def learner(alg: torch.nn.Module, compile_mode: str | None) -> Learner:
    if "compile_mode" not in inspect.signature(Learner).parameters:
        pytest.fail("Learner has no compile_mode parameter")
    return Learner(alg, OptimizerConfig(), device=DEVICE, finite_check_interval=NO_FINITE_READS,
                   compile_mode=compile_mode)


def assert_compiled(compiled: Learner) -> None:
    stats = compiled.compile_stats()
    assert stats["compiled"], "compilation failed and the Learner fell back to eager updates (see the logged warning)"
    assert not stats["recompile_limit_hit"], "dynamo hit its recompile limit and ran the update eagerly"


def flat(params) -> torch.Tensor:
    return torch.cat([p.detach().flatten().float() for p in params])


def assert_same_updates(compiled: Learner, eager: Learner, start: torch.Tensor) -> None:
    """The parameters of both learners, having started at ``start`` (flat), agree to 1% of the distance moved."""
    c, e = flat(compiled.params), flat(eager.params)
    moved, gap = (e - start).norm().item(), (c - e).norm().item()
    assert moved > 0, "the eager updates changed nothing"
    assert gap <= 1e-2 * moved, (f"compiled ({MODE}) and eager parameters differ by {gap:.3g} after moving "
                                 f"{moved:.3g}; largest element difference {(c - e).abs().max().item():.3g}")


def update_both(compiled: Learner, eager: Learner, batches: list, first_seed: int = 0) -> None:
    """The same updates on both, each drawing the same random numbers (SAC samples actions in its update)."""
    for k, batch in enumerate(batches):
        for lrn in (compiled, eager):
            torch.manual_seed(first_seed + k)
            lrn.update(batch)


@pytest.fixture(autouse=True)
def same_random_numbers() -> Iterator[None]:
    """Compiled code draws random numbers with torch's own generator, as eager code does (inductor would otherwise
    generate its own, different, stream); each test compiles afresh."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(fallback_random=True):
        yield
    torch._dynamo.reset()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_compiled_updates_give_the_eager_parameters(algo):
    cls, space, length = ALGORITHMS[algo]
    torch.manual_seed(0)
    alg = cls(OBS, space, hidden_sizes=(64, 64))
    compiled, eager = learner(alg, MODE), learner(copy.deepcopy(alg), None)
    start = flat(eager.params)
    batches = [with_values(meta_experience(space, length, B_), space, seed=k) for k in range(5)]
    update_both(compiled, eager, batches)
    assert_compiled(compiled)
    assert_same_updates(compiled, eager, start)


@pytest.mark.timeout(600)
def test_the_policy_and_the_compiled_update_see_optimizer_steps_and_pushed_weights():
    torch.manual_seed(0)
    compiled = learner(SacAlgorithm(OBS, BOX, hidden_sizes=(64, 64)), MODE)
    alg = compiled.algorithm
    time_step = with_values(meta_time_step(B_, BOX), BOX, seed=99)
    batches = [with_values(meta_experience(BOX, L_, B_), BOX, seed=k) for k in range(6)]

    def actions(policy: torch.nn.Module) -> torch.Tensor:
        with torch.inference_mode():
            return policy.predict_step(time_step).output.clone()

    for batch in batches[:3]:
        compiled.update(batch)
    assert_compiled(compiled)
    before = actions(alg)
    for batch in batches[3:]:
        compiled.update(batch)
    assert not torch.allclose(actions(alg), before), "the policy did not see the optimizer steps"

    torch.manual_seed(1)
    pushed = SacAlgorithm(OBS, BOX, hidden_sizes=(64, 64)).to(DEVICE)
    alg.load_state_dict(pushed.state_dict())  # a weight push, as a resume or a parameter publish makes
    torch.testing.assert_close(actions(alg), actions(pushed))

    # The compiled update continues from the pushed weights (and the optimizer state it had), as an eager one does.
    eager = learner(copy.deepcopy(alg), None)
    eager.load_state_dict(copy.deepcopy(compiled.state_dict()))
    start = flat(eager.params)
    update_both(compiled, eager, batches[:3], first_seed=100)
    assert_same_updates(compiled, eager, start)


@pytest.mark.learning
@pytest.mark.timeout(900)
def test_sac_learns_point_goal_with_compiled_updates(tmp_path):
    root = run_trainer_from_text(tmp_path, SAC_POINT_GOAL + device_bindings() + f"Learner.compile_mode = '{MODE}'\n")
    result = [r["average_return"] for r in eval_log(root)]
    assert result[0] < -1.5 and max(result) >= -1.1, result  # the CPU learning test's thresholds
    assert sum(result[-3:]) / 3 >= -1.15, result
