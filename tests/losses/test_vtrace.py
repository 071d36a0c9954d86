"""V-trace against values computed by hand from the paper's definition (alfish/losses/vtrace.py's docstring), with
truncation of rho and c, terminations and truncations inside the sequence; and, on on-policy data, equal to the
returns of returns.py. Every expectation is written out in the comments."""
import math

import pytest
import torch

from alfish.data.types import StepType
from alfish.losses.returns import discounted_return, generalized_advantage_estimation
from alfish.losses.vtrace import VTraceSettings, vtrace_returns

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST


def col(*xs, dtype=torch.float32):
    """A [T, 1] column."""
    return torch.tensor(xs, dtype=dtype).unsqueeze(1)


def types(*xs):
    return col(*xs, dtype=torch.int8)


# gamma = 0.5, lambda = 1; V = [1, 2, 3, 4]; rewards into steps 1..3 = [1, 1, 2]; no episode end; the actions of
# steps 0..2 have pi/mu = [2, 0.5, 1] (the last row only bootstraps).
V = col(1.0, 2.0, 3.0, 4.0)
R = col(0.0, 1.0, 1.0, 2.0)
D = col(1.0, 1.0, 1.0, 1.0)
LOG_RHOS = col(math.log(2.0), math.log(0.5), 0.0, 0.0)


def test_truncated_rho_and_c_by_hand():
    # clip_rho = clip_c = clip_pg_rho = 1: rho_bar = c = [1, 0.5, 1].
    # t=2: delta = 1 * (2 + 0.5*4 - 3) = 1;                     v2 = 3 + 1 = 4
    # t=1: delta = 0.5 * (1 + 0.5*3 - 2) = 0.25; v1 - V1 = 0.25 + 0.5 * c1(0.5) * (v2 - V2 = 1) = 0.5;   v1 = 2.5
    # t=0: delta = 1 * (1 + 0.5*2 - 1) = 1;     v0 - V0 = 1 + 0.5 * c0(1) * 0.5 = 1.25;                  v0 = 2.25
    # advantage (lambda = 1) = r_{t+1} + 0.5 * v_{t+1} - V_t (v3 = V3 = 4): A2 = 2 + 2 - 3 = 1; A1 = 1 + 2 - 2 = 1;
    # A0 = 1 + 1.25 - 1 = 1.25
    # pg = min(1, rho) * A = [1.25, 0.5, 1]
    out = vtrace_returns(LOG_RHOS, R, V, types(M, M, M, M), D, VTraceSettings(gamma=0.5))
    torch.testing.assert_close(out.value_target, col(2.25, 2.5, 4.0))
    torch.testing.assert_close(out.advantage, col(1.25, 1.0, 1.0))
    torch.testing.assert_close(out.pg_advantage, col(1.25, 0.5, 1.0))


def test_without_truncation_by_hand():
    # No clips: rho = c = [2, 0.5, 1]. t=2 and t=1 as above (v2 = 4, v1 = 2.5: their ratios are <= 1).
    # t=0: delta = 2 * (1 + 1 - 1) = 2; v0 - V0 = 2 + 0.5 * c0(2) * 0.5 = 2.5; v0 = 3.5
    # A0 = 1 + 0.5*2.5 - 1 = 1.25 (unchanged: A does not depend on rho_0); pg0 = 2 * 1.25 = 2.5
    out = vtrace_returns(LOG_RHOS, R, V, types(M, M, M, M), D,
                         VTraceSettings(gamma=0.5, clip_rho=None, clip_c=None, clip_pg_rho=None))
    torch.testing.assert_close(out.value_target, col(3.5, 2.5, 4.0))
    torch.testing.assert_close(out.pg_advantage, col(2.5, 0.5, 1.0))


def test_lambda_scales_the_trace():
    # lambda = 0.5, clips 1: c = 0.5 * [1, 0.5, 1] = [0.5, 0.25, 0.5]. v2 = 4 (nothing to trace after it).
    # t=1: v1 - V1 = 0.25 + 0.5 * 0.25 * 1 = 0.375;  t=0: v0 - V0 = 1 + 0.5 * 0.5 * 0.375 = 1.09375
    # advantage (step t's own weights out): t=2: 1; t=1: (1 + 1.5 - 2) + 0.5 * 0.5 * 1 = 0.75;
    # t=0: (1 + 1 - 1) + 0.5 * 0.5 * 0.375 = 1.09375.
    # pg_advantage (IMPALA's, no lambda): t=1: 0.5 * (1 + 0.5*4 - 2) = 0.5; t=0: 1 * (1 + 0.5*2.375 - 1) = 1.1875
    out = vtrace_returns(LOG_RHOS, R, V, types(M, M, M, M), D, VTraceSettings(gamma=0.5, lambda_=0.5))
    torch.testing.assert_close(out.value_target, col(2.09375, 2.375, 4.0))
    torch.testing.assert_close(out.advantage, col(1.09375, 0.75, 1.0))
    torch.testing.assert_close(out.pg_advantage, col(1.1875, 0.5, 1.0))


def test_a_termination_inside_the_sequence_stops_the_trace():
    # Steps: MID, LAST (terminated: discount 0), FIRST, MID. gamma = 0.5, ratios 1, V = [1, 2, 3, 4],
    # rewards into steps = [0, 1, 0, 2] (a FIRST step's reward is 0).
    # t=2: delta = 2 + 0.5*4 - 3 = 1; v2 = 4; A2 = 1.      t=1 (LAST): v1 = V1 = 2; A1 = 0 (no successor)
    # t=0: delta = 1 + 0.5*0*2 - 1 = 0; v0 = 1 + 0 + 0.5*0*... = 1; A0 = 0
    # The log-ratio of the LAST step (its stored action is never taken) is not finite and changes nothing.
    log_rhos = col(0.0, float("inf"), 0.0, 0.0)
    out = vtrace_returns(log_rhos, col(0.0, 1.0, 0.0, 2.0), V, types(M, L, F, M), col(1.0, 0.0, 1.0, 1.0),
                         VTraceSettings(gamma=0.5))
    torch.testing.assert_close(out.value_target, col(1.0, 2.0, 4.0))
    torch.testing.assert_close(out.advantage, col(0.0, 0.0, 1.0))
    torch.testing.assert_close(out.pg_advantage, col(0.0, 0.0, 1.0))


def test_a_time_limit_truncation_bootstraps_from_the_last_observation():
    # As above with discount 1 at the LAST step (a time limit): t=0: delta = 1 + 0.5*2 - 1 = 1; v0 = 2; A0 = 1
    # (the next episode's step 2 is not traced into step 0).
    out = vtrace_returns(col(0.0, 0.0, 0.0, 0.0), col(0.0, 1.0, 0.0, 2.0), V, types(M, L, F, M),
                         col(1.0, 1.0, 1.0, 1.0), VTraceSettings(gamma=0.5))
    torch.testing.assert_close(out.value_target, col(2.0, 2.0, 4.0))
    torch.testing.assert_close(out.advantage, col(1.0, 0.0, 1.0))


@pytest.mark.parametrize("lambda_", [1.0, 0.9])
def test_on_policy_data_gives_the_existing_returns(lambda_):
    # rho = 1 everywhere: v - V and the advantage are GAE(lambda); with lambda = 1, v is the discounted return and
    # IMPALA's pg advantage is GAE(1).
    g = torch.Generator().manual_seed(0)
    T, B = 12, 5
    step_types = torch.full((T, B), int(M), dtype=torch.int8)
    step_types[3, 0], step_types[4, 0] = L, F
    step_types[7, 2], step_types[8, 2] = L, F
    step_types[5, 4] = L  # (the window ends before the next FIRST is seen in the others)
    step_types[6, 4] = F
    rewards, values = torch.randn(T, B, generator=g), torch.randn(T, B, generator=g)
    discounts = torch.ones(T, B)
    discounts[3, 0] = 0.0  # env 0 terminates; env 2 and 4 are truncated (discount 1 at LAST)
    out = vtrace_returns(torch.zeros(T, B), rewards, values, step_types, discounts,
                         VTraceSettings(gamma=0.9, lambda_=lambda_))
    gae = generalized_advantage_estimation(rewards, values, step_types, discounts, 0.9, lambda_)
    torch.testing.assert_close(out.value_target, gae + values[:-1])
    torch.testing.assert_close(out.advantage, gae)
    if lambda_ == 1.0:
        torch.testing.assert_close(out.value_target, discounted_return(rewards, values, step_types, discounts, 0.9))
        torch.testing.assert_close(out.pg_advantage, gae)


def test_a_single_step_is_refused():
    with pytest.raises(ValueError, match="at least 2 time steps"):
        vtrace_returns(col(0.0), col(0.0), col(0.0), types(M), col(1.0), VTraceSettings(gamma=0.9))
