"""discounted_return and generalized_advantage_estimation against values computed by hand (DESIGN.md §3.5).

Convention (alfish/losses/returns.py): row ``t`` is one stored step; ``rewards[t]``/``discounts[t]`` belong to the
transition INTO step ``t``; outputs have ``T-1`` rows; a LAST row has no successor (return = its value, advantage 0)
and is masked by callers. Every expectation below is written out by hand in the comments.
"""
import pytest
import torch

from alfish.data.types import StepType
from alfish.losses.returns import discounted_return, generalized_advantage_estimation

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST


def col(*xs, dtype=torch.float32):
    """A [T, 1] column."""
    return torch.tensor(xs, dtype=dtype).unsqueeze(1)


def types(*xs):
    return col(*xs, dtype=torch.int8)


# ---------------------------------------------------------------------------------------------------- plain MID ---

def test_plain_mid_sequence_return_and_gae():
    # T=4, one episode running through the whole window (no LAST): gamma = 0.9, lambda = 0.5.
    r = col(0.0, 1.0, 2.0, 3.0)
    v = col(0.5, 1.0, 1.5, 2.0)
    st = types(F, M, M, M)
    d = col(1.0, 1.0, 1.0, 1.0)
    # ret[2] = r3 + .9 * V3      = 3 + 1.8           = 4.8
    # ret[1] = r2 + .9 * ret[2]  = 2 + 4.32          = 6.32
    # ret[0] = r1 + .9 * ret[1]  = 1 + 5.688         = 6.688
    ret = discounted_return(r, v, st, d, gamma=0.9)
    assert ret.shape == (3, 1)
    torch.testing.assert_close(ret, col(6.688, 6.32, 4.8))
    # delta[t] = r[t+1] + .9 V[t+1] - V[t]:
    # delta2 = 3 + 1.8 - 1.5 = 3.3 ; delta1 = 2 + 1.35 - 1.0 = 2.35 ; delta0 = 1 + 0.9 - 0.5 = 1.4
    # adv2 = 3.3 ; adv1 = 2.35 + .45 * 3.3 = 3.835 ; adv0 = 1.4 + .45 * 3.835 = 3.12575
    adv = generalized_advantage_estimation(r, v, st, d, gamma=0.9, lambda_=0.5)
    assert adv.shape == (3, 1)
    torch.testing.assert_close(adv, col(3.12575, 3.835, 3.3))


# ---------------------------------------------------------------------------------------------- termination ---

# T=5, gamma = 0.5: an episode terminates at step 2 (LAST, discount 0), the env autoresets (step 3 FIRST).
TERM = dict(r=col(0.0, 1.0, 2.0, 0.0, 4.0), v=col(1.0, 1.5, 3.0, 4.0, 5.0), st=types(F, M, L, F, M),
            d=col(1.0, 1.0, 0.0, 1.0, 1.0))


def test_termination_does_not_bootstrap():
    t = TERM
    # ret[3] = r4 + .5 * V4                  = 4 + 2.5  = 6.5
    # ret[2] = V2 (LAST: no successor)       = 3
    # ret[1] = r2 + .5 * d2 * V2             = 2 + 0    = 2      (terminated: no bootstrap)
    # ret[0] = r1 + .5 * ret[1]              = 1 + 1    = 2
    ret = discounted_return(t["r"], t["v"], t["st"], t["d"], gamma=0.5)
    torch.testing.assert_close(ret, col(2.0, 2.0, 3.0, 6.5))
    # delta3 = 4 + 2.5 - 4 = 2.5 -> adv3 = 2.5
    # adv2 = 0 (LAST)
    # delta1 = 2 + .5 * 0 * 3 - 1.5 = 0.5 -> adv1 = 0.5 + .25 * d2 * adv2 = 0.5
    # delta0 = 1 + .5 * 1.5 - 1 = 0.75   -> adv0 = 0.75 + .25 * 0.5 = 0.875
    adv = generalized_advantage_estimation(t["r"], t["v"], t["st"], t["d"], gamma=0.5, lambda_=0.5)
    torch.testing.assert_close(adv, col(0.875, 0.5, 0.0, 2.5))


def test_autoreset_step_does_not_leak_into_previous_episode():
    # Change everything from the FIRST step on (its reward, which the env reports as 0, is set to a huge value, and
    # the values of the new episode): the returns/advantages of steps 0 and 1 (the old episode) must not move.
    t = TERM
    r2, v2 = t["r"].clone(), t["v"].clone()
    r2[3], r2[4] = 1000.0, -50.0
    v2[3], v2[4] = -123.0, 77.0
    for fn, kw in ((discounted_return, {}), (generalized_advantage_estimation, dict(lambda_=0.9))):
        base = fn(t["r"], t["v"], t["st"], t["d"], gamma=0.5, **kw)
        changed = fn(r2, v2, t["st"], t["d"], gamma=0.5, **kw)
        torch.testing.assert_close(changed[:2], base[:2])
        assert not torch.allclose(changed[3], base[3])  # ... while the new episode's step 3 does see them


# ----------------------------------------------------------------------------------------------- truncation ---

def test_truncation_bootstraps_from_value_of_last_observation():
    # Same as TERM, but the episode was cut by a time limit at step 2: LAST with discount 1.
    t = dict(TERM, d=col(1.0, 1.0, 1.0, 1.0, 1.0))
    # ret[1] = r2 + .5 * V2 = 2 + 1.5 = 3.5 ; ret[0] = 1 + .5 * 3.5 = 2.75 ; ret[2] = V2 = 3 ; ret[3] = 6.5
    ret = discounted_return(t["r"], t["v"], t["st"], t["d"], gamma=0.5)
    torch.testing.assert_close(ret, col(2.75, 3.5, 3.0, 6.5))
    # delta1 = 2 + .5 * 3 - 1.5 = 2.0 -> adv1 = 2.0 (adv2 = 0 at LAST cuts the chain)
    # delta0 = 1 + .75 - 1 = 0.75     -> adv0 = 0.75 + .25 * 2 = 1.25
    adv = generalized_advantage_estimation(t["r"], t["v"], t["st"], t["d"], gamma=0.5, lambda_=0.5)
    torch.testing.assert_close(adv, col(1.25, 2.0, 0.0, 2.5))
    # The bootstrap really uses V(obs of the LAST step): raising V2 by 1 raises ret[1] by gamma = .5, ret[0] by .25.
    v_up = t["v"].clone()
    v_up[2] += 1.0
    ret_up = discounted_return(t["r"], v_up, t["st"], t["d"], gamma=0.5)
    torch.testing.assert_close(ret_up[:2] - ret[:2], col(0.25, 0.5))


def test_truncation_in_the_final_row_bootstraps():
    # The window ends on a truncated LAST: ret[1] = r2 + .5 * V2 = 1 + 2 = 3 ; ret[0] = 1 + .5 * 3 = 2.5
    r, v, st, d = col(0.0, 1.0, 1.0), col(0.0, 0.0, 4.0), types(F, M, L), col(1.0, 1.0, 1.0)
    torch.testing.assert_close(discounted_return(r, v, st, d, gamma=0.5), col(2.5, 3.0))
    # Terminated instead (discount 0): ret[1] = 1 ; ret[0] = 1 + .5 = 1.5
    torch.testing.assert_close(discounted_return(r, v, st, col(1.0, 1.0, 0.0), gamma=0.5), col(1.5, 1.0))


# ----------------------------------------------------------------------------------- B=2, different boundaries ---

def two_columns():
    # column 0: TERM (terminates at step 2). column 1: truncated at step 1, then a new episode.
    st = torch.tensor([[F, M], [M, L], [L, F], [F, M], [M, M]], dtype=torch.int8)
    r = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0], [0.0, 3.0], [4.0, 1.0]])
    d = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    v = torch.tensor([[1.0, 2.0], [1.5, 4.0], [3.0, 0.0], [4.0, 1.0], [5.0, 2.0]])
    return r, v, st, d


def test_two_columns_with_different_episode_boundaries():
    r, v, st, d = two_columns()
    # column 0 as in test_termination_does_not_bootstrap: ret = [2, 2, 3, 6.5], adv(.5) = [.875, .5, 0, 2.5]
    # column 1, gamma .5:
    #   ret[3] = r4 + .5 V4 = 1 + 1 = 2 ; ret[2] = r3 + .5 ret[3] = 3 + 1 = 4
    #   ret[1] = V1 = 4 (LAST)          ; ret[0] = r1 + .5 * d1 * V1 = 1 + 2 = 3   (truncated: bootstraps)
    #   delta3 = 1 + 1 - 1 = 1 -> adv3 = 1 ; delta2 = 3 + .5 - 0 = 3.5 -> adv2 = 3.5 + .25 * 1 = 3.75
    #   adv1 = 0 (LAST) ; delta0 = 1 + .5 * 4 - 2 = 1 -> adv0 = 1 + .25 * 0 = 1
    ret = discounted_return(r, v, st, d, gamma=0.5)
    adv = generalized_advantage_estimation(r, v, st, d, gamma=0.5, lambda_=0.5)
    assert ret.shape == adv.shape == (4, 2)
    torch.testing.assert_close(ret, torch.tensor([[2.0, 3.0], [2.0, 4.0], [3.0, 4.0], [6.5, 2.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.875, 1.0], [0.5, 0.0], [0.0, 3.75], [2.5, 1.0]]))
    # Columns are independent: each equals the function applied to that column alone.
    for b in range(2):
        torch.testing.assert_close(ret[:, b:b + 1], discounted_return(r[:, b:b + 1], v[:, b:b + 1], st[:, b:b + 1],
                                                                      d[:, b:b + 1], gamma=0.5))


# ------------------------------------------------------------------------------------- lambda = 1 and lambda = 0 ---

def valid_rows(st):
    return st[:-1] != StepType.LAST


def test_gae_lambda_one_equals_return_minus_value_on_valid_steps():
    r, v, st, d = two_columns()
    # By hand on column 0: ret - V = [2 - 1, 2 - 1.5] = [1, .5] on steps 0, 1; GAE(1): adv1 = .5,
    # adv0 = delta0 + .5 * adv1 = .75 + .25 = 1.0. Column 1: ret - V = [3 - 2, -, 4 - 0, 2 - 1] = [1, -, 4, 1].
    adv = generalized_advantage_estimation(r, v, st, d, gamma=0.5, lambda_=1.0)
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, 0.5, 0.0, 2.5]))  # adv3 = ret3 - V3 = 6.5 - 4
    torch.testing.assert_close(adv[:, 1], torch.tensor([1.0, 0.0, 4.0, 1.0]))
    ret = discounted_return(r, v, st, d, gamma=0.5)
    mask = valid_rows(st)
    torch.testing.assert_close(adv[mask], (ret - v[:-1])[mask])


def test_gae_lambda_zero_is_one_step_td_error():
    r, v, st, d = two_columns()
    adv = generalized_advantage_estimation(r, v, st, d, gamma=0.5, lambda_=0.0)
    # delta[t] = r[t+1] + .5 d[t+1] V[t+1] - V[t], 0 on LAST rows. By hand:
    # col 0: d0 = 1 + .75 - 1 = .75 ; d1 = 2 + 0 - 1.5 = .5 ; row 2 LAST -> 0 ; d3 = 4 + 2.5 - 4 = 2.5
    # col 1: d0 = 1 + 2 - 2 = 1 ; row 1 LAST -> 0 ; d2 = 3 + .5 - 0 = 3.5 ; d3 = 1 + 1 - 1 = 1
    torch.testing.assert_close(adv, torch.tensor([[0.75, 1.0], [0.5, 0.0], [0.0, 3.5], [2.5, 1.0]]))


# ------------------------------------------------------------------------- random streams vs a forward reference ---

def random_stream(T, B, gen):
    """A valid time-step stream per column: LAST is followed by FIRST (reward 0, discount 1); LAST has discount 0
    (termination) or 1 (truncation); discount is 1 everywhere else."""
    st = torch.empty(T, B, dtype=torch.int8)
    d = torch.ones(T, B)
    r = torch.randn(T, B, generator=gen)
    for b in range(B):
        prev = int(torch.randint(0, 2, (), generator=gen))  # start as FIRST or MID
        st[0, b] = prev
        for t in range(1, T):
            if prev == L:
                cur = F
            else:
                cur = L if torch.rand((), generator=gen) < 0.25 else M
                if cur == L and torch.rand((), generator=gen) < 0.5:
                    d[t, b] = 0.0
            st[t, b] = cur
            prev = cur
        r[:, b] = torch.where(st[:, b] == F, 0.0, r[:, b])
    return r, torch.randn(T, B, generator=gen), st, d


def forward_reference(r, v, st, d, gamma, lambda_):
    """Return and GAE of every non-LAST row by explicit forward sums up to the episode end (or the window end)."""
    T, B = r.shape
    ret = torch.zeros(T - 1, B, dtype=torch.float64)
    adv = torch.zeros(T - 1, B, dtype=torch.float64)
    for b in range(B):
        for t in range(T - 1):
            if st[t, b] == L:
                continue
            m = t + 1  # the step the chain stops at: the first LAST after t, or the window's end
            while m < T - 1 and st[m, b] != L:
                m += 1
            g, scale = 0.0, 1.0
            for k in range(t + 1, m + 1):
                g += scale * float(r[k, b])
                scale *= gamma * float(d[k, b])
            ret[t, b] = g + scale * float(v[m, b])
            a, w = 0.0, 1.0
            for k in range(t, m):
                delta = float(r[k + 1, b]) + gamma * float(d[k + 1, b]) * float(v[k + 1, b]) - float(v[k, b])
                a += w * delta
                w *= gamma * lambda_ * float(d[k + 1, b])
            adv[t, b] = a
    return ret.float(), adv.float()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_streams_match_forward_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    r, v, st, d = random_stream(12, 3, gen)
    assert (st == L).any() and (d == 0).any()
    ref_ret, ref_adv = forward_reference(r, v, st, d, gamma=0.9, lambda_=0.8)
    mask = valid_rows(st)
    ret = discounted_return(r, v, st, d, gamma=0.9)
    adv = generalized_advantage_estimation(r, v, st, d, gamma=0.9, lambda_=0.8)
    torch.testing.assert_close(ret[mask], ref_ret[mask])
    torch.testing.assert_close(adv[mask], ref_adv[mask])
    assert (adv[~mask] == 0).all()


def test_masked_standardize_uses_only_masked_entries():
    from alfish.losses.returns import masked_standardize

    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    # over {1, 2, 3}: mean 2, unbiased std sqrt(((1)^2 + 0 + 1^2) / 2) = 1
    out = masked_standardize(x, mask)
    assert torch.allclose(out[:3], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-6)
    assert out[3].item() == pytest.approx(98.0, abs=1e-4)
