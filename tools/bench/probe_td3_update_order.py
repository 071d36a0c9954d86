"""Does the order of TD3's critic and actor updates matter? A probe on a finished run's checkpoints.

alfish's DDPG/TD3 trains both in one loss and one backward (DESIGN.md §3.2): the actor's gradient reads the critic
*before* this update's critic step. SB3 (and Fujimoto's reference TD3) steps the critics first and builds the actor's
loss on the *updated* critic. For replay batches of a checkpoint, this probe measures

  * the actor's gradient and its Adam step (with the run's own Adam moments) both ways: cosine and relative
    difference, and
  * the same figures between two different batches with the same critic: the minibatch noise every update has anyway,

so the order's effect is read against a scale. Usage (a TD3 results directory of the default MLP networks)::

    python tools/bench/probe_td3_update_order.py RUN_DIR --steps 29000 145000 290000 [--batches 30]

Prints a line per checkpoint (medians over the batches) and, with ``--json``, the rows as JSON.
"""
from __future__ import annotations

import argparse
import copy
import json
import pathlib
import statistics

import torch

from alfish.algorithms.ddpg import DdpgAlgorithm, Td3Algorithm
from alfish.data.types import Experience
from alfish.replay.offline.from_run import load_run_checkpoint, read_run

LAST = 2  # StepType.LAST: no transition goes out of it (the env reset)


def load_checkpoint(ckpt: pathlib.Path, **td3_args: float) -> tuple[DdpgAlgorithm, dict, dict[str, torch.Tensor]]:
    """The algorithm (TD3 with the checkpoint's hidden sizes and ``td3_args``: the run's gamma and target smoothing,
    which the checkpoint's tensors do not hold), the Adam state dict and the replay as whole episodes
    ``{field: [T, ...]}`` of checkpoint directory ``ckpt`` (verified against its manifest, tensors only: the run's
    config is not read)."""
    loaded = load_run_checkpoint(ckpt)
    steps = read_run(ckpt)
    state = loaded.tensors["algorithm"]
    layers = sorted(int(k.split(".")[1]) for k in state if k.startswith("actor.") and k.endswith(".weight"))
    hidden = [int(state[f"actor.{i}.weight"].shape[0]) for i in layers[:-1]]
    algorithm = Td3Algorithm(steps.observation_space, steps.action_space, hidden_sizes=hidden, **td3_args)
    algorithm.load_state_dict(state)
    algorithm._set_updates_done(algorithm.policy_delay - 1)  # the probed update is one where the delayed actor is due
    columns = {name: torch.as_tensor(getattr(steps, name))
               for name in ("step_type", "reward", "discount", "observation", "action")}
    return algorithm, loaded.tensors["learner"]["optimizer"], columns


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|b - a| / |a|``."""
    return float((b - a).norm() / a.norm())


class Probe:
    """The two update orders on one checkpoint's algorithm, optimizer moments and replay."""

    def __init__(self, algorithm: DdpgAlgorithm, optimizer: dict, columns: dict[str, torch.Tensor], batch: int,
                 seed: int):
        self.algorithm, self.optimizer, self.columns, self.batch = algorithm, optimizer, columns, batch
        self.valid = torch.nonzero(columns["step_type"][:-1] != LAST).squeeze(-1)  # transition t -> t + 1
        self.generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # TD3's target smoothing noise
        self.actor_params = list(algorithm.actor.parameters())
        self.critic_params = list(algorithm.critics.parameters())

    def sample(self) -> Experience:
        """``batch`` random transitions as ``[L=2, B]`` experience."""
        i = self.valid[torch.randint(len(self.valid), (self.batch,), generator=self.generator)]
        both = torch.stack([i, i + 1])                                          # [2, B]
        c = self.columns
        return Experience(c["step_type"][both], c["reward"][both], c["discount"][both],
                          c["observation"][both].float(), c["action"][both], torch.zeros_like(both))

    def _losses(self, exp: Experience) -> tuple[torch.Tensor, torch.Tensor]:
        """alfish's own critic and actor losses of ``exp`` (means over the valid transitions)."""
        info = self.algorithm.train_step(exp).info
        valid = (exp.step_type[:-1] != LAST).flatten().float()
        return (info.critic_loss * valid).sum() / valid.sum(), (info.actor_loss * valid).sum() / valid.sum()

    def actor_gradient(self, exp: Experience) -> torch.Tensor:
        _, actor_loss = self._losses(exp)
        return flat(torch.autograd.grad(actor_loss, self.actor_params))

    def critic_step(self, exp: Experience) -> None:
        """One Adam step of the critics (their group's lr and the run's moments) on ``exp``'s critic loss."""
        group = next(g for g in self.optimizer["param_groups"] if g.get("name") == "critic")
        adam = torch.optim.Adam(self.critic_params, lr=group["lr"], betas=group["betas"], eps=group["eps"])
        state = adam.state_dict()
        state["state"] = {i: {k: v.clone() for k, v in self.optimizer["state"][index].items()}
                          for i, index in enumerate(group["params"])}
        adam.load_state_dict(state)
        critic_loss, _ = self._losses(exp)
        adam.zero_grad()
        critic_loss.backward()
        adam.step()

    def actor_adam_step(self, gradient: torch.Tensor) -> torch.Tensor:
        """The actor's Adam step for ``gradient`` from the run's moments (torch's Adam arithmetic), flat."""
        group = next(g for g in self.optimizer["param_groups"] if g.get("name") == "actor")
        (b1, b2), eps, lr = group["betas"], group["eps"], group["lr"]
        steps, offset = [], 0
        for index, p in zip(group["params"], self.actor_params):
            state = self.optimizer["state"][index]
            g = gradient[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
            t = float(state["step"]) + 1
            m = b1 * state["exp_avg"] + (1 - b1) * g
            v = b2 * state["exp_avg_sq"] + (1 - b2) * g * g
            steps.append(-lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps))
        return flat(steps)

    def measure(self) -> dict[str, float]:
        """One batch: the actor's gradient and Adam step with the critic before / after its step, and with another
        batch (same critic)."""
        exp, other = self.sample(), self.sample()
        before, elsewhere = self.actor_gradient(exp), self.actor_gradient(other)
        saved = copy.deepcopy(self.algorithm.critics.state_dict())
        self.critic_step(exp)
        after = self.actor_gradient(exp)
        self.algorithm.critics.load_state_dict(saved)
        step_before, step_after, step_elsewhere = (self.actor_adam_step(g) for g in (before, after, elsewhere))
        return dict(grad_cos_order=cosine(before, after), grad_rel_order=relative(before, after),
                    grad_cos_batch=cosine(before, elsewhere), grad_rel_batch=relative(before, elsewhere),
                    step_cos_order=cosine(step_before, step_after), step_rel_order=relative(step_before, step_after),
                    step_cos_batch=cosine(step_before, step_elsewhere),
                    step_rel_batch=relative(step_before, step_elsewhere))


def probe(ckpt: pathlib.Path, batches: int, batch: int = 256, seed: int = 0, **td3_args: float) -> dict[str, float]:
    """Medians over ``batches`` batches of ``Probe.measure`` on checkpoint ``ckpt``."""
    p = Probe(*load_checkpoint(ckpt, **td3_args), batch=batch, seed=seed)
    rows = [p.measure() for _ in range(batches)]
    return {key: statistics.median(r[key] for r in rows) for key in rows[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a TD3/DDPG results directory (default MLP networks)")
    parser.add_argument("--steps", nargs="+", type=int, required=True, help="checkpoints (ckpt-<step>) to probe")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--gamma", type=float, default=0.99, help="the run's (Td3Algorithm.gamma)")
    parser.add_argument("--target_policy_noise", type=float, default=0.2, help="the run's")
    parser.add_argument("--target_noise_clip", type=float, default=0.5, help="the run's")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {}
    for step in args.steps:
        ckpt = pathlib.Path(args.run_dir) / "checkpoints" / f"ckpt-{step}"
        if not (ckpt / "manifest.json").is_file():
            parser.error(f"{ckpt} is not a checkpoint directory (no manifest.json); list {ckpt.parent} for the steps")
        r = results[step] = probe(ckpt, args.batches, args.batch, gamma=args.gamma,
                                  target_policy_noise=args.target_policy_noise,
                                  target_noise_clip=args.target_noise_clip)
        print(f"ckpt-{step}: actor gradient, before vs after the critic step: cos {r['grad_cos_order']:.4f}, "
              f"rel. diff {r['grad_rel_order']:.3f} (another batch: cos {r['grad_cos_batch']:.4f}, rel. diff "
              f"{r['grad_rel_batch']:.3f}); actor Adam step: cos {r['step_cos_order']:.5f}, rel. diff "
              f"{r['step_rel_order']:.4f} (another batch: cos {r['step_cos_batch']:.4f}, rel. diff "
              f"{r['step_rel_batch']:.3f})", flush=True)
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
