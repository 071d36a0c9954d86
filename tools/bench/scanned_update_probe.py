"""Would one compiled call for an iteration's K updates beat K compiled calls? A replica of the DQN conf's update.

SBX's DQN runs an iteration's 128 gradient steps as one XLA call (``jax.lax.scan`` over the update); alfish's
compiled whole update (``alfish/learn/whole_update.py``) is one compiled call per update, and dynamo's and
AOTAutograd's wrappers around each call were ~19% of a compiled DQN update (tools/bench/README.md). Here the conf's
update (``confs/dqn_cartpole.gin``: a 4-256-256-2 Q-network, double Q against a target network fixed for the K
updates, Huber loss weighted by importance weights, the gradient norm clipped to 10, Adam lr 2.3e-3, batch 64) is
written functionally (parameters and Adam moments as values, ``torch.func.grad``) and compiled two ways:

  * ``loop``: one compiled update, called K times (what the Learner does now, without its bookkeeping);
  * ``scan``: ``torch._higher_order_ops.scan`` over the K mini-batches in one compiled call. It needs
    ``torch._dynamo.config.capture_scalar_outputs = True``: inductor lowers the scan to a while loop that reads its
    index with ``.item()`` (without it: ``DataDependentOutputException: aten._local_scalar_dense``).

Both start from the same parameters and mini-batches; the final parameters must agree (checked, printed), so the
timing compares the same computation. Alternated blocks, one thread::

    python tools/bench/scanned_update_probe.py [--updates 128] [--blocks 10] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch._dynamo
from torch._higher_order_ops.scan import scan

OBS, ACTIONS, HIDDEN, BATCH = 4, 2, 256, 64
GAMMA, LR, MAX_NORM, BETAS, EPS = 0.99, 2.3e-3, 10.0, (0.9, 0.999), 1e-8


def init_params(generator: torch.Generator) -> list[torch.Tensor]:
    """Weights ``[out, in]`` and biases of the three layers, as ``nn.Linear`` draws them."""
    params = []
    for fan_in, fan_out in ((OBS, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, ACTIONS)):
        bound = fan_in ** -0.5
        params += [torch.empty(fan_out, fan_in).uniform_(-bound, bound, generator=generator),
                   torch.empty(fan_out).uniform_(-bound, bound, generator=generator)]
    return params


def q_values(params: list[torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
    """``[B, OBS] -> [B, ACTIONS]``."""
    w1, b1, w2, b2, w3, b3 = params
    hidden = torch.relu(torch.nn.functional.linear(obs, w1, b1))
    hidden = torch.relu(torch.nn.functional.linear(hidden, w2, b2))
    return torch.nn.functional.linear(hidden, w3, b3)


def loss(params: list[torch.Tensor], target_params: list[torch.Tensor], batch: tuple) -> torch.Tensor:
    """Double-Q Huber loss of one mini-batch, importance-weighted (prioritized replay's weights)."""
    obs, action, reward, discount, next_obs, weights = batch
    with torch.no_grad():
        chosen = q_values(params, next_obs).argmax(-1, keepdim=True)
        value = q_values(target_params, next_obs).gather(-1, chosen).squeeze(-1)
        target = reward + GAMMA * discount * value
    # (a comparison with arange, not gather on the action: no index check that reads a value back)
    taken = action.unsqueeze(-1) == torch.arange(ACTIONS)
    q = (q_values(params, obs) * taken).sum(-1)
    return (torch.nn.functional.huber_loss(q, target, reduction="none") * weights).mean()


def update(carry: tuple, batch: tuple, target_params: list[torch.Tensor]) -> tuple:
    """One update: gradients, norm clipping, Adam (torch's arithmetic). ``carry``: (params, exp_avg, exp_avg_sq,
    step); returns the new carry and the batch's |loss| (a per-update output, as priorities would be)."""
    params, exp_avg, exp_avg_sq, step = carry
    grads, value = torch.func.grad_and_value(loss)(params, target_params, batch)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = torch.clamp(MAX_NORM / (total + 1e-6), max=1.0)
    step = step + 1
    new_params, new_avg, new_sq = [], [], []
    for p, g, m, v in zip(params, grads, exp_avg, exp_avg_sq):
        g = g * scale
        m = torch.lerp(m, g, 1 - BETAS[0])
        v = v * BETAS[1] + (1 - BETAS[1]) * g * g
        denom = v.sqrt() / (1 - BETAS[1] ** step).sqrt() + EPS
        new_params.append(p - (LR / (1 - BETAS[0] ** step)) * m / denom)
        new_avg.append(m)
        new_sq.append(v)
    return (new_params, new_avg, new_sq, step), value


def make_batches(k: int, generator: torch.Generator) -> tuple:
    """K mini-batches, each field stacked ``[K, BATCH, ...]``."""
    return (torch.randn(k, BATCH, OBS, generator=generator), torch.randint(0, ACTIONS, (k, BATCH), generator=generator),
            torch.randn(k, BATCH, generator=generator), torch.ones(k, BATCH),
            torch.randn(k, BATCH, OBS, generator=generator), torch.rand(k, BATCH, generator=generator) + 0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=128, help="K: updates per iteration (the conf's 128)")
    parser.add_argument("--blocks", type=int, default=10, help="alternated timing blocks of K updates each way")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the DQN conf's default here: 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch._dynamo.config.capture_scalar_outputs = True
    generator = torch.Generator().manual_seed(0)
    params = init_params(generator)
    target_params = [p.clone() for p in params]
    batches = make_batches(args.updates, generator)
    start = (params, [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params], torch.zeros(()))

    one = torch.compile(lambda carry, batch: update(carry, batch, target_params))

    def loop() -> tuple:
        carry, values = start, []
        for i in range(args.updates):
            carry, value = one(carry, tuple(field[i] for field in batches))
            values.append(value)
        return carry, torch.stack(values)

    scanned = torch.compile(lambda carry, xs: scan(lambda c, b: update(c, b, target_params), carry, xs))

    compile_s = {}
    for name, run in (("loop", loop), ("scan", lambda: scanned(start, batches))):
        t = time.perf_counter()
        run()
        compile_s[name] = time.perf_counter() - t
    (loop_carry, loop_values), (scan_carry, scan_values) = loop(), scanned(start, batches)
    params_gap = max(float((a - b).abs().max()) for a, b in zip(loop_carry[0], scan_carry[0]))
    values_gap = float((loop_values - scan_values).abs().max())
    times: dict[str, list[float]] = {"loop": [], "scan": []}
    for _ in range(args.blocks):
        for name, run in (("loop", loop), ("scan", lambda: scanned(start, batches))):
            t = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - t) / args.updates * 1e6)
    loop_us, scan_us = statistics.median(times["loop"]), statistics.median(times["scan"])
    print(f"K={args.updates} updates, {args.threads} thread(s), medians of {args.blocks} alternated blocks: "
          f"one compiled call per update {loop_us:.0f} us/update, one scanned call {scan_us:.0f} us/update "
          f"({loop_us / scan_us:.2f}x); minima {min(times['loop']):.0f} / {min(times['scan']):.0f} us; first call "
          f"(compile) {compile_s['loop']:.1f} s / {compile_s['scan']:.1f} s; final parameters agree to "
          f"{params_gap:.1e}, per-update losses to {values_gap:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
