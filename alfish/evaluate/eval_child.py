"""The async evaluator's child process: builds the evaluation envs and a copy of the policy, then evaluates each set
of parameters the trainer publishes, one at a time, with the same ``Evaluator`` as synchronous evaluation.

Everything here runs in the child (started with ``spawn``); ``eval_child_main`` is its entry point. The trainer's
side is ``alfish.evaluate.async_evaluator``.
"""
from __future__ import annotations

import dataclasses
import pickle
import queue
import time
import traceback
from typing import Any, Callable, Optional

import torch

from alfish.collect.child_process import (
    ChildChannels,
    build_acting_policy,
    finish_child,
    resolved_acting_device,
    start_child,
)
from alfish.collect.shared_params import POLL_S, ParamBlock, SharedParams, rollout_state
from alfish.envs.batched_env import EnvSettings
from alfish.envs.spec import EnvSpec


@dataclasses.dataclass
class EvalSpec:
    """Everything the child needs, picklable.

    env_settings: the evaluation envs (read under gin's ``eval`` scope, seeded with the evaluation seed).
    env_spec: the training envs' spec: the policy copy is built from it, as the trainer built its own.
    config_text: the gin config (parsed in the child for the algorithm and the data transformers).
    gin_constants: the ``gin.constant`` values registered here (``gin_constants()``): the text names them only.
    seed: the evaluation seed; the k-th evaluation resets its envs with ``reseed(seed, k)``.
    uncertainty: ``TrainerConfig.eval_uncertainty`` (the critics are shipped and evaluated too).
    acting_device: where the policy copy acts, ``DevicePolicy.rollout_device`` resolved in the trainer when the spec
    is made (under torchrun with its ``LOCAL_RANK``: the child has none).
    """

    env_settings: EnvSettings
    env_spec: EnvSpec
    config_text: str
    root_dir: str
    gin_constants: dict[str, Any]
    num_episodes: int
    epsilon_greedy: float
    seed: int
    uncertainty: bool
    parent_pid: int
    acting_device: torch.device = dataclasses.field(default_factory=resolved_acting_device)


class EvalShared(SharedParams):
    """The version and lock of the parameter block, plus the request that goes with each version (``progress``:
    iteration, env steps, the run's elapsed seconds, the evaluation's index k), the child's readiness and a heartbeat
    (env steps it took; the trainer calls an evaluation hung when it stops moving)."""

    def __init__(self, ctx: Any):
        super().__init__(ctx)
        self.progress = ctx.RawArray("d", 4)
        self.ready = ctx.RawValue("b", 0)
        self.heartbeat = ctx.RawValue("q", 0)


def eval_state(algorithm: torch.nn.Module, transformer: torch.nn.Module, uncertainty: bool) -> dict[str, torch.Tensor]:
    """The tensors an evaluation needs, by name: the rollout policy's (``rollout_state``), plus the critic ensemble's
    with ``uncertainty``."""
    state = rollout_state(algorithm, transformer)
    if uncertainty and getattr(algorithm, "rollout_module_names", None) is not None:
        for key, value in algorithm.state_dict().items():
            if key.startswith("critics."):
                state["algorithm." + key] = value
    return state


class _Abandoned(BaseException):
    """The trainer is gone or asked us to stop in the middle of an evaluation."""


class _Heartbeat:
    """The env, counting its resets and steps into the shared heartbeat, and abandoning the evaluation at the next
    step once ``keep_going()`` turns False (an evaluation can be long: the child must not outlive its trainer)."""

    def __init__(self, env: Any, counter: Any, keep_going: Callable[[], bool]):
        self.env, self.counter, self.keep_going = env, counter, keep_going
        self.num_envs = env.num_envs

    def reset(self, **kwargs: Any) -> Any:
        self.counter.value += 1
        return self.env.reset(**kwargs)

    def step(self, action: torch.Tensor) -> Any:
        if not self.keep_going():
            raise _Abandoned()
        self.counter.value += 1
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()


def eval_child_main(spec: EvalSpec, shared: EvalShared, channels: ChildChannels) -> None:
    """Build the eval envs and the policy copy, say so (``shared.ready``), attach to the parameter block when the
    trainer names it, then evaluate every new version until told to stop (``stop.value``) or the trainer is gone.
    Every exception goes to the trainer with its traceback."""
    env = block = None
    phase = "startup"
    try:
        config, parent_alive = start_child(spec)
        import gin

        with gin.config_scope("eval"):
            env = spec.env_settings.create()
        keep_going = lambda: not channels.stop.value and parent_alive()  # noqa: E731
        algorithm, tensors, evaluator = _evaluation_parts(spec, config, _Heartbeat(env, shared.heartbeat, keep_going))
        shared.ready.value = 1
        phase = "evaluation"
        name = _wait_for_block(channels, parent_alive)
        if name is not None:
            block = ParamBlock(shared, tensors, name=name)
            _serve(evaluator, algorithm, block, tensors, spec.seed, channels, parent_alive)
    except _Abandoned:
        exit_code = 0
    except BaseException as err:  # noqa: BLE001  (everything, including KeyboardInterrupt, goes to the parent)
        channels.errors.put((phase, _portable(err), traceback.format_exc()))
        exit_code = 1
    else:
        exit_code = 0
    finish_child((env, block), channels.results, channels.errors, exit_code)  # (os._exit: no interpreter teardown)


def _evaluation_parts(spec: EvalSpec, config: Any, env: Any) -> tuple[torch.nn.Module, dict[str, torch.Tensor], Any]:
    """``(algorithm, tensors, evaluator)``: the policy copy on ``spec.acting_device`` (resolved by the trainer: the CPU
    unless ``DevicePolicy.rollout_device`` says otherwise), the tensors the published parameters are read into, and
    the ``Evaluator`` stepping ``env`` with it."""
    from alfish.evaluate.evaluator import Evaluator

    transformer, algorithm = build_acting_policy(config, spec.env_spec, spec.acting_device)
    tensors = eval_state(algorithm, transformer, spec.uncertainty)
    evaluator = Evaluator(env, spec.num_episodes, spec.epsilon_greedy, seed=spec.seed,
                          transform=transformer.rollout_view(update_stats=False), uncertainty=spec.uncertainty)
    return algorithm, tensors, evaluator


def _serve(evaluator: Any, algorithm: torch.nn.Module, block: ParamBlock, tensors: dict[str, torch.Tensor],
           seed: int, channels: ChildChannels, parent_alive: Callable[[], bool]) -> None:
    """Evaluate the published version whenever the version moves (the trainer publishes the next one only after
    this one's result arrived)."""
    from alfish.seeding import reseed

    have = 0
    while not channels.stop.value and parent_alive():
        if block.shared.version.value == have:
            try:
                channels.commands.get(timeout=POLL_S)  # a wake-up (the version is what counts: it is read again first)
            except queue.Empty:
                pass
            continue
        with torch.inference_mode(False), torch.no_grad():
            read = block.read_into(tensors, keep_waiting=parent_alive)
        if read is None:
            return  # the trainer died holding the lock
        have, (_, _, _, index) = read
        evaluator.num_evaluations = int(index)
        torch.manual_seed(reseed(seed, int(index)))  # epsilon-greedy draws: reproducible per evaluation
        start = time.monotonic()
        result = evaluator.evaluate(algorithm)
        channels.results.put((have, result, time.monotonic() - start))


def _portable(err: BaseException) -> BaseException:
    """``err`` if it survives pickling (the trainer re-raises a start-up failure as it is), else an exception of its
    nearest built-in base class with the same message (e.g. gin's dynamically made subclasses)."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:  # noqa: BLE001  (any pickling failure: fall back below)
        pass
    for cls in type(err).__mro__:
        if cls.__module__ == "builtins" and issubclass(cls, Exception):
            try:
                return cls(str(err))
            except Exception:  # noqa: BLE001  (a base that takes other arguments: try the next one)
                continue
    return RuntimeError(str(err))


def _wait_for_block(channels: ChildChannels, parent_alive: Callable[[], bool]) -> Optional[str]:
    """The parameter block's name, sent with the first evaluation (None when told to stop, or orphaned, first)."""
    while not channels.stop.value and parent_alive():
        try:
            kind, name = channels.commands.get(timeout=POLL_S)
            if kind == "block":
                return name
        except queue.Empty:
            continue
    return None
