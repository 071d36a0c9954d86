#!/usr/bin/env python
"""Train Stable-Baselines3 at an alfish conf's hyperparameters (``sb3_translate.translate``) and record its evaluations
as alfish does, so ``alfish.tools.plot`` and ``validate_confs.py --peer sb3`` read both frameworks' runs alike.

    python scripts/sb3_peer.py --conf confs/sac_hopper.gin --root_dir runs/peer/sac_hopper/sb3/seed-0 \
        [--conf_param TrainerConfig.random_seed=0 --conf_param TrainerConfig.num_env_steps=300000 ...]

Evaluation: every ``eval_every`` env steps after ``learning_starts`` (the conf's ``eval_interval`` iterations after its
``initial_collect_steps``, the env steps at which alfish evaluates) and at the budget,
``num_eval_episodes`` deterministic episodes on a separate env (VecNormalize's observation statistics copied from the
training env, rewards unnormalized), as alfish's evaluator does. Each evaluation appends one line to
``root_dir/eval_log.jsonl`` (``iteration``, ``env_steps``, ``elapsed_s`` since the process started,
``average_return``). SB3 is a comparison peer only: ``pip install stable-baselines3`` (never an alfish dependency).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

STARTED = time.monotonic()
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from sb3_translate import Sb3Job, TranslateError, translate  # noqa: E402


def build(job: Sb3Job):
    """SB3's model of ``job`` and the training env, plus a function that evaluates the model deterministically."""
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import VecNormalize, sync_envs_normalization

    env = make_vec_env(job.env_name, n_envs=job.n_envs, seed=job.seed)
    eval_env = make_vec_env(job.env_name, n_envs=1, seed=job.seed + 10_000)
    if job.normalize is not None:
        env = VecNormalize(env, **job.normalize)
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False, **{
            k: v for k, v in job.normalize.items() if k != "norm_reward"})
    kwargs = dict(job.kwargs)
    kwargs["policy_kwargs"] = dict(kwargs["policy_kwargs"], activation_fn=getattr(torch.nn, job.activation))
    if job.action_noise_sigma is not None:
        dim = env.action_space.shape[0]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(dim), job.action_noise_sigma * np.ones(dim))
    model = getattr(stable_baselines3, job.algo)("MlpPolicy", env, seed=job.seed, verbose=0, device="cpu", **kwargs)

    def evaluate() -> float:
        if job.normalize is not None:
            sync_envs_normalization(env, eval_env)
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=job.eval_episodes, deterministic=True)
        return float(mean)

    return model, evaluate


def train(job: Sb3Job, root: pathlib.Path) -> dict:
    """Train ``job`` to its budget, evaluating on the way; the run's summary (also written to ``result.json``)."""
    from stable_baselines3.common.callbacks import BaseCallback

    model, evaluate = build(job)
    root.mkdir(parents=True, exist_ok=True)
    log = (root / "eval_log.jsonl").open("w")

    recorded = []  # env steps of the evaluations so far

    def record(env_steps: int, number: int) -> None:
        recorded.append(env_steps)
        log.write(json.dumps(dict(iteration=number, env_steps=env_steps, elapsed_s=time.monotonic() - STARTED,
                                  average_return=evaluate())) + "\n")
        log.flush()

    class Every(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            # alfish evaluates every eval_interval iterations counted after its initial collection (SB3's
            # learning_starts): the same env steps here
            self.next_at, self.number = job.kwargs.get("learning_starts", 0) + job.eval_every, 0

        def _on_step(self) -> bool:
            if job.eval_every and self.num_timesteps >= self.next_at:
                self.next_at += job.eval_every
                self.number += 1
                record(self.num_timesteps, self.number)
            return True

    callback = Every()
    learn_start = time.monotonic()
    model.learn(total_timesteps=job.env_steps, callback=callback)
    if not recorded or recorded[-1] != model.num_timesteps:
        record(int(model.num_timesteps), callback.number + 1)  # the final evaluation, at the budget
    log.close()
    return dict(env_steps=int(model.num_timesteps), learn_s=time.monotonic() - learn_start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/sb3_peer.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", required=True)
    parser.add_argument("--root_dir", required=True)
    parser.add_argument("--conf_param", action="append", default=[])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (alfish's suite runs use 1)")
    args = parser.parse_args(argv)
    try:
        job = translate(pathlib.Path(args.conf), args.conf_param)
    except TranslateError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        print("error: the SB3 peer needs Stable-Baselines3: pip install stable-baselines3 (a comparison peer, never "
              "an alfish dependency)", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(args.threads)
    summary = train(job, pathlib.Path(args.root_dir))
    print("RESULT " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
