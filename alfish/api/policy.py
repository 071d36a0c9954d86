"""``alfish.load_policy``: a trained policy read back from its results directory, acting on one gymnasium env.

The policy is built as ``python -m alfish.bin.play`` builds it, under the same trust rules (DESIGN.md §3.13): the
checkpoint's tensors are loaded with ``weights_only=True``, its recorded config is parsed as data in the restricted
mode (alfish's configurables only; your own modules with ``allow_import``, as play's ``--allow_import``), and it acts
through ``alfish.evaluate.acting.GreedyPolicy``, the one acting function of evaluation, play, collect and export:
the data transformers' rollout view with their statistics frozen, then ``predict_step`` (greedy, or
``epsilon_greedy``), carrying the recurrent state and resetting it at each episode's first step.

What ``Policy.act`` adds is the conversion of one gymnasium observation (numpy) into the batch of one alfish time step,
as ``alfish.envs.batched_env.BatchedEnv`` converts the observations of its envs, and of the action back into what the
env takes (integers in the action space's dtype; Box actions clipped to the bounds), as ``BatchedEnv`` hands them to
its envs. The time step it builds carries reward 0 (no alfish policy acts on the reward) and discount 1.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional, Sequence

import gin
import gymnasium as gym
import numpy as np
import torch

from alfish.algorithms.base import Algorithm
from alfish.bin.play import env_settings
from alfish.bin.stored_run import load_checkpoint, load_policy_config, one_line, restore_policy
from alfish.config import ConfError
from alfish.config.untrusted import trusted_prefixes
from alfish.data.types import StepType, TimeStep
from alfish.envs.factory import EnvFactory
from alfish.envs.spec import EnvSpec, action_layout
from alfish.evaluate.acting import GreedyPolicy
from alfish.rundir.checkpoint import CheckpointError, LoadedCheckpoint
from alfish.transforms.base import SequentialDataTransformer


class LoadPolicyError(Exception):
    """A results directory ``alfish.load_policy`` cannot act from, or a bad argument: one line saying what to change
    (what ``python -m alfish.bin.play`` prints as its ``error:`` line)."""


class Policy:
    """A trained policy acting on one env, one observation at a time.

    ``act(observation) -> action`` takes the env's observation (numpy, as ``env.reset``/``env.step`` return it; a dict
    for a Dict space) and returns the action to pass to ``env.step`` (numpy: a scalar of the space's dtype for a
    Discrete, an array of the action shape otherwise). Call ``reset()`` when the env resets: the next ``act`` then
    starts an episode (the recurrent state, if any, starts over). A new ``Policy`` starts an episode too.

    Attributes:
        observation_space, action_space: those of the env it was trained on (as alfish's env wrappers show them).
        env_name: the gymnasium id of that env; ``make_env()`` makes one as training made it.
        checkpoint: the checkpoint directory its weights came from; ``iteration``: the training iteration of it.
        algorithm, transformer: the restored ``Algorithm`` and data transformers (torch modules in eval mode).
    """

    def __init__(self, acting: GreedyPolicy, transformer: SequentialDataTransformer, factory: EnvFactory,
                 spec: EnvSpec, checkpoint: LoadedCheckpoint):
        self._acting, self._factory = acting, factory
        self.algorithm: Algorithm = acting.algorithm
        self.transformer = transformer
        self.observation_space, self.action_space = spec.observation_space, spec.action_space
        self.env_name = factory.env_name
        self.checkpoint, self.iteration = checkpoint.path, checkpoint.step
        action_dtype, self._action_shape = action_layout(self.action_space)
        self._integer_actions = not action_dtype.is_floating_point
        self._zero_action = torch.zeros((1,) + self._action_shape, dtype=action_dtype)
        if not self._integer_actions:
            self._low = np.asarray(self.action_space.low, dtype=np.float32)
            self._high = np.asarray(self.action_space.high, dtype=np.float32)
        self.reset()

    def reset(self) -> None:
        """Start a new episode: the next ``act`` is its first step."""
        self._acting.reset()
        self._first = True
        self._prev_action = self._zero_action

    def act(self, observation: Any) -> Any:
        """The action for ``observation`` (one env's, numpy); advances the episode.

        Raises:
            ValueError: the observation does not fit the observation space (one line).
        """
        time_step = TimeStep(step_type=torch.full((1,), StepType.FIRST if self._first else StepType.MID,
                                                  dtype=torch.int8),
                             reward=torch.zeros(1), discount=torch.ones(1),
                             observation=self._observation_batch(observation), prev_action=self._prev_action,
                             env_id=torch.zeros(1, dtype=torch.int64))
        action = self._acting(time_step)  # [1, *action_shape], on the host
        self._first, self._prev_action = False, action
        if self._integer_actions:
            return action.numpy().astype(self.action_space.dtype, copy=False)[0]
        return np.clip(action.numpy(), self._low, self._high)[0]

    def make_env(self, render_mode: Optional[str] = None) -> gym.Env:
        """A new env as training made each of its envs: ``gymnasium.make(env_name, **env_kwargs)`` (alfish's Atari
        preprocessing for ``ALE/`` ids) inside alfish's contract check, which raises ``EnvContractError`` (one line)
        when the env returns what its spaces do not allow. ``render_mode``: e.g. ``'rgb_array'`` or ``'human'``."""
        return dataclasses.replace(self._factory, render_mode=render_mode)()

    def _observation_batch(self, observation: Any) -> Any:
        """``observation`` as a batch of one: ``[1, *shape]`` tensors, integer Boxes in their dtype, the rest float32
        (as ``BatchedEnv`` returns observations); a dict of them for a Dict space."""
        space = self.observation_space
        if not isinstance(space, gym.spaces.Dict):
            return _leaf_batch(observation, space, "observation")
        if not isinstance(observation, Mapping) or set(observation) != set(space.spaces):
            got = sorted(observation) if isinstance(observation, Mapping) else type(observation).__name__
            raise ValueError(f"observation must be a dict with the keys {sorted(space.spaces)} of the policy's "
                             f"observation space, got {got}")
        return {key: _leaf_batch(observation[key], leaf, f"observation['{key}']") for key, leaf in space.spaces.items()}


def _leaf_batch(value: Any, space: gym.spaces.Box, what: str) -> torch.Tensor:
    array = np.asarray(value)
    if array.shape != tuple(space.shape):
        raise ValueError(f"{what} has shape {list(array.shape)} but the policy's observation space {space} has shape "
                         f"{list(space.shape)}; pass one env's observation, as env.reset()/env.step() return it")
    if np.issubdtype(space.dtype, np.integer):
        return torch.as_tensor(array.astype(space.dtype, copy=False)[None])
    return torch.as_tensor(array[None], dtype=torch.float32)


def load_policy(root_dir: str | os.PathLike, best: bool = False, *, checkpoint_step: Optional[int] = None,
                allow_import: Sequence[str] = (), epsilon_greedy: float = 0.0) -> Policy:
    """The policy of ``root_dir``'s newest checkpoint that verifies, as ``python -m alfish.bin.play --root_dir
    ROOT_DIR`` plays it (module docstring).

    Args:
        root_dir: a results directory written by ``alfish.train`` or ``python -m alfish.bin.train``.
        best: the policy of the best evaluation (ROOT_DIR/checkpoints/best, kept by ``Trainer.keep_best_checkpoint``;
            play's ``--best``).
        checkpoint_step: the checkpoint of this training iteration instead of the newest (``--checkpoint_step``).
        allow_import: module prefixes the stored config may import and use (your own env or network package;
            ``--allow_import``); ``['*']`` trusts the results directory completely.
        epsilon_greedy: the probability of each step's action being sampled from the policy instead of greedy
            (``--epsilon_greedy``); 0: always greedy.

    Raises:
        LoadPolicyError: one line: no checkpoint that verifies, a stored config that names what is not trusted, a
            supervised run (no policy), an env that cannot be made, a bad argument.
    """
    root_dir = os.fspath(root_dir)
    check_arguments(best, checkpoint_step, allow_import, epsilon_greedy)
    try:
        trusted = trusted_prefixes(allow_import)
        ckpt = load_checkpoint(root_dir, checkpoint_step, best)
        config = load_policy_config(root_dir, ckpt, trusted, "act with")
        settings = env_settings(seed=0, render_mode=None, trusted=trusted)
        factory = EnvFactory.here(settings.env_name, settings.env_kwargs, None)  # (with the config's imports)
        env = settings.create()
        try:
            spec = EnvSpec.of(env)
            transformer, algorithm = restore_policy(config, env, ckpt)
        finally:
            env.close()
    except (CheckpointError, ConfError, ValueError, TypeError, KeyError, ImportError, gym.error.Error) as err:
        # as play reports them: ValueError includes an env that breaks its contract (EnvContractError)
        raise LoadPolicyError(one_line(err)) from err
    finally:
        gin.clear_config()  # the stored config was parsed into gin's process-global config
    acting = GreedyPolicy.frozen(transformer, algorithm, epsilon_greedy)
    return Policy(acting, transformer, factory, spec, ckpt)


def check_arguments(best: bool, checkpoint_step: Optional[int], allow_import: Sequence[str],
                    epsilon_greedy: float) -> None:
    """Raises ``LoadPolicyError`` (one line) for arguments that name nothing sensible."""
    if best and checkpoint_step is not None:
        raise LoadPolicyError("best=True and checkpoint_step name different checkpoints; give one")
    if isinstance(allow_import, str):
        raise LoadPolicyError(f"allow_import must be a list of module prefixes, got the string {allow_import!r}: "
                              f"pass [{allow_import!r}]")
    if not 0.0 <= epsilon_greedy <= 1.0:
        raise LoadPolicyError(f"epsilon_greedy={epsilon_greedy} must be a probability in [0, 1]")
