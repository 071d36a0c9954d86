"""The async unroll child process: builds the training envs, reports their EnvSpec, waits for the trainer's 'start',
then runs the same ``Unroller`` as the synchronous collector, one env step at a time, into a bounded queue.

Everything here runs in the child (started with ``spawn``); ``child_main`` is its entry point.
"""
from __future__ import annotations

import dataclasses
import os
import queue
import signal
import time
import traceback
from typing import Any, Callable, Optional

import torch

from alfish.collect.child_process import finish_child
from alfish.collect.shared_params import POLL_S, ParamBlock, SharedParams, rollout_state
from alfish.data import nest
from alfish.envs.batched_env import EnvSettings


@dataclasses.dataclass
class UnrollSpec:
    """Everything the child needs, picklable: how to build the envs, the gin config text (parsed there, for the policy)
    and the pacing."""

    env_settings: EnvSettings
    config_text: str
    root_dir: str
    step_interval_s: float
    parent_pid: int


def child_main(spec: UnrollSpec, shared: SharedParams, steps: Any, errors: Any, replies: Any, commands: Any,
               stop: Any) -> None:
    """Build the envs and report them; on 'start' build the policy and step until told to stop or the parent is
    gone. Every exception goes to the trainer with its traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it then stops us
    env = block = None
    try:
        torch.set_num_threads(1)
        config = _parse_config(spec)
        from alfish.envs.spec import EnvSpec

        env = spec.env_settings.create()
        env_spec = EnvSpec.of(env)
        replies.put(env_spec)
        parent_alive = _parent_watch(spec.parent_pid)
        command = _wait_for_start(commands, stop, parent_alive)
        if command is not None:
            _, block_name, seed = command
            block = _run(config, env, env_spec, shared, block_name, seed, spec.step_interval_s, steps, stop,
                         parent_alive)
    except BaseException:  # noqa: BLE001  (everything, including KeyboardInterrupt, goes to the parent)
        errors.put(traceback.format_exc())
        exit_code = 1
    else:
        exit_code = 0
    finish_child((env, block), steps, errors, exit_code)


def _run(config: Any, env: Any, env_spec: Any, shared: SharedParams, block_name: str, seed: Optional[int],
         step_interval_s: float, steps: Any, stop: Any, parent_alive: Callable[[], bool]) -> ParamBlock:
    from alfish.algorithms.build import build_policy
    from alfish.collect.unroller import Unroller
    from alfish.seeding import CHILD_SEED_OFFSET, seed_everything

    seed_everything((seed if seed is not None else 0) + CHILD_SEED_OFFSET)  # action sampling: its own stream
    from alfish.learn.device import DevicePolicy

    device = DevicePolicy().acting_device()  # the CPU unless DevicePolicy.rollout_device says otherwise
    transformer, algorithm = build_policy(config, env_spec)
    algorithm.to(device), transformer.to(device)
    tensors = rollout_state(algorithm, transformer)
    block = ParamBlock(shared, tensors, name=block_name)
    version = _load_parameters(block, tensors, 0, parent_alive)
    unroller = Unroller(env, algorithm, transform=transformer.rollout_view(update_stats=False), seed=seed,
                        device=device)
    next_tick = time.monotonic()
    with torch.inference_mode():
        while not stop.value and parent_alive():
            version = _load_parameters(block, tensors, version, parent_alive)
            if step_interval_s > 0:
                next_tick = _pace(next_tick, step_interval_s)
            exp = unroller.step()
            item = (nest.map_nest(lambda x: x.numpy(), exp), version, unroller.last_env_step_s)
            if not _put(steps, item, stop, parent_alive):
                break
    return block


def _parse_config(spec: UnrollSpec) -> Any:
    import gin

    from alfish.config.registration import register_configurables
    from alfish.config.trainer_config import TrainerConfig

    register_configurables()
    gin.parse_config(spec.config_text)
    return TrainerConfig(root_dir=spec.root_dir)


def _wait_for_start(commands: Any, stop: Any, parent_alive: Callable[[], bool]) -> Optional[tuple]:
    """The trainer's ('start', block name, seed), or None when told to stop (or orphaned) first."""
    while not stop.value and parent_alive():
        try:
            return commands.get(timeout=POLL_S)
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


def _parent_watch(parent_pid: int) -> Callable[[], bool]:
    """A cheap check that the trainer still exists (a SIGKILLed parent cannot stop us)."""
    return lambda: os.getppid() == parent_pid


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
