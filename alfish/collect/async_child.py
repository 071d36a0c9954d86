"""The async unroll child process: builds the training envs, reports their EnvSpec, waits for the trainer's 'start',
then runs the same ``Unroller`` as the synchronous collector, one env step at a time, into a bounded queue.

Everything here runs in the child (started with ``spawn``); ``child_main`` is its entry point.
"""
from __future__ import annotations

import dataclasses
import queue
import time
import traceback
from typing import Any, Callable, Optional

import torch

from alfish.collect.child_process import (
    ChildChannels,
    build_acting_policy,
    finish_child,
    flush_queue,
    gin_constants,
    resolved_acting_device,
    start_child,
)
from alfish.collect.shared_params import POLL_S, ParamBlock, SharedParams, rollout_state
from alfish.data import nest
from alfish.envs.batched_env import EnvSettings

#: How long a failing child waits for its queued steps to reach the pipe (the trainer reads it meanwhile; a trainer
#: that does not is itself stuck, and the steps are then given up).
RESULTS_FLUSH_TIMEOUT_S = 5.0


@dataclasses.dataclass
class UnrollSpec:
    """Everything the child needs, picklable: how to build the envs, the gin config text (parsed there, for the policy)
    and the pacing. gin_constants: the ``gin.constant`` values the text may name (default: those registered in this
    process when the spec is made). acting_device: where the child's policy acts, ``DevicePolicy.rollout_device``
    resolved in the trainer when the spec is made (under torchrun with its ``LOCAL_RANK``: the child has none).
    process_index: which of the rank's unroll processes this is (``unroll_processes.py``), and generation: how many
    children stepped its envs before it (a replacement after a crash is the next); each item it sends says both."""

    env_settings: EnvSettings
    config_text: str
    root_dir: str
    step_interval_s: float
    parent_pid: int
    gin_constants: dict[str, Any] = dataclasses.field(default_factory=gin_constants)
    acting_device: torch.device = dataclasses.field(default_factory=resolved_acting_device)
    process_index: int = 0
    generation: int = 0


@dataclasses.dataclass
class _Acting:
    """The child's policy at work: the unroller stepping the envs with it, the parameter block it reads and the
    tensors it reads into, and the parameter version it holds."""

    unroller: Any
    block: ParamBlock
    tensors: dict[str, torch.Tensor]
    version: int


def child_main(spec: UnrollSpec, shared: SharedParams, channels: ChildChannels) -> None:
    """Build the envs and report them; on 'start' build the policy and step until told to stop or the parent is
    gone. Every exception goes to the trainer with its traceback."""
    env = acting = None
    try:
        config, parent_alive = start_child(spec)
        from alfish.envs.spec import EnvSpec

        env = spec.env_settings.create()
        env_spec = EnvSpec.of(env)
        channels.replies.put(env_spec)
        command = _wait_for_start(channels, parent_alive)
        if command is not None:
            _, block_name, seed = command
            acting = _start_acting(spec, config, env, env_spec, shared, (block_name, seed), parent_alive)
            _run(acting, spec, channels, parent_alive)
    except BaseException:  # noqa: BLE001  (everything, including KeyboardInterrupt, goes to the parent)
        # The steps put before the failure first (bounded): the parent reads them once it sees the report, which may
        # be before this process has exited, and keeps them only when they were all written (``flushed``).
        flushed = flush_queue(channels.results, RESULTS_FLUSH_TIMEOUT_S)
        channels.errors.put((traceback.format_exc(), flushed))
        exit_code = 1
    else:
        exit_code = 0
    finish_child((env, acting.block if acting is not None else None), channels.results, channels.errors, exit_code)


def _start_acting(spec: UnrollSpec, config: Any, env: Any, env_spec: Any, shared: SharedParams,
                  start: tuple[str, Optional[int]], parent_alive: Callable[[], bool]) -> _Acting:
    """Seed the child's own action-sampling stream, build the rollout policy on ``spec.acting_device``, load the
    published parameters, and reset the envs (the Unroller's construction, with the seed). ``start``: the trainer's
    (parameter block name, seed)."""
    from alfish.collect.unroller import Unroller
    from alfish.seeding import CHILD_SEED_OFFSET, seed_everything

    block_name, seed = start
    seed_everything((seed if seed is not None else 0) + CHILD_SEED_OFFSET)  # action sampling: its own stream
    device = spec.acting_device  # resolved by the trainer (the CPU unless DevicePolicy.rollout_device says otherwise)
    transformer, algorithm = build_acting_policy(config, env_spec, device)
    tensors = rollout_state(algorithm, transformer)
    block = ParamBlock(shared, tensors, name=block_name)
    version = _load_parameters(block, tensors, 0, parent_alive)
    unroller = Unroller(env, algorithm, transform=transformer.rollout_view(update_stats=False), seed=seed,
                        device=device)
    return _Acting(unroller, block, tensors, version)


def _run(acting: _Acting, spec: UnrollSpec, channels: ChildChannels, parent_alive: Callable[[], bool]) -> None:
    """Step the envs, one item per env step into ``channels.results``, loading each new parameter version first."""
    step_interval_s, index, generation = spec.step_interval_s, spec.process_index, spec.generation
    next_tick = time.monotonic()
    stop = channels.stop
    with torch.inference_mode():
        while not stop.value and parent_alive():
            acting.version = _load_parameters(acting.block, acting.tensors, acting.version, parent_alive)
            if step_interval_s > 0:
                next_tick = _pace(next_tick, step_interval_s)
            exp = acting.unroller.step()
            item = (nest.map_nest(lambda x: x.numpy(), exp), acting.version, acting.unroller.last_env_step_s, index,
                    generation)
            if not _put(channels.results, item, stop, parent_alive):
                break


def _wait_for_start(channels: ChildChannels, parent_alive: Callable[[], bool]) -> Optional[tuple]:
    """The trainer's ('start', block name, seed), or None when told to stop (or orphaned) first."""
    while not channels.stop.value and parent_alive():
        try:
            return channels.commands.get(timeout=POLL_S)
        except queue.Empty:
            continue
    return None


def _load_parameters(block: ParamBlock, tensors: dict[str, torch.Tensor], have: int,
                     parent_alive: Callable[[], bool]) -> int:
    """Load the published parameters if their version moved; also sets the schedules' progress. Gives up (keeping
    the old parameters) when the parent dies while holding the lock: the main loop then exits."""
    if block.shared.version.value == have:
        return have
    from alfish.schedulers import update_progress

    with torch.inference_mode(False), torch.no_grad():
        read = block.read_into(tensors, keep_waiting=parent_alive)
    if read is None:
        return have
    version, (iterations, env_steps, fraction) = read
    update_progress(iterations=int(iterations), env_steps=int(env_steps), fraction=fraction)
    return version


def _pace(next_tick: float, interval_s: float) -> float:
    """Sleep until ``next_tick``; returns the next one. Late steps do not cause a burst of catch-up steps."""
    now = time.monotonic()
    if next_tick > now:
        time.sleep(next_tick - now)
        now = next_tick
    return now + interval_s


def _put(steps: Any, item: Any, stop: Any, parent_alive: Callable[[], bool]) -> bool:
    """Put with a timeout, re-checking the stop flag and the parent; False when we should exit instead."""
    while not stop.value and parent_alive():
        try:
            steps.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False
