"""Compiled updates (``Learner.compile_mode='default'``, the cheap ``aot_eager`` backend) compile every graph an
algorithm needs in their warm-up and never again, whatever the schedules do; see ``compiled_checks``. The GPU tier runs
the same checks with CUDA graphs (``tests/gpu/test_no_recompile.py``)."""
from __future__ import annotations

import pytest
import torch

from alfish.errors import OneLineValueError
from alfish.learn.learner import Learner
from tests.learn.compiled_checks import ALGORITHMS, ON_POLICY, CountingBackend, check_no_recompile


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# The default run checks the algorithms whose updates differ most in shape (several optimizer groups and a learned
# temperature: SAC; a policy delay, two graphs: TD3, and TD3 in the critic-first order, whose kept batch is written in
# place, and SAC in that order; scheduled epsilon: DQN; scheduled clip range and entropy: PPO); the others (one group
# or TD3's graph without the delay) run in the slow tier: ~4 s each.
DEFAULT_TIER = {"dqn", "ppo", "sac", "sac_critic_first", "td3", "td3_critic_first"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in DEFAULT_TIER else pytest.mark.slow)
                                  for n in sorted(ALGORITHMS)])
def test_whole_compiled_updates_do_not_recompile_after_the_warm_up(name):
    # compile_scope None on the CPU: the whole update (loss, gradients, clipping, Adam) in one graph
    check_no_recompile(name, torch.device("cpu"), "default", CountingBackend())


# The loss-only scope (a GPU's default, and the CPU's under DDP or AMP) on the algorithms whose updates differ most
# in shape: several optimizer groups (SAC), a policy delay that makes two graphs (TD3), a scheduled epsilon (DQN).
@pytest.mark.parametrize("name", ["dqn", "sac", "td3"])
def test_compiled_losses_do_not_recompile_after_the_warm_up(name):
    check_no_recompile(name, torch.device("cpu"), "default", CountingBackend(), scope="loss")


@pytest.mark.parametrize("name", sorted(ON_POLICY))
def test_an_on_policy_algorithm_refuses_compiled_updates(name):
    with pytest.raises(OneLineValueError, match=r"^Learner.compile_mode='default' compiles train_step \+ calc_loss "
                                                r"on a sampled batch, which A2cAlgorithm \(on-policy"):
        Learner(ON_POLICY[name](), compile_mode="default")


def test_a_backend_needs_compiled_updates_and_the_default_mode():
    with pytest.raises(OneLineValueError, match=r"^Learner.compile_backend='aot_eager' is set but compile_mode is "
                                                r"None"):
        Learner(ALGORITHMS["bc"][0](), compile_backend="aot_eager")
    with pytest.raises(OneLineValueError, match=r"^Learner.compile_mode='max-autotune' is a mode of the inductor "
                                                r"backend"):
        Learner(ALGORITHMS["bc"][0](), compile_mode="max-autotune", compile_backend="aot_eager")
    with pytest.raises(OneLineValueError, match=r"^Learner.compile_mode='default', compile_backend='nonsense': "
                                                r"Invalid backend: 'nonsense'"):
        Learner(ALGORITHMS["bc"][0](), compile_mode="default", compile_backend="nonsense")
