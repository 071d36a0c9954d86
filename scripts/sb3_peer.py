#!/usr/bin/env python
"""Train Stable-Baselines3 at an alfish conf's hyperparameters (``sb3_translate.translate``) and record its evaluations
as alfish does, so ``alfish.tools.plot`` and ``validate_confs.py --peer sb3`` read both frameworks' runs alike.

    python scripts/sb3_peer.py --conf confs/sac_hopper.gin --root_dir runs/peer/sac_hopper/sb3/seed-0 \
        [--conf_param TrainerConfig.random_seed=0 --conf_param TrainerConfig.num_env_steps=300000 ...]

Evaluation: every ``eval_every`` env steps after ``learning_starts`` (the conf's ``eval_interval`` iterations after its
``initial_collect_steps``, the env steps at which alfish evaluates) and at the budget,
``num_eval_episodes`` deterministic episodes on a separate env (VecNormalize's observation statistics copied from the
training env, rewards unnormalized), as alfish's evaluator does. Each evaluation appends one line to
``root_dir/eval_log.jsonl`` (``iteration``, ``env_steps``, ``elapsed_s``: the run's wall-clock, ``average_return``,
``average_episode_length``).
Every ``--checkpoint_every`` env steps the model, replay buffer and VecNormalize statistics are saved in ``root_dir``;
running the same command again resumes from there (SB3 has no exact resume: the resumed run's random streams differ
from an uninterrupted one's). A SIGTERM or SIGINT (Ctrl-C) saves a checkpoint at the next env step and exits with
128 + the signal's number, as alfish's trainer does, so a stopped suite loses no work. SB3 is a comparison peer only:
``pip install stable-baselines3`` (never an alfish dependency).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys
import time
from typing import Optional

# this checkout's alfish (the one the alfish side of the suite runs), then sb3_translate beside this file
sys.path[:0] = [str(pathlib.Path(__file__).resolve().parents[1]), str(pathlib.Path(__file__).resolve().parent)]

from sb3_translate import Sb3Job, TranslateError, translate  # noqa: E402

CHECKPOINT_STATE = "sb3_state.json"  # written last: its presence means the files it names are complete


class Checkpoint:
    """The peer's own resume files in ``root``: the model, its replay buffer (off-policy), VecNormalize's statistics,
    and ``sb3_state.json`` (env steps, the run's wall-clock so far, evaluations done). Each file is written under a
    temporary name and renamed, the state last, so a run killed mid-write resumes from the previous checkpoint.
    Like alfish's, the resumed clock continues from the checkpoint's: work lost after it is not counted."""

    def __init__(self, root: pathlib.Path):
        self.root, self.state_path = root, root / CHECKPOINT_STATE

    def state(self) -> Optional[dict]:
        return json.loads(self.state_path.read_text()) if self.state_path.exists() else None

    def save(self, model, env, elapsed_s: float, evaluations: int) -> None:
        model.save(self.root / "sb3_model.tmp")  # (SB3 adds .zip only to a name without a suffix)
        os.replace(self.root / "sb3_model.tmp", self.root / "sb3_model.zip")
        if hasattr(model, "replay_buffer"):
            model.save_replay_buffer(self.root / "sb3_replay.tmp")
            os.replace(self.root / "sb3_replay.tmp", self.root / "sb3_replay.pkl")
        if hasattr(env, "obs_rms"):
            env.save(str(self.root / "sb3_vecnormalize.tmp"))
            os.replace(self.root / "sb3_vecnormalize.tmp", self.root / "sb3_vecnormalize.pkl")
        state = dict(num_timesteps=int(model.num_timesteps), elapsed_s=elapsed_s, evaluations=evaluations)
        (self.root / "sb3_state.tmp").write_text(json.dumps(state))
        os.replace(self.root / "sb3_state.tmp", self.state_path)


#: ``--update_order``: SB3's own (on a step where the actor trains, the critics step first and the actor's loss reads
#: the updated critic), or alfish's ``combined`` (the actor's loss reads the critic before that step: alfish takes one
#: optimizer step for all, DESIGN.md §3.2). An experiment on the one algorithmic difference found between the two
#: TD3s and the two SACs: SB3 with alfish's order beside SB3 with its own says what the order is worth.
UPDATE_ORDERS = ("sb3", "combined")
COMBINABLE = ("TD3", "DDPG", "SAC")  # the algorithms with an actor and critics stepped in turn


def use_combined_update_order(model) -> None:
    """Make an SB3 TD3, DDPG or SAC ``model`` train in alfish's order: on an update where the actor trains (every
    update of SAC, which has no policy delay), the critics' optimizer step is held back until after the actor's, so
    the actor's loss is computed on the critic before this update's step (everything else, batches and random draws
    included, is SB3's). The critics' gradients are kept aside meanwhile: the actor's backward pass adds its own to the
    critic parameters (SB3 zeroes them at the next update), and the held-back step must apply the critic loss's alone.
    (SAC's temperature steps first in both orders, and both losses read the temperature from before its step.)
    Installed on the optimizer instances: call it again after loading a saved model."""
    critic_opt, actor_opt = model.critic.optimizer, model.actor.optimizer
    policy_delay = getattr(model, "policy_delay", 1)  # (SAC has none: its actor trains on every update)
    critic_step, actor_step = critic_opt.step, actor_opt.step
    held: list = []  # the critics' gradients of a held-back step (one at most)

    def deferred_critic_step(*args, **kwargs):
        if model._n_updates % policy_delay != 0:  # the actor does not train on this update (SB3's test)
            return critic_step(*args, **kwargs)
        held.append([None if p.grad is None else p.grad.clone() for p in model.critic.parameters()])
        return None

    def actor_step_then_critic_step(*args, **kwargs):
        result = actor_step(*args, **kwargs)
        if held:
            for p, grad in zip(model.critic.parameters(), held.pop()):
                p.grad = grad
            critic_step()
        return result

    critic_opt.step, actor_opt.step = deferred_critic_step, actor_step_then_critic_step


def build(job: Sb3Job, checkpoint: Checkpoint, update_order: str = "sb3"):
    """SB3's model of ``job`` (restored from ``checkpoint`` when it has one), its training env, and a function that
    evaluates the model deterministically. ``update_order``: one of ``UPDATE_ORDERS`` (``combined``: TD3, DDPG
    and SAC)."""
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import VecNormalize, sync_envs_normalization

    resumed = checkpoint.state() is not None
    env = make_vec_env(job.env_name, n_envs=job.n_envs, seed=job.seed)
    eval_env = make_vec_env(job.env_name, n_envs=1, seed=job.seed + 10_000)
    if job.normalize is not None:
        saved = checkpoint.root / "sb3_vecnormalize.pkl"
        env = VecNormalize.load(str(saved), env) if resumed else VecNormalize(env, **job.normalize)
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False, **{
            k: v for k, v in job.normalize.items() if k != "norm_reward"})
    kwargs = dict(job.kwargs)
    kwargs["policy_kwargs"] = dict(kwargs["policy_kwargs"], activation_fn=getattr(torch.nn, job.activation))
    if job.action_noise_sigma is not None:
        dim = env.action_space.shape[0]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(dim), job.action_noise_sigma * np.ones(dim))
    cls = getattr(stable_baselines3, job.algo)
    if resumed:
        extra = {"action_noise": kwargs["action_noise"]} if "action_noise" in kwargs else {}
        model = cls.load(checkpoint.root / "sb3_model.zip", env=env, device="cpu", **extra)
        if hasattr(model, "replay_buffer"):
            model.load_replay_buffer(checkpoint.root / "sb3_replay.pkl")
    else:
        model = cls("MlpPolicy", env, seed=job.seed, verbose=0, device="cpu", **kwargs)
    if update_order == "combined":
        use_combined_update_order(model)

    def evaluate() -> dict:
        """The evaluation's ``average_return`` and ``average_episode_length`` (the fields of alfish's eval log)."""
        if job.normalize is not None:
            sync_envs_normalization(env, eval_env)
        returns, lengths = evaluate_policy(model, eval_env, n_eval_episodes=job.eval_episodes, deterministic=True,
                                           return_episode_rewards=True)
        return dict(average_return=float(np.mean(returns)), average_episode_length=float(np.mean(lengths)))

    return model, env, evaluate


def _kept_records(log_path: pathlib.Path, up_to_steps: int) -> list[str]:
    """The eval log's lines up to the checkpoint (the later ones are redone)."""
    if not log_path.exists():
        return []
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    return [line for line in lines if json.loads(line)["env_steps"] <= up_to_steps]


class StopOnSignal:
    """While entered, SIGTERM and SIGINT set ``signal_number`` instead of ending the process (the training callback
    saves a checkpoint and stops at the next env step); the previous handlers come back on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signal_number: Optional[int] = None
        self.previous: dict = {}

    def __enter__(self) -> "StopOnSignal":
        for number in self.SIGNALS:
            self.previous[number] = signal.signal(number, self._note)
        return self

    def _note(self, number: int, frame: object) -> None:
        self.signal_number = number

    def __exit__(self, *exc: object) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)


def train(job: Sb3Job, root: pathlib.Path, checkpoint_every: int, update_order: str = "sb3") -> dict:
    """Train ``job`` to its budget (resuming from ``root``'s checkpoint if any), evaluating on the way and saving a
    checkpoint every ``checkpoint_every`` env steps (0: never); the run's summary. ``update_order``: ``build``'s."""
    from stable_baselines3.common.callbacks import BaseCallback

    root.mkdir(parents=True, exist_ok=True)
    checkpoint = Checkpoint(root)
    state = checkpoint.state() or dict(num_timesteps=0, elapsed_s=0.0, evaluations=0)
    clock_zero = time.monotonic() - state["elapsed_s"]  # the run's clock continues from the checkpoint's
    model, env, evaluate = build(job, checkpoint, update_order)
    # SB3's own training statistics (train/clip_fraction, approx_kl, the losses, ...: its logger's means over each
    # training phase) in a CSV per start, to set beside alfish's TensorBoard (whose loss/ scalars are those of the
    # last update of an iteration)
    from stable_baselines3.common.logger import configure

    model.set_logger(configure(str(root / "sb3_log" / f"from-{state['num_timesteps']}"), ["csv"]))
    log_path = root / "eval_log.jsonl"
    kept = _kept_records(log_path, state["num_timesteps"])
    log = log_path.open("w")
    log.write("".join(line + "\n" for line in kept))
    recorded = [json.loads(line)["env_steps"] for line in kept]  # env steps of the evaluations so far

    def record(env_steps: int, number: int) -> None:
        recorded.append(env_steps)
        log.write(json.dumps(dict(iteration=number, env_steps=env_steps, elapsed_s=time.monotonic() - clock_zero,
                                  **evaluate())) + "\n")
        log.flush()

    class Every(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            # alfish evaluates every eval_interval iterations counted after its initial collection (SB3's
            # learning_starts): the same env steps here
            self.number = state["evaluations"]
            self.next_at = job.kwargs.get("learning_starts", 0) + job.eval_every * (self.number + 1)
            self.next_save = state["num_timesteps"] + checkpoint_every

        def _on_step(self) -> bool:
            if job.eval_every and self.num_timesteps >= self.next_at:
                self.next_at += job.eval_every
                self.number += 1
                record(self.num_timesteps, self.number)
            if checkpoint_every and self.num_timesteps >= self.next_save and self.num_timesteps < job.env_steps:
                self.next_save += checkpoint_every
                checkpoint.save(self.model, env, time.monotonic() - clock_zero, self.number)
            if stop.signal_number is not None:  # stopped: keep the work done so far, end learn()
                checkpoint.save(self.model, env, time.monotonic() - clock_zero, self.number)
                return False
            return True

    callback, stop = Every(), StopOnSignal()
    learn_start = time.monotonic()
    with stop:
        model.learn(total_timesteps=job.env_steps - state["num_timesteps"], callback=callback,
                    reset_num_timesteps=state["num_timesteps"] == 0, log_interval=1)  # (a log row per episode/rollout)
    if stop.signal_number is None and (not recorded or recorded[-1] != model.num_timesteps):
        record(int(model.num_timesteps), callback.number + 1)  # the final evaluation, at the budget
    log.close()
    return dict(env_steps=int(model.num_timesteps), learn_s=time.monotonic() - learn_start,
                resumed_from=state["num_timesteps"], stopped_by_signal=stop.signal_number)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/sb3_peer.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", required=True)
    parser.add_argument("--root_dir", required=True)
    parser.add_argument("--conf_param", action="append", default=[])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (alfish's suite runs use 1)")
    parser.add_argument("--checkpoint_every", type=int, default=25_000,
                        help="env steps between resume checkpoints in ROOT_DIR (0: none); a rerun resumes")
    parser.add_argument("--update_order", choices=UPDATE_ORDERS, default="sb3",
                        help="TD3/DDPG/SAC: 'combined' computes the actor's loss on the critic before that update's "
                             "critic step, as alfish does (an experiment; see use_combined_update_order)")
    args = parser.parse_args(argv)
    try:
        job = translate(pathlib.Path(args.conf), args.conf_param)
    except TranslateError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.update_order != "sb3" and job.algo not in COMBINABLE:
        print(f"error: --update_order {args.update_order} applies to TD3, DDPG and SAC, not to {job.algo}; drop it",
              file=sys.stderr)
        return 2
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        print("error: the SB3 peer needs Stable-Baselines3: pip install stable-baselines3 (a comparison peer, never "
              "an alfish dependency)", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(args.threads)
    summary = train(job, pathlib.Path(args.root_dir), args.checkpoint_every, args.update_order)
    if summary["stopped_by_signal"] is not None:
        print(f"stopped by signal {summary['stopped_by_signal']} at {summary['env_steps']} env steps, a checkpoint "
              f"saved: rerun the same command to resume", file=sys.stderr, flush=True)
        return 128 + summary["stopped_by_signal"]
    print("RESULT " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
