"""Where one env step's time goes, alfish beside Stable-Baselines3, at the hyperparameters of bench_vs_sb3.py.

    python tools/bench/profile_step.py [--algos sac td3 ddpg dqn dqn_noper dqn_plain ppo a2c] [--steps N] [--threads T]

Each (framework, algorithm) job runs in a fresh process (built by ``run_one.py``, as the throughput benchmark builds
it). Before training, the functions of each phase are wrapped with a timer that records *exclusive* wall-clock time
(time inside a wrapped call minus the time of wrapped calls nested in it), so the phases add up to the whole
``learn`` time and nothing is counted twice. The table gives microseconds per env step (all envs' steps counted) per
phase; ``glue`` is what is left outside every wrapped function (the training loops' own Python).

Phases, and what is wrapped on each side:

=====================  ==========================================  =============================================
phase                  alfish                                      Stable-Baselines3
=====================  ==========================================  =============================================
env step               the gymnasium vector env's ``step``          ``VecEnv.step_wait``
conversions            numpy <-> torch around the env step          (inside ``policy.predict``: in policy forward)
policy forward         ``algorithm.rollout_step``                   ``policy.predict`` / ``policy.forward``
buffer add             ``ReplayBuffer.add`` / ``add_steps``         ``replay_buffer.add`` / ``rollout_buffer.add``
sampling               ``ReplayBuffer.sample`` (+ to_device, time-  ``replay_buffer.sample`` / ``rollout_buffer.get``
                       major, transformers; PPO: mini-batching)
returns                PPO/A2C's ``preprocess_experience`` (GAE)    ``compute_returns_and_advantage``
loss                   the loss module (train_step + calc_loss),    ``train()`` itself (its forward passes and loss
                       the importance-weighted mean                 arithmetic) and ``evaluate_actions``
backward               ``Tensor.backward``                          ``Tensor.backward``
grad clip              ``OptimizerConfig.clip``                     ``clip_grad_norm_``
optimizer              ``Adam.step`` + ``zero_grad``                ``Adam.step`` + ``zero_grad``
target update          ``algorithm.after_update``                   ``polyak_update``
priorities             ``ReplayBuffer.update_priorities``           (no prioritized replay in SB3)
guard                  the non-finite-loss guard                    (none)
summaries              summaries, progress line                     ``logger.record`` / ``_dump_logs``
=====================  ==========================================  =============================================
"""
from __future__ import annotations

import argparse
import collections
import functools
import inspect
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import run_one  # noqa: E402  (the benchmark's job builders)

PHASES = ["env step", "conversions", "policy forward", "buffer add", "sampling", "returns", "loss", "backward",
          "grad clip", "optimizer", "target update", "priorities", "guard", "summaries", "glue"]
DEFAULT_STEPS = {"sac": 2000, "td3": 3000, "ddpg": 3000, "dqn": 10240, "dqn_noper": 10240, "dqn_plain": 10240,
                 "ppo": 20480, "a2c": 20480}


class PhaseTimer:
    """Exclusive wall-clock per phase of the functions wrapped with ``wrap``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self._children: list[float] = []  # per open wrapped call: time spent in wrapped calls nested in it

    def _timed(self, phase: str, fn: Callable, args: tuple, kwargs: dict) -> Any:
        start = time.perf_counter()
        self._children.append(0.0)
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[phase] += elapsed - self._children.pop()
            self.calls[phase] += 1
            if self._children:
                self._children[-1] += elapsed

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        """Replace ``owner.name`` (a function or method; a generator function is timed per item) by a timed one."""
        fn = getattr(owner, name)
        timer = self
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def timed_gen(*args: Any, **kwargs: Any) -> Any:
                it = timer._timed(phase, fn, args, kwargs)
                while True:
                    try:
                        item = timer._timed(phase, next, (it,), {})
                    except StopIteration:
                        return
                    yield item
            setattr(owner, name, timed_gen)
        else:
            @functools.wraps(fn)
            def timed(*args: Any, **kwargs: Any) -> Any:
                return timer._timed(phase, fn, args, kwargs)
            setattr(owner, name, timed)

    def run(self, fn: Callable[[], Any]) -> float:
        """Run ``fn`` as the timed whole; its time outside every wrapped call is ``glue``. Returns the seconds."""
        start = time.perf_counter()
        self._timed("glue", fn, (), {})
        return time.perf_counter() - start


def wrap_torch(timer: PhaseTimer) -> None:
    """Phases both frameworks share: backward, the optimizer, gradient-norm clipping (patched on the classes)."""
    import torch

    timer.wrap(torch.Tensor, "backward", "backward")
    for cls in (torch.optim.Adam, torch.optim.RMSprop):
        timer.wrap(cls, "step", "optimizer")
    timer.wrap(torch.optim.Optimizer, "zero_grad", "optimizer")
    timer.wrap(torch.nn.utils, "clip_grad_norm_", "grad clip")


def profile_alfish(args: argparse.Namespace, timer: PhaseTimer) -> tuple[float, int]:
    from alfish.collect.unroller import Unroller
    from alfish.console.progress import Progress
    from alfish.envs.batched_env import BatchedEnv
    from alfish.replay.batching import WholeBufferBatches
    from alfish.replay.replay_buffer import ReplayBuffer
    from alfish.trainer import training
    from alfish.trainer.trainer import Trainer

    trainer, _ = run_one.make_alfish(args)
    wrap_torch(timer)
    env = trainer.collector.env
    timer.wrap(env._venv, "step", "env step")
    for name in ("_to_obs_tensor", "_to_env_action"):
        timer.wrap(BatchedEnv, name, "conversions")
    timer.wrap(BatchedEnv, "step", "conversions")  # its own numpy arithmetic (step types, discounts)
    timer.wrap(Unroller, "step", "glue")
    timer.wrap(trainer.algorithm, "rollout_step", "policy forward")
    if isinstance(trainer.replay, ReplayBuffer):  # (not the NullReplay of on-policy runs)
        timer.wrap(ReplayBuffer, "add", "buffer add")
        timer.wrap(ReplayBuffer, "add_steps", "buffer add")
        for name in ("sample", "to_device", "gather_all"):
            timer.wrap(ReplayBuffer, name, "sampling")
        timer.wrap(ReplayBuffer, "update_priorities", "priorities")
    timer.wrap(training, "to_time_major", "sampling")
    timer.wrap(WholeBufferBatches, "epoch", "sampling")
    timer.wrap(WholeBufferBatches, "__init__", "sampling")
    for name in ("transform_sample", "transform_experience"):
        timer.wrap(trainer.transformer, name, "sampling")
    timer.wrap(trainer.algorithm, "preprocess_experience", "returns")
    learner = trainer.learner
    timer.wrap(learner, "_compute_loss", "loss")
    timer.wrap(learner, "_weighted_mean", "loss")
    if trainer.algorithm.on_policy:
        timer.wrap(trainer.algorithm, "calc_loss", "loss")
    timer.wrap(learner.optimizer_config, "clip", "grad clip")
    timer.wrap(trainer.algorithm, "after_update", "target update")
    timer.wrap(learner.finite_guard, "observe", "guard")
    timer.wrap(learner, "check_finite", "guard")
    timer.wrap(Trainer, "_write_summaries", "summaries")
    timer.wrap(Progress, "update", "summaries")
    seconds = timer.run(trainer.run)
    return seconds, trainer.counters.env_steps


def profile_sb3(args: argparse.Namespace, timer: PhaseTimer) -> tuple[float, int]:
    import importlib

    model, callback = run_one.make_sb3(args)
    wrap_torch(timer)
    timer.wrap(model.env, "step_wait", "env step")
    timer.wrap(model.policy, "predict", "policy forward")
    if hasattr(model, "replay_buffer"):
        timer.wrap(model.replay_buffer, "add", "buffer add")
        timer.wrap(model.replay_buffer, "sample", "sampling")
    else:
        timer.wrap(model.policy, "forward", "policy forward")
        timer.wrap(model.policy, "evaluate_actions", "loss")
        timer.wrap(model.rollout_buffer, "add", "buffer add")
        timer.wrap(model.rollout_buffer, "get", "sampling")
        timer.wrap(model.rollout_buffer, "compute_returns_and_advantage", "returns")
    timer.wrap(model, "train", "loss")
    for module in ("sac.sac", "td3.td3", "dqn.dqn"):
        mod = importlib.import_module(f"stable_baselines3.{module}")
        timer.wrap(mod, "polyak_update", "target update")
    timer.wrap(model, "_dump_logs", "summaries")

    def learn() -> None:
        model.learn(total_timesteps=args.steps, callback=callback)
        # the logger is created by learn(); its record calls are inside train(), so wrap it on the first call
    orig_setup = model._setup_learn

    def setup_then_wrap_logger(*a: Any, **k: Any) -> Any:
        out = orig_setup(*a, **k)
        timer.wrap(model.logger, "record", "summaries")
        timer.wrap(model.logger, "record_mean", "summaries")
        return out
    model._setup_learn = setup_then_wrap_logger
    seconds = timer.run(learn)
    return seconds, int(model.num_timesteps)


def child(args: argparse.Namespace) -> None:
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    timer = PhaseTimer()
    profile = profile_alfish if args.framework == "alfish" else profile_sb3
    seconds, steps = profile(args, timer)
    us = {phase: 1e6 * s / steps for phase, s in timer.seconds.items()}
    print("RESULT " + json.dumps(dict(seconds=seconds, steps=steps, us_per_step=us)), flush=True)


def run_child(framework: str, algo: str, steps: int, threads: int, params: list[str]) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", framework, "--algos", algo, "--steps", str(steps),
           "--threads", str(threads)] + [f"--param={p}" for p in params]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")


def table(algo: str, results: dict[str, dict]) -> str:
    """Markdown table: microseconds per env step of each phase, alfish beside SB3."""
    a, b = results["alfish"], results["sb3"]
    lines = [f"### {algo}: microseconds per env step (alfish {a['steps'] / a['seconds']:.0f} env steps/s, "
             f"SB3 {b['steps'] / b['seconds']:.0f})", "",
             "| phase | alfish | SB3 | alfish - SB3 |", "|---|---:|---:|---:|"]
    for phase in PHASES:
        x, y = a["us_per_step"].get(phase, 0.0), b["us_per_step"].get(phase, 0.0)
        if x or y:
            lines.append(f"| {phase} | {x:.0f} | {y:.0f} | {x - y:+.0f} |")
    x, y = 1e6 * a["seconds"] / a["steps"], 1e6 * b["seconds"] / b["steps"]
    lines.append(f"| **total** | **{x:.0f}** | **{y:.0f}** | **{x - y:+.0f}** |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=list(DEFAULT_STEPS), choices=list(DEFAULT_STEPS))
    parser.add_argument("--steps", type=int, default=0, help="env steps per job (0: the throughput benchmark's)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for both (0: torch's default)")
    parser.add_argument("--frameworks", nargs="+", default=["alfish", "sb3"], choices=["alfish", "sb3"])
    parser.add_argument("--param", action="append", default=[],
                        help="an extra gin binding for alfish (repeatable), as run_one.py --param")
    parser.add_argument("--child", choices=["alfish", "sb3"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        job = argparse.Namespace(framework=args.child, algo=args.algos[0], setting="identical", eval_every=0,
                                 seed=0, threads=args.threads, steps=args.steps or DEFAULT_STEPS[args.algos[0]],
                                 param=args.param)
        child(job)
        return
    for algo in args.algos:
        steps = args.steps or DEFAULT_STEPS[algo]
        results = {fw: run_child(fw, algo, steps, args.threads, args.param) for fw in args.frameworks}
        if len(results) == 2:
            print(table(algo, results) + "\n", flush=True)
        else:
            print(json.dumps({algo: results}), flush=True)


if __name__ == "__main__":
    main()
