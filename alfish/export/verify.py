"""Checking an exported program against the torch policy it came from, as ``play`` runs that policy.

The reference is play's path with ``--epsilon_greedy 0`` (``alfish.evaluate.acting.GreedyPolicy``: the transformers'
rollout view with frozen statistics, ``algorithm.reset_state`` at FIRST steps, ``algorithm.predict_step``), and a Box
action clipped to the bounds as ``BatchedEnv`` clips it. Two checks:
  - sampled: one batch of observations drawn from the env's observation space (recurrent policies: with random
    states), through both in one call;
  - rollout: the env stepped with the reference's actions; the program gets each observation with its own carried
    state (zeros at every FIRST step, as a caller resets it), so state drift over an episode would show.
Each reports the largest absolute difference over every output (actions, and next states of recurrent policies).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch.utils import _pytree as pytree

from alfish.algorithms.base import Algorithm
from alfish.collect.unroller import to_device
from alfish.data.types import StepType, TimeStep
from alfish.envs.batched_env import BatchedEnv
from alfish.evaluate.acting import GreedyPolicy
from alfish.export.formats import Runner
from alfish.export.policy_module import ExportedPolicy
from alfish.learn.device import CPU
from alfish.transforms.base import SequentialDataTransformer

#: The largest absolute difference between the program's and the torch policy's outputs that passes.
TOLERANCE = 1e-5


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """One check: what was compared (``count`` samples or steps) and the largest absolute difference per output."""

    name: str
    count: int
    max_abs_diff: dict[str, float]

    @property
    def worst(self) -> float:
        return max(self.max_abs_diff.values())

    def describe(self) -> str:
        diffs = ", ".join(f"{name} {value:.3g}" for name, value in self.max_abs_diff.items())
        return f"{self.name}: max abs diff {diffs}"


class ReferencePolicy:
    """The torch policy as play runs it (``GreedyPolicy``, greedy), with a Box action clipped as the env clips it."""

    def __init__(self, transformer: SequentialDataTransformer, algorithm: Algorithm, action_space: gym.Space):
        self.transformer, self.algorithm = transformer, algorithm
        self.bounds = None if not isinstance(action_space, gym.spaces.Box) else (
            np.asarray(action_space.low, np.float32), np.asarray(action_space.high, np.float32))

    def stream(self) -> GreedyPolicy:
        """A new stream (its own transformer state), statistics frozen, as play opens one."""
        return GreedyPolicy.frozen(self.transformer, self.algorithm)

    def act(self, stream: GreedyPolicy, time_step: TimeStep) -> np.ndarray:
        """``stream``'s action for ``time_step`` ``[B]`` as the env executes it (its next state: ``stream.state``)."""
        action = to_device(stream.act(time_step).action, CPU).numpy()
        if self.bounds is not None:  # what BatchedEnv executes
            action = np.clip(action.reshape((action.shape[0],) + self.bounds[0].shape), *self.bounds)
        return action


def check_sampled(policy: ExportedPolicy, reference: ReferencePolicy, run: Runner, observation_space: gym.Space,
                  batch_size: int, seed: int) -> CheckResult:
    """Both on one batch of ``batch_size`` observations sampled from ``observation_space`` (seeded); a recurrent
    policy's state inputs are random (normal, std 0.5), the reference acting from the same state."""
    observation_space.seed(seed)
    samples = [observation_space.sample() for _ in range(batch_size)]
    generator = torch.Generator().manual_seed(seed)
    states = [torch.randn((batch_size,) + spec.shape, generator=generator) * 0.5 for spec in policy.state_specs]
    observation = _stack(samples, policy)
    time_step = _time_step(observation, batch_size, StepType.MID, policy)
    stream = reference.stream()
    stream.state = policy.state_from_leaves(states)  # (a MID step: acted on as it is)
    action = reference.act(stream, time_step)
    outputs = run(_inputs(observation, [s.numpy() for s in states], policy))
    return CheckResult(f"{batch_size} sampled observations", batch_size,
                       _diffs(policy, outputs, action, stream.state))


def check_rollout(policy: ExportedPolicy, reference: ReferencePolicy, run: Runner, env: BatchedEnv, num_steps: int,
                  seed: int) -> CheckResult:
    """``num_steps`` steps of ``env`` acted on by the reference; the program sees each observation with the state it
    returned at the step before (zeros at FIRST steps). Differences are the largest over all steps."""
    stream = reference.stream()
    time_step = env.reset(seed=seed)
    program_state = [s.numpy() for s in policy.initial_state(env.num_envs)]
    worst: dict[str, float] = {}
    for _ in range(num_steps):
        if policy.recurrent:
            first = (time_step.step_type == StepType.FIRST).numpy()
            program_state = [np.where(first.reshape((-1,) + (1,) * (s.ndim - 1)), 0, s).astype(s.dtype)
                             for s in program_state]
        observation = time_step.observation
        action = reference.act(stream, time_step)
        outputs = run(_inputs(observation, program_state, policy))
        for name, value in _diffs(policy, outputs, action, stream.state).items():
            worst[name] = max(worst.get(name, 0.0), value)
        program_state = list(outputs[1:])
        time_step = env.step(torch.from_numpy(action))
    return CheckResult(f"rollout of {num_steps} steps in {env.env_name}", num_steps, worst)


def _stack(samples: list, policy: ExportedPolicy) -> Any:
    """Samples of the space -> the observation as BatchedEnv returns it (a tensor, or a dict of tensors)."""
    def one(values: list, spec: Any) -> torch.Tensor:
        return torch.as_tensor(np.stack(values).astype(spec.dtype))
    if policy.observation_keys is None:
        return one(samples, policy.observation_specs[0])
    return {spec.name: one([s[spec.name] for s in samples], spec) for spec in policy.observation_specs}


def _inputs(observation: Any, states: list[np.ndarray], policy: ExportedPolicy) -> list[np.ndarray]:
    """The program's inputs: the observation's tensors (a Dict's in key order), then the state."""
    leaves = [observation] if policy.observation_keys is None else [observation[k] for k in policy.observation_keys]
    return [x.numpy() for x in leaves] + list(states)


def _time_step(observation: Any, batch_size: int, step_type: int, policy: ExportedPolicy) -> TimeStep:
    """A time step ``[batch_size]`` as BatchedEnv would give it, with ``observation``."""
    return TimeStep(step_type=torch.full((batch_size,), step_type, dtype=torch.int8), reward=torch.zeros(batch_size),
                    discount=torch.ones(batch_size), observation=observation,
                    prev_action=torch.zeros((batch_size,) + policy.action_shape,
                                            dtype=torch.int64 if policy.discrete else torch.float32),
                    env_id=torch.arange(batch_size))


def _diffs(policy: ExportedPolicy, outputs: list[np.ndarray], action: np.ndarray, state: Any) -> dict[str, float]:
    """Largest absolute difference per output; a shape or dtype kind that differs is an infinite difference."""
    expected = [action] + [s.numpy() for s in pytree.tree_leaves(state)]
    diffs = {}
    for spec, got, want in zip(policy.output_specs, outputs, expected):
        if got.shape != want.shape or got.dtype.kind != want.dtype.kind:
            diffs[spec.name] = float("inf")
        else:
            diffs[spec.name] = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))
    return diffs
