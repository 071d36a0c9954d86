"""A batch of gymnasium environments that speaks ``TimeStep`` tensors (DESIGN.md §3.5).

Stepping is done by gymnasium's own vector envs (``SyncVectorEnv`` in-process, ``EnvWorkers``: ``AsyncVectorEnv`` in
watched subprocesses), with next-step autoreset: after a LAST step the env returns FIRST and ignores the action it was
given. Each env is made by an ``EnvFactory`` (which, in a worker, first imports what the conf imported) and wrapped in
``ContractCheck``, so an env that breaks its own contract is one ``EnvContractError`` line, in both vectorizations.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

import gin
import gymnasium as gym
import numpy as np
import torch

from alfish.data.types import StepType, TimeStep
from alfish.envs.contract import EnvContractError
from alfish.envs.episode_log import RESTORE, RESTORE_HEARTBEAT, check_resume_states
from alfish.envs.factory import EnvFactory
from alfish.envs.spec import action_layout
from alfish.envs.step_watch import StepWatch
from alfish.envs.workers import EnvWorkers

VECTORIZATIONS = ("sync", "async", "envpool")


class BatchedEnv:
    """``num_envs`` copies of one gymnasium env, stepped together.

    Observations: a Box space, returned as ``[B, *obs_shape]`` float32 (integer Boxes such as uint8 images keep their
    dtype, so the replay buffer stores them compactly), or a Dict of Boxes (goal-conditioned envs), returned as a dict
    of such tensors. Actions: Box (float32 ``[B, *action_shape]``, clipped to the bounds), Discrete (int64 ``[B]``) or
    MultiDiscrete / MultiBinary (int64 ``[B, k]``, handed to the env in its space's dtype); a mixed action (a Tuple or
    Dict of a Discrete and a Box) is a Box here, float32 ``[B, 1 + d]`` packed, each env unpacking its row
    (``alfish.envs.mixed_actions``).
    An env that breaks this contract raises ``EnvContractError`` (one line); a failed async worker ``EnvWorkerError``.
    """

    def __init__(
        self,
        env_name: str,
        num_envs: int,
        seed: int,
        vectorization: str = "sync",
        env_kwargs: Optional[dict] = None,
        render_mode: Optional[str] = None,
        step_timeout_s: float = 60.0,
    ):
        if vectorization not in VECTORIZATIONS:
            raise ValueError(f"create_environment.vectorization='{vectorization}' is not one of {VECTORIZATIONS}")
        if num_envs < 1:
            raise ValueError(f"create_environment.num_parallel_environments={num_envs} must be >= 1")
        self.env_name = env_name
        self.num_envs = num_envs
        self._step_timeout_s = step_timeout_s
        fns = [EnvFactory.here(env_name, env_kwargs, render_mode)] * num_envs
        mode = gym.vector.AutoresetMode.NEXT_STEP
        if vectorization == "envpool" and render_mode is not None:
            # EnvPool does not render: play and recording step the same env through gymnasium in this process.
            logging.info("vectorization='envpool' does not render; using 'sync' for render_mode=%s", render_mode)
            vectorization = "sync"
        if vectorization == "envpool":
            from alfish.envs.envpool_vector import EnvpoolVectorEnv

            self._venv = EnvpoolVectorEnv(env_name, num_envs, seed, env_kwargs)
        elif vectorization == "sync":
            self._venv = gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
        else:
            # forkserver workers: they do not inherit torch's threads or the trainer's signal handlers
            self._venv = EnvWorkers(fns, env_name, step_timeout_s, autoreset_mode=mode)
            self._make_workers = lambda: EnvWorkers(fns, env_name, step_timeout_s, autoreset_mode=mode)
        self._async = vectorization == "async"
        self._envpool = vectorization == "envpool"
        # in-process envs: a step or reset that never returns ends the process (EnvWorkers time out their own)
        self._watch = None if self._async else StepWatch(env_name, vectorization, step_timeout_s)
        self.observation_space = self._venv.single_observation_space
        self.action_space = self._venv.single_action_space
        self.discrete = isinstance(self.action_space, gym.spaces.Discrete)
        self._action_dtype, self.action_shape = action_layout(self.action_space)
        self._integer_actions = not self._action_dtype.is_floating_point  # Discrete, MultiDiscrete, MultiBinary
        self._env_action_dtype = self.action_space.dtype  # e.g. int8 for MultiBinary
        if not self._integer_actions:
            self._low = np.asarray(self.action_space.low, dtype=np.float32)
            self._high = np.asarray(self.action_space.high, dtype=np.float32)
        self._seed = seed
        self._env_id = torch.arange(num_envs, dtype=torch.int64)
        self._prev_done = np.zeros(num_envs, dtype=bool)
        self._zero_action = torch.zeros((num_envs,) + self.action_shape, dtype=self._action_dtype)

    # ----------------------------------------------------------------------------------------------------------------
    def reset(self, seed: Optional[int] = None) -> TimeStep:
        """Reset every env (env ``i`` seeded ``seed + i``; default: the constructor's seed) and return FIRST steps."""
        seed = self._seed if seed is None else seed
        seeds = [seed + i for i in range(self.num_envs)]
        if self._async:
            self._venv.reset_async(seed=seeds)
            obs, _ = self._venv.reset_wait(timeout=self._step_timeout_s)
        else:
            obs, _ = self._watched("reset()", self._venv.reset, seed=seeds)
        self._venv.action_space.seed(seed)  # random_action() is reproducible too
        self._prev_done[:] = False
        n = self.num_envs
        return TimeStep(
            step_type=torch.full((n,), StepType.FIRST, dtype=torch.int8),
            reward=torch.zeros(n),
            discount=torch.ones(n),
            observation=self._to_obs_tensor(obs),
            prev_action=self._zero_action.clone(),
            env_id=self._env_id,
        )

    def step(self, action: torch.Tensor) -> TimeStep:
        """Step every env with ``action`` ``[B, *action_shape]`` and return the next time steps."""
        env_action = self._to_env_action(action)
        if self._async:
            self._venv.step_async(env_action)
            obs, reward, terminated, truncated, _ = self._venv.step_wait(timeout=self._step_timeout_s)
        else:
            obs, reward, terminated, truncated, _ = self._watched("step()", self._venv.step, env_action)
        first = self._prev_done
        done = terminated | truncated
        step_type = np.where(first, StepType.FIRST, np.where(done, StepType.LAST, StepType.MID)).astype(np.int8)
        discount = np.where(terminated & ~first, 0.0, 1.0).astype(np.float32)
        reward = np.where(first, 0.0, reward).astype(np.float32)
        self._prev_done = done & ~first
        prev_action = action.detach()
        if first.any():
            prev_action = torch.where(torch.from_numpy(first).view((-1,) + (1,) * len(self.action_shape)),
                                      self._zero_action, prev_action)
        return TimeStep(
            step_type=torch.from_numpy(step_type),
            reward=torch.from_numpy(reward),
            discount=torch.from_numpy(discount),
            observation=self._to_obs_tensor(obs),
            prev_action=prev_action,
            env_id=self._env_id,
        )

    # ------------------------------------------------------------------------------------------------ exact resume
    def resume_states(self) -> Optional[list[dict]]:
        """Each env's episode seed, actions so far and last observation (``EpisodeLog.resume_state``), or None when
        the envs cannot say (``vectorization='envpool'``)."""
        if self._envpool:
            return None
        return list(self._call("resume_state"))

    def restore(self, states: list[dict], prev_done: np.ndarray) -> list[bool]:
        """Put every env back where ``resume_states`` left it (reset with its episode's seed, the actions replayed);
        returns, per env, whether its last observation came out as stored (False: the env is not deterministic, or
        its episode was too long to log, or its log was damaged: ``check_resume_states``). ``prev_done``: which envs
        had just ended an episode."""
        options = {RESTORE: dict(enumerate(check_resume_states(states, self.env_name)))}
        indices = list(range(self.num_envs))  # (each env's seed argument is its index: it picks its own state)
        if self._async:
            self._venv.reset_async(seed=indices, options=options)
            self._venv.reset_wait(timeout=self._step_timeout_s)
        else:
            # each replayed step may take step_timeout_s, not the whole replay: the env re-arms the watch per step
            options[RESTORE_HEARTBEAT] = self._watch.rearm
            self._watched("reset() replaying its logged actions", self._venv.reset, seed=indices, options=options)
        self._prev_done[:] = prev_done
        return [bool(m) for m in self._call("restored_exactly")]

    def _call(self, name: str) -> tuple:
        if self._async:
            self._venv.call_async(name)
            return self._venv.call_wait(timeout=self._step_timeout_s)
        return self._watched(f"call('{name}')", self._venv.call, name)

    def _watched(self, doing: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)`` of the in-process vector env, under the hang guard (``StepWatch``)."""
        watch = self._watch
        watch.arm(doing)
        try:
            return call(*args, **kwargs)
        finally:
            watch.disarm()

    def random_action(self) -> torch.Tensor:
        """A uniformly random action for each env, ``[B, *action_shape]``."""
        return torch.as_tensor(self._venv.action_space.sample(), dtype=self._action_dtype)

    def render(self) -> Any:
        return self._venv.render()

    def close(self) -> None:
        self._venv.close()

    def number_from(self, first_env_id: int) -> "BatchedEnv":
        """Number the envs ``first_env_id, first_env_id + 1, ...`` (their ``env_id``: the replay buffer's rings):
        one of several batches of a rank's envs, as an async unroll's processes step them. Returns ``self``."""
        self._env_id = torch.arange(first_env_id, first_env_id + self.num_envs, dtype=torch.int64)
        return self

    @property
    def seed(self) -> int:
        """The seed ``reset`` uses by default (env ``i``: ``seed + i``)."""
        return self._seed

    def restart_workers(self) -> None:
        """``vectorization='async'``: replace the env worker processes (after one died, raised or hung: the old ones
        are terminated) by new ones making the same envs; ``reset`` next. Every env's episode in flight is lost."""
        if not self._async:
            raise RuntimeError("only env worker processes (vectorization='async') can be restarted")
        try:
            self._venv.close(terminate=True)
        except Exception:  # noqa: BLE001  (the failed workers may not close cleanly: they are terminated anyway)
            pass
        self._venv = self._make_workers()
        self._prev_done[:] = False

    # ----------------------------------------------------------------------------------------------------------------
    def _to_obs_tensor(self, obs: Any) -> Any:
        if isinstance(self.observation_space, gym.spaces.Dict):
            return {key: self._to_tensor(obs[key], space, f"observation['{key}']")
                    for key, space in self.observation_space.spaces.items()}
        return self._to_tensor(obs, self.observation_space, "observation")

    def _to_tensor(self, obs: np.ndarray, space: gym.spaces.Box, what: str) -> torch.Tensor:
        expected = (self.num_envs,) + tuple(space.shape)
        if obs.shape != expected:
            raise EnvContractError(f"env '{self.env_name}' returned {what} of shape {list(obs.shape)} but its "
                                   f"observation_space {space} with {self.num_envs} envs means "
                                   f"{list(expected)}; fix the env's observation_space or its step/reset")
        if np.issubdtype(space.dtype, np.integer):
            return torch.as_tensor(obs.astype(space.dtype, copy=False))
        return torch.as_tensor(obs, dtype=torch.float32)

    def _to_env_action(self, action: torch.Tensor) -> np.ndarray:
        expected = (self.num_envs,) + self.action_shape
        if not isinstance(action, torch.Tensor):
            raise ValueError(f"action is a {type(action).__module__}.{type(action).__name__} but env '{self.env_name}' "
                             f"expects a torch.Tensor of shape {list(expected)}")
        if tuple(action.shape) != expected:
            got = list(action.shape)
            raise ValueError(f"action has shape {got} but env '{self.env_name}' ({self.action_space}) with "
                             f"{self.num_envs} envs expects {list(expected)}")
        if self._integer_actions:
            if action.dtype.is_floating_point or action.dtype == torch.bool:
                raise ValueError(f"action has dtype {action.dtype} but env '{self.env_name}' ({self.action_space}) "
                                 "expects an integer dtype (e.g. torch.int64)")
            return action.numpy().astype(self._env_action_dtype, copy=False)
        if not action.dtype.is_floating_point:
            raise ValueError(f"action has dtype {action.dtype} but env '{self.env_name}' ({self.action_space}) "
                             "expects a floating dtype (e.g. torch.float32)")
        return np.clip(action.detach().numpy(), self._low, self._high)


@dataclasses.dataclass(frozen=True)
class EnvSettings:
    """How to build a batched env (picklable: the async unroll child builds its envs from it)."""

    env_name: str
    num_parallel_environments: int
    seed: int
    vectorization: str
    env_kwargs: Optional[dict]
    render_mode: Optional[str]
    step_timeout_s: float
    first_env_id: int = 0  # env ids (rings of the replay buffer) start here: one share of a rank's envs

    def create(self) -> BatchedEnv:
        logging.debug("creating %d x %s (%s)", self.num_parallel_environments, self.env_name, self.vectorization)
        env = BatchedEnv(self.env_name, self.num_parallel_environments, self.seed, self.vectorization,
                         self.env_kwargs, self.render_mode, self.step_timeout_s)
        return env.number_from(self.first_env_id) if self.first_env_id else env

    def share(self, index: int, num_shares: int) -> "EnvSettings":
        """Share ``index`` of ``num_shares`` equal shares of these envs: ``B / num_shares`` envs whose ids and seeds
        continue where the previous share's end (env ``i`` of the whole batch keeps id ``i`` and seed ``seed + i``,
        whichever share steps it). ``B`` must divide evenly."""
        if self.num_parallel_environments % num_shares:
            raise ValueError(f"create_environment.num_parallel_environments={self.num_parallel_environments} must be "
                             f"a multiple of Trainer.num_unroll_processes={num_shares} (each process steps an "
                             "equal share of the envs)")
        size = self.num_parallel_environments // num_shares
        first = self.first_env_id + index * size
        return dataclasses.replace(self, num_parallel_environments=size, seed=self.seed + index * size,
                                   first_env_id=first)


@gin.configurable("create_environment")
def environment_settings(
    env_name: str = "CartPole-v1",
    num_parallel_environments: int = 1,
    seed: int = 0,
    vectorization: str = "sync",
    env_kwargs: Optional[dict] = None,
    render_mode: Optional[str] = None,
    step_timeout_s: float = 60.0,
) -> EnvSettings:
    """The batched environment's settings, from gin (gin name ``create_environment``); calling it records them in the
    operative config even when another process builds the envs.

    env_name: any registered gymnasium id (classic control, box2d, MuJoCo, ``alfish/*`` toys).
    num_parallel_environments: ``B``, the number of envs stepped together.
    vectorization: ``'sync'`` (in this process), ``'async'`` (one subprocess per env, gymnasium AsyncVectorEnv) or
        ``'envpool'`` (EnvPool's C++ thread pool, ``pip install envpool``; Atari and EnvPool's other tasks).
    step_timeout_s: seconds a step or reset may take. ``'async'``: then it is an error naming the worker and showing its
        Python stack (a worker's start-up may take at least 60 s); a worker that dies is an error at once, never a
        hang. ``'sync'``/``'envpool'`` (in this process, which cannot interrupt the env): the process ends with one
        line naming the env and where it hung, exit code 1 (``alfish/envs/step_watch.py``).
    """
    return EnvSettings(env_name, num_parallel_environments, seed, vectorization, env_kwargs, render_mode,
                       step_timeout_s)


def create_environment(**overrides: Any) -> BatchedEnv:
    """Build the batched environment from gin's ``create_environment.*`` bindings; keyword arguments override them."""
    return environment_settings(**overrides).create()
