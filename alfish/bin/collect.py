"""Write an offline dataset from a results directory: roll out its trained policy (or a random one) in its env, or
export the replay buffer it saved.

    python -m alfish.bin.collect --root_dir RUN --num_steps N --out DIR [--epsilon_greedy E] [--format alfish|minari]
                                 [--random] [--from_replay] [--num_envs K] [--seed S] [--checkpoint_step STEP]
                                 [--allow_import PREFIX ...] [--dataset_id ID]

Sources (one of):
  default        the trained policy of RUN's newest checkpoint (or --checkpoint_step), acting through its data
                 transformers (statistics frozen) with ``predict_step(time_step, epsilon_greedy=E)``, as evaluation
                 and play do. E (default 0: greedy) is the probability, per env and step, of not taking the greedy
                 action, and what is taken instead is the algorithm's choice (its predict_step): DQN, and BC with
                 Discrete actions, take a uniformly random action; every other algorithm samples its own stochastic
                 policy (SAC: the tanh-Gaussian; IQL: the clipped Gaussian; TD3/DDPG: the actor plus its exploration
                 noise; PPO/A2C: the Gaussian, or for Discrete actions the softmax, not a uniform choice; a
                 deterministic BC policy: its own action, so E changes nothing). For uniformly random actions use
                 --random.
  --random       uniformly random actions from the env's action space; RUN only names the env (no checkpoint needed:
                 the config comes from the newest checkpoint if there is one, else from RUN/config/operative.gin).
  --from_replay  no rollout: RUN's saved replay buffer (newest checkpoint, or --checkpoint_step) as a dataset, its first
                 --num_steps steps if given (the cut episode ends as a truncation).

Rollouts step ``--num_envs`` copies of the env that RUN's stored config names (vectorization 'sync'; env i seeded
S + i) for ``--num_steps`` stored steps in total, N // K per env (the first N % K envs one more). The data stops at N:
an episode still running there ends as a truncation (its newest step becomes LAST with discount 1, so it is
bootstrapped), so every episode in the dataset ends with LAST. Only when an env's share would end on the FIRST step of
a new episode (a reset observation with no transition after it) is that one step left out, so the dataset may then hold
up to K steps fewer than N. Each env's episodes are stored one after another, env by env.

What is stored, in alfish's step convention (DESIGN.md 3.5; ``alfish/replay/offline/steps.py``): the raw observation
(as the env returns it, before any data transformer), the reward of the previous action, discount 0 only at a
termination, step types FIRST/MID/LAST, and the action the env executed (Box actions clipped to the bounds, as the
env clips them); a LAST step's action, which the env ignores (autoreset), is stored as zeros.

A results directory is untrusted input (DESIGN.md 3.13): its config is parsed as play parses it (registered
configurables only; imports and 'module:EnvId' env names only with --allow_import PREFIX), and checkpoints are
verified tensors and JSON. --format alfish (default) writes alfish's ``.npy`` dataset; --format minari a Minari dataset
(``pip install 'alfish[offline]'``). Either loads with ``load_offline_data(DIR)``. A Minari dataset rolled out in a
registered gymnasium env records its env spec, so ``minari.MinariDataset(DIR/data).recover_environment()`` (d3rlpy's
Minari loader) rebuilds the env; otherwise its metadata says why it cannot (``alfish_no_env_spec``).

Exit status: 0 when the dataset was written; 2 for bad input (flags, a missing checkpoint, an existing --out, an
untrusted import, data that breaks the step convention), reported in one line; 1 when writing the dataset fails.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from typing import Callable, Optional, Sequence

import gymnasium as gym
import numpy as np
import torch

from alfish.bin.output_path import why_unwritable
from alfish.bin.root_dir_args import add_allow_import
from alfish.bin.stored_run import load_checkpoint, load_stored_config, one_line, restore_policy
from alfish.config import ConfError, TrainerConfig, load_config_text
from alfish.config.untrusted import MAX_STORED_CONFIG_BYTES, check_env_names, trusted_prefixes
from alfish.data.types import StepType, TimeStep
from alfish.envs.batched_env import BatchedEnv, environment_settings
from alfish.evaluate.acting import GreedyPolicy
from alfish.replay.offline.steps import Steps, check_steps
from alfish.rundir.checkpoint import Checkpointer, CheckpointError, LoadedCheckpoint
from alfish.rundir.safe_paths import UnsafePathError, kind_in_root, read_bytes_in_root

FORMATS = ("alfish", "minari")
OFFLINE_EXTRA = "pip install 'alfish[offline]'"
STORED_CONFIG = os.path.join("config", "operative.gin")  # written by train when it starts


class CollectError(Exception):
    """A problem with collect's arguments or what they name; its message is one line saying what to change."""


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m alfish.bin.collect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root_dir", required=True, help="the results directory (RUN) to collect from")
    parser.add_argument("--num_steps", type=int, default=None,
                        help="steps to store in total (required for rollouts; with --from_replay: at most this many, "
                             "default all)")
    parser.add_argument("--out", required=True, help="the dataset directory to write (must not exist)")
    parser.add_argument("--format", choices=FORMATS, default="alfish", help="alfish (default) or minari")
    parser.add_argument("--epsilon_greedy", type=float, default=None,
                        help="probability per step of not acting greedily (default 0; see above for what is taken)")
    parser.add_argument("--random", action="store_true", help="act uniformly at random (no checkpoint needed)")
    parser.add_argument("--from_replay", action="store_true", help="export RUN's saved replay buffer, no rollout")
    parser.add_argument("--num_envs", type=int, default=None, help="envs stepped together (default 1)")
    parser.add_argument("--seed", type=int, default=None, help="env i is seeded SEED + i; also seeds the policy "
                                                               "(default 0)")
    parser.add_argument("--checkpoint_step", type=int, default=None,
                        help="iteration of the checkpoint (default: newest)")
    add_allow_import(parser)
    parser.add_argument("--dataset_id", default=None,
                        help="the Minari dataset id, (namespace/)name-v(version) (--format minari; default "
                             "alfish/dataset-v0)")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Checks what argparse cannot, before anything is loaded or stepped; fills the defaults of unset flags.

    Raises:
        CollectError: one line naming the argument and what to change.
    """
    if not os.path.isdir(args.root_dir):
        raise CollectError(f"--root_dir {args.root_dir!r} is not a directory; give the results directory of a run")
    if args.from_replay:
        given = [flag for flag, value in (("--random", args.random or None), ("--epsilon_greedy", args.epsilon_greedy),
                                          ("--num_envs", args.num_envs), ("--seed", args.seed)) if value is not None]
        if given:
            raise CollectError(f"{given[0]} applies to rollouts; --from_replay exports the saved replay buffer as it "
                               "is")
    elif args.num_steps is None:
        raise CollectError("--num_steps is required: the number of steps to collect (e.g. --num_steps 10000)")
    if args.num_steps is not None and args.num_steps < 2:
        raise CollectError(f"--num_steps {args.num_steps} must be >= 2 (a dataset needs at least one transition)")
    if args.random and args.epsilon_greedy is not None:
        raise CollectError("--epsilon_greedy applies to the trained policy; --random acts uniformly at random")
    if args.epsilon_greedy is not None and not 0.0 <= args.epsilon_greedy <= 1.0:
        raise CollectError(f"--epsilon_greedy {args.epsilon_greedy} must lie in [0, 1]")
    args.epsilon_greedy = 0.0 if args.epsilon_greedy is None else args.epsilon_greedy
    args.seed = 0 if args.seed is None else args.seed
    args.num_envs = 1 if args.num_envs is None else args.num_envs
    if args.num_envs < 1:
        raise CollectError(f"--num_envs {args.num_envs} must be >= 1")
    if not args.from_replay and args.num_steps // args.num_envs < 2:
        raise CollectError(f"--num_steps {args.num_steps} over --num_envs {args.num_envs} leaves an env fewer than 2 "
                           "steps (no transition); collect more steps or use fewer envs")
    if args.dataset_id is not None and args.format != "minari":
        raise CollectError("--dataset_id names a Minari dataset; it applies to --format minari")
    check_out(args.out)
    if args.format == "minari":
        try:
            import minari  # noqa: F401  (the 'offline' extra)
        except ImportError:
            raise CollectError(f"--format minari needs the minari package, which is not installed: "
                               f"{OFFLINE_EXTRA}") from None


def check_out(path: str) -> None:
    """Refuses an --out that exists or whose directory could not be written, before any step is collected."""
    if os.path.lexists(path):
        raise CollectError(f"--out {path!r} already exists; choose a new directory for the dataset")
    reason = why_unwritable(path)
    if reason is not None:
        raise CollectError(f"--out {path!r} cannot be written: {reason}")


# ------------------------------------------------------------------------------------------- the stored config ----
def load_env_config(args: argparse.Namespace, trusted: tuple[str, ...]) -> Optional[LoadedCheckpoint]:
    """Parses RUN's stored config (restricted mode) and returns the checkpoint it came from.

    A trained policy needs a checkpoint (its config and tensors). --random needs only the env: it reads the checkpoint's
    config when there is one (--checkpoint_step, else the newest that verifies), else RUN/config/operative.gin, and
    returns None in that case.
    """
    if not args.random or args.checkpoint_step is not None:
        ckpt = load_checkpoint(args.root_dir, args.checkpoint_step)
        load_stored_config(args.root_dir, ckpt, trusted)
        return ckpt
    ckpt = Checkpointer(os.path.join(args.root_dir, "checkpoints"), root_dir=args.root_dir).load_latest()
    if ckpt is not None:
        load_stored_config(args.root_dir, ckpt, trusted)
        return ckpt
    path = os.path.join(args.root_dir, STORED_CONFIG)
    try:  # bounded (alfish writes a few KB), never through a link, never a FIFO (it would block the read)
        data = read_bytes_in_root(args.root_dir, STORED_CONFIG, MAX_STORED_CONFIG_BYTES)
    except FileNotFoundError:
        raise CollectError(f"{args.root_dir} has neither a valid checkpoint nor {STORED_CONFIG}; it is not the results "
                           "directory of an alfish run") from None
    except UnsafePathError as err:
        raise CollectError(str(err)) from None
    if len(data) > MAX_STORED_CONFIG_BYTES:
        raise CollectError(f"{path} holds more than {MAX_STORED_CONFIG_BYTES} bytes; it is not a config alfish wrote")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CollectError(f"{path} is not UTF-8 text; it is not a config alfish wrote") from None
    load_config_text(text, path, trusted)
    return None


def create_env(args: argparse.Namespace, trusted: tuple[str, ...]) -> BatchedEnv:
    """The env the stored config names, --num_envs of them stepped in this process, after checking that its names
    import nothing untrusted (resolved: macros and references evaluated, before gymnasium sees them)."""
    settings = environment_settings(num_parallel_environments=args.num_envs, seed=args.seed, vectorization="sync",
                                    render_mode=None)
    check_env_names({"create_environment.env_name": settings.env_name,
                     "create_environment.env_kwargs": settings.env_kwargs}, trusted)
    return settings.create()


# ---------------------------------------------------------------------------------------------------- rollouts ----
Policy = Callable[[TimeStep], torch.Tensor]


def trained_policy(args: argparse.Namespace, env: BatchedEnv, ckpt: LoadedCheckpoint) -> Policy:
    """The checkpoint's algorithm acting as evaluation and play act (``GreedyPolicy``: through its transformers'
    rollout view, statistics frozen, with ``--epsilon_greedy``; a recurrent state per env, reset at each FIRST step)."""
    transformer, algorithm = restore_policy(TrainerConfig(root_dir=args.root_dir), env, ckpt)
    return GreedyPolicy.frozen(transformer, algorithm, args.epsilon_greedy)


def rollout(env: BatchedEnv, policy: Policy, num_steps: int, seed: int) -> tuple[Steps, np.ndarray]:
    """Steps ``env`` with ``policy`` and returns ``num_steps`` steps (see the module docstring for how they are cut
    and ordered) and, per episode of them, whether it was cut at the end of the data (bool ``[num_episodes]``)."""
    n = env.num_envs
    budget = [num_steps // n + (1 if i < num_steps % n else 0) for i in range(n)]
    length = max(budget)
    obs_rows, step_type, reward, discount, action = [], [], [], [], []
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    if not discrete:
        low = np.asarray(env.action_space.low, np.float32)
        high = np.asarray(env.action_space.high, np.float32)
    zero_action = np.zeros((n,) + (() if discrete else tuple(env.action_space.shape)),
                           np.int64 if discrete else np.float32)
    with torch.random.fork_rng(devices=[]), torch.inference_mode():  # (the caller's RNG state is left as it was)
        torch.manual_seed(seed)
        time_step = env.reset(seed=seed)
        for t in range(length):
            # Copies of what the env returned, before the policy (and its transformers) see the time step.
            obs_rows.append({k: v.numpy().copy() for k, v in time_step.observation.items()}
                            if isinstance(time_step.observation, dict) else time_step.observation.numpy().copy())
            step_type.append(time_step.step_type.numpy().copy())
            reward.append(time_step.reward.numpy().copy())
            discount.append(time_step.discount.numpy().copy())
            if t == length - 1:
                action.append(zero_action)  # the data ends here: this step is LAST, its action never taken
                break
            act = policy(time_step).to("cpu")
            env_action = act.numpy().astype(np.int64) if discrete else np.clip(act.numpy(), low, high)
            action.append(env_action.astype(zero_action.dtype, copy=False))
            time_step = env.step(act)
    stacked_obs = ({k: np.stack([row[k] for row in obs_rows], 1) for k in obs_rows[0]}  # [B, T, ...]
                   if isinstance(obs_rows[0], dict) else np.stack(obs_rows, 1))
    st, rw, dc, ac = (np.stack(x, 1) for x in (step_type, reward, discount, action))
    keep, cut = [], []
    for env_id, count in enumerate(budget):
        if st[env_id, count - 1] == StepType.FIRST:
            count -= 1  # a reset observation with no transition after it (the step before is LAST)
        was_running = st[env_id, count - 1] == StepType.MID
        st[env_id, count - 1] = StepType.LAST  # a running episode ends as a truncation: discount 1, bootstrapped
        episodes = int(np.count_nonzero(st[env_id, :count] == StepType.LAST))
        cut += [False] * (episodes - 1) + [bool(was_running)]
        keep.append((env_id, count))

    def per_env(array: np.ndarray) -> np.ndarray:  # [B, T, ...] -> each env's kept steps, env after env
        return np.concatenate([array[env_id, :count] for env_id, count in keep])

    step_types = per_env(st).astype(np.int8)
    actions = per_env(ac)
    actions[step_types == StepType.LAST] = 0  # the env ignores a LAST step's action (autoreset)
    observation = ({k: per_env(v) for k, v in stacked_obs.items()} if isinstance(stacked_obs, dict)
                   else per_env(stacked_obs))
    steps = Steps(step_type=step_types, reward=per_env(rw).astype(np.float32), discount=per_env(dc).astype(np.float32),
                  observation=observation, action=actions,
                  num_episodes=int(np.count_nonzero(step_types == StepType.LAST)),
                  observation_space=env.observation_space, action_space=env.action_space)
    return steps, np.array(cut)


def head(steps: Steps, num_steps: Optional[int]) -> Steps:
    """The first ``num_steps`` steps (all if None); a cut landing on an episode's FIRST step leaves that step out (it
    holds no transition, and ``Steps.head`` would turn it into a LAST after a LAST)."""
    if num_steps is None or num_steps >= len(steps):
        return steps
    if steps.step_type[num_steps - 1] == StepType.FIRST:
        num_steps -= 1
    return steps.head(num_steps)


def episode_returns(steps: Steps) -> np.ndarray:
    """The return of each episode (rewards summed from its FIRST to its LAST step; a FIRST step's reward is 0)."""
    starts = np.flatnonzero(np.asarray(steps.step_type) == StepType.FIRST)
    return np.add.reduceat(np.asarray(steps.reward, np.float64), starts)


# --------------------------------------------------------------------------------------------------------- main ----
# The env data was rolled out in: its name and kwargs, as the stored config named them (None: a replay buffer export).
EnvOrigin = Optional[tuple[str, dict]]


def collect(args: argparse.Namespace) -> tuple[Steps, str, EnvOrigin]:
    """The steps ``args`` ask for, a few words on where they came from (for the summary line), and the env they were
    rolled out in (for the Minari env spec)."""
    if args.from_replay:
        from alfish.replay.offline.from_run import read_run

        path = args.root_dir
        if args.checkpoint_step is not None:
            checkpointer = Checkpointer(os.path.join(args.root_dir, "checkpoints"), root_dir=args.root_dir)
            path = checkpointer.path_of(args.checkpoint_step)
            try:
                kind = kind_in_root(args.root_dir, path)
            except UnsafePathError as err:
                raise CollectError(str(err)) from None
            if kind == "missing":
                raise CollectError(f"no checkpoint at step {args.checkpoint_step}: {path} does not exist")
            if kind != "dir":
                raise CollectError(f"{path} is a {kind}, not a checkpoint directory; alfish never follows links "
                                   "inside a results directory")
        steps = read_run(path)
        check_steps(steps)
        steps = head(steps, args.num_steps)
        returns = episode_returns(steps)
        about = (f"mean return {returns.mean():.2f} over {_count(len(returns), 'episode')}; exported from the replay "
                 f"buffer of {path}")
        return dataclasses.replace(steps, source=f"alfish.bin.collect --from_replay {args.root_dir}"), about, None
    trusted = trusted_prefixes(args.allow_import)
    ckpt = load_env_config(args, trusted)
    env = create_env(args, trusted)
    origin = (env.env_name, dict(environment_settings().env_kwargs or {}))  # (the bindings create_env made it from)
    try:
        if args.random:
            policy, what = (lambda time_step: env.random_action()), "a uniformly random policy"
        else:
            policy = trained_policy(args, env, ckpt)
            what = f"the policy of {ckpt.path} (epsilon_greedy {args.epsilon_greedy:g})"
        steps, cut = rollout(env, policy, args.num_steps, args.seed)
    finally:
        env.close()
    returns = episode_returns(steps)
    whole = returns[~cut]
    mean = (f"mean return {whole.mean():.2f} over {_count(len(whole), 'complete episode')}" if len(whole) else
            f"no complete episode (mean return {returns.mean():.2f} over the cut one{'s' * (len(returns) > 1)})")
    about = f"{mean}, {int(cut.sum())} cut at the step budget; {what} in {env.env_name} x {args.num_envs}"
    return dataclasses.replace(steps, source=f"alfish.bin.collect {args.root_dir}"), about, origin


def write_minari_dataset(steps: Steps, args: argparse.Namespace, origin: EnvOrigin) -> None:
    """``steps`` as the Minari dataset ``--out``, recording the env spec of ``origin`` when it is a registered env (so
    ``MinariDataset.recover_environment()`` works), else why there is none."""
    from alfish.replay.offline.minari_format import registered_env_spec, write_minari

    if origin is None:
        spec, why_none = None, (f"exported from the replay buffer of {args.root_dir} (--from_replay), whose env is "
                                "not read")
    else:
        spec, why_none = registered_env_spec(*origin)
    # (an absolute path: write_minari fails on a relative one, as minari joins its data path twice)
    write_minari(steps, os.path.abspath(args.out), args.dataset_id or "alfish/dataset-v0", spec, why_none)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        check_args(args)
        steps, about, origin = collect(args)
        check_steps(steps)
    except (CollectError, CheckpointError, ConfError, ValueError, TypeError, KeyError, ImportError,
            gym.error.Error) as err:
        # ValueError includes an env that breaks its contract (EnvContractError) and data that breaks the convention;
        # ImportError a trusted (--allow_import) env module that is not installed.
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    try:
        if args.format == "minari":
            write_minari_dataset(steps, args, origin)
        else:
            from alfish.replay.offline.alfish_format import write_dataset

            write_dataset(steps, args.out)
    except (FileExistsError, ValueError, ImportError) as err:  # (--out created meanwhile; a space it cannot store)
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: writing the dataset to {args.out} failed: {one_line(err)}", file=sys.stderr)
        return 1
    print(f"wrote {len(steps)} steps, {_count(steps.num_episodes, 'episode')} to {args.out} ({args.format}); {about}",
          flush=True)
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


if __name__ == "__main__":
    sys.exit(main())
