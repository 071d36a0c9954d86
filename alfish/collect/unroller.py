"""Unrolling: step a batched env with an algorithm's rollout policy. The one unroll loop of alfish: the synchronous
collector runs it in the trainer's process, the async unroll child runs it in its own."""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Optional

import numpy as np
import torch

from alfish.algorithms.base import Algorithm
from alfish.collect.episode_stats import EpisodeStats
from alfish.data import nest
from alfish.data.types import EMPTY, Experience, TimeStep
from alfish.envs.batched_env import BatchedEnv
from alfish.learn.device import CPU


def _identity(nest_: Any) -> Any:
    return nest_


def _as_tensor(value: Any) -> Any:
    return torch.from_numpy(np.array(value)) if isinstance(value, np.ndarray) or isinstance(value, np.generic) \
        else value


def _as_numpy(value: Any) -> Any:
    return value.numpy() if isinstance(value, torch.Tensor) else value


def to_device(nest_: Any, device: torch.device) -> Any:
    """Every tensor of ``nest_`` on ``device`` (``non_blocking``: a host-to-device copy does not wait; a copy to the
    host does, which is what the env needs)."""
    return nest.map_nest(lambda x: x.to(device, non_blocking=device.type != "cpu"), nest_)


class Unroller:
    """Owns the env's current TimeStep; each step taken is ``(time_step, action chosen at it, rollout info)``.

    ``transform`` maps the raw TimeStep to what the algorithm sees (the data transformers' rollout view); off-policy
    storage keeps the raw step, the on-policy trajectory the transformed one. ``stats`` (optional) sees every time
    step the env returns. Construction resets the env (with ``seed``; ``None``: the env's own seed).

    ``device``: where the algorithm acts. The env's time step (host) crosses to it once per env step, batched over
    the envs, before the transformers see it; the action (and the rollout info, when the raw step is stored) cross
    back once. With the CPU nothing is copied.

    ``state``: a recurrent algorithm's state ``[B, ...]`` per env (on ``device``), carried from step to step and set
    back to ``algorithm.initial_state`` at every FIRST step (the first after ``reset`` and each autoreset), before
    ``rollout_step`` sees it. ``EMPTY`` for a stateless algorithm (nothing is done with it).
    """

    def __init__(self, env: BatchedEnv, algorithm: Algorithm, stats: Optional[EpisodeStats] = None,
                 transform: Optional[Callable[[TimeStep], TimeStep]] = None, seed: Optional[int] = None,
                 device: torch.device = CPU):
        self.env, self.algorithm, self.stats = env, algorithm, stats
        self.transform = transform or (lambda time_step: time_step)
        on_host = device.type == "cpu"
        self._to_device = _identity if on_host else (lambda nest_: to_device(nest_, device))
        self._to_host = _identity if on_host else (lambda nest_: to_device(nest_, CPU))
        self.last_env_step_s = 0.0  # wall-clock of the last env.step call
        self.device = device
        self.recurrent = bool(getattr(algorithm, "recurrent", False))
        self.reset(seed)

    def state_dict(self) -> Optional[dict]:
        """Everything the unroll carries from one step to the next, for exact resume: the current time step, the
        recurrent state, the algorithm's exploration state (gSDE's noise matrices), the transformers' rollout state
        (e.g. a frame stack), the episode statistics, and each env's episode seed and actions so far; None when the
        envs cannot give theirs (EnvPool). Tensors and Python scalars only (a checkpoint's contents)."""
        envs = self.env.resume_states()
        if envs is None:
            return None
        return dict(time_step=dict(self.time_step._asdict()), recurrent_state=self.state,
                    exploration=self.algorithm.exploration_state(),
                    transform_state=getattr(self.transform, "state", None),
                    stats=self.stats.state_dict() if self.stats is not None else None,
                    prev_done=torch.from_numpy(self.env._prev_done.copy()),
                    envs=[nest.map_nest(_as_tensor, e) for e in envs])

    def load_state_dict(self, state: dict) -> list[bool]:
        """Put the envs and the unroll back where ``state_dict`` left them; returns, per env, whether its replay
        reproduced the stored observation (when one did not, the caller resets instead: see ``Trainer``)."""
        envs = [nest.map_nest(_as_numpy, e) for e in state["envs"]]
        matched = self.env.restore(envs, np.asarray(state["prev_done"]))
        if not all(matched):
            return matched
        self.time_step, self._seen = TimeStep(**state["time_step"]), None
        if self.recurrent:
            self.state = nest.map_nest(self._on_device, state["recurrent_state"])
        if hasattr(self.transform, "state"):
            self.transform.state = nest.map_nest(self._on_device, state["transform_state"])
        self.algorithm.load_exploration_state(state.get("exploration"))  # (absent from checkpoints before gSDE)
        if self.stats is not None and state["stats"] is not None:
            self.stats.load_state_dict(state["stats"])
        return matched

    def _on_device(self, value: Any) -> Any:
        return value.to(self.device) if isinstance(value, torch.Tensor) else value

    def reset(self, seed: Optional[int] = None) -> None:
        self.time_step: TimeStep = self.env.reset(seed)
        self._seen: Optional[TimeStep] = None  # self.time_step transformed (each env step is transformed once)
        self.state: Any = self.algorithm.initial_state(self.env.num_envs, self.device) if self.recurrent else EMPTY
        self._observe(self.time_step)

    def _state_at(self, seen: TimeStep) -> Any:
        """The state to act from at ``seen``: the carried one, reset at FIRST steps."""
        return self.algorithm.reset_state(self.state, seen.step_type) if self.recurrent else EMPTY

    def _observe(self, time_step: TimeStep) -> None:
        if self.stats is not None:
            self.stats.observe(time_step)

    def seen(self) -> TimeStep:
        """The current time step as the algorithm sees it. Transformed once per env step: stateful transformers
        (frame stacking) and running statistics must not see a step twice."""
        if self._seen is None:
            self._seen = self.transform(self._to_device(self.time_step))
        return self._seen

    def step(self, store_transformed: bool = False, random_actions: bool = False) -> Experience:
        """Act in every env once; returns the step taken ``[B, ...]``: the raw time step (or the transformed one
        with ``store_transformed``), the action chosen at it and the rollout info.

        ``random_actions``: uniformly random actions instead of the policy's (a warm-up for algorithms whose rollout
        stores no info). Gradients follow the caller's mode (see ``unroll``).
        """
        seen = self.seen()  # transformed even when acting randomly: running statistics see every step
        if random_actions:
            action, info = self.env.random_action(), EMPTY
        else:
            alg_step = self.algorithm.rollout_step(seen, self._state_at(seen))
            action, info = alg_step.output, alg_step.info
            if self.recurrent:
                self.state = alg_step.state
        if store_transformed:  # the trajectory stays where it was computed (with its autograd graph)
            taken = Experience.from_time_step(seen, action, info)
            action = self._to_host(action)
        else:  # the raw step goes to host storage: the action and its info cross together
            action, info = self._to_host((action, info))
            taken = Experience.from_time_step(self.time_step, action, info)
        start = time.monotonic()
        self.time_step, self._seen = self.env.step(action), None
        self.last_env_step_s = time.monotonic() - start
        self._observe(self.time_step)
        return taken

    def unroll(self, num_steps: int, store: Callable[[Experience], None], with_grad: bool = False,
               store_transformed: bool = False, random_actions: bool = False) -> None:
        """Take ``num_steps`` steps per env, handing each step ``[B, ...]`` to ``store``; under
        ``torch.inference_mode`` unless ``with_grad``."""
        with contextlib.nullcontext() if with_grad else torch.inference_mode():
            for _ in range(num_steps):
                store(self.step(store_transformed, random_actions))

    def unroll_on_policy(self, num_steps: int, with_grad: bool = True) -> Experience:
        """Unroll with gradients (or, ``with_grad=False``, under ``torch.no_grad``: the algorithm recomputes its
        rollout infos) and return the transformed trajectory ``[num_steps + 1, B]``; the last row is the current step
        with its rollout info computed without gradients (it only bootstraps; its action is not taken)."""
        steps: list[Experience] = []
        with contextlib.nullcontext() if with_grad else torch.no_grad():  # (not inference mode: the trajectory's
            # tensors enter the recomputed forward pass, which autograd saves)
            self.unroll(num_steps, steps.append, with_grad=True, store_transformed=True)
        with torch.no_grad():
            seen = self.seen()
            alg_step = self.algorithm.rollout_step(seen, self._state_at(seen))
        steps.append(Experience.from_time_step(seen, alg_step.output, alg_step.info))
        return nest.stack(steps)
