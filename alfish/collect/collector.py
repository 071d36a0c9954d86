"""Collectors: where training experience comes from. One interface, two implementations (synchronous here, the
async unroll child in ``async_collector.py``); the trainer's loop calls them the same way whatever the mode.

Life cycle::

    collector = SyncCollector(env)                    # owns the training envs; .spec describes them
    ...build the algorithm and transformers from collector.spec...
    collector.start(policy, sink, seed)               # sink (the replay buffer) receives every raw step
    n = collector.collect(steps_per_env)              # steps per env collected (the async one may take what arrived)
    collector.publish_parameters(iteration, progress)  # fresh rollout parameters where another process acts
    collector.close()
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Optional, Protocol

import torch

from alfish.algorithms.base import Algorithm
from alfish.collect.episode_stats import EpisodeStats
from alfish.collect.restarts import RestartBudget
from alfish.collect.unroller import Unroller, to_device
from alfish.data import nest
from alfish.data.types import Experience
from alfish.envs.batched_env import BatchedEnv
from alfish.envs.spec import EnvSpec
from alfish.envs.workers import EnvWorkerError
from alfish.learn.device import CPU
from alfish.replay.replay_buffer import online_replay_of
from alfish.seeding import reseed
from alfish.transforms.base import DataTransformer


class Sink(Protocol):
    """Where collected raw steps go (the trainer's replay buffer)."""

    def add(self, exp: Experience) -> None:
        """One step of every env: leaves ``[B, ...]``."""

    def add_steps(self, exp: Experience) -> None:
        """``T`` steps of every env at once: leaves ``[B, T, ...]`` (batch-major), ``env_id`` ``[B, T]``."""


#: Steps per env a ``SyncCollector`` holds before writing them to its sink in one ``add_steps``: one write per
#: chunk instead of one per step (measured: ``tools/bench/profile_step.py``, the "buffer add" phase), while the
#: steps held stay a small multiple of one step's size.
WRITE_CHUNK_STEPS = 64


@dataclasses.dataclass(frozen=True)
class ProgressPoint:
    """Where the run is, for the schedules of a policy acting in another process."""

    iterations: int
    env_steps: int
    fraction: float  # of the run, in [0, 1]


class Collector:
    """Where experience comes from. ``spec`` describes the envs; ``stats`` tracks their episodes."""

    spec: EnvSpec
    stats: EpisodeStats
    #: Set by ``start``: the envs' episodes in flight were put back as they were (exact resume).
    resumed_exactly: bool = False

    def start(self, algorithm: Algorithm, transformer: DataTransformer, sink: Optional[Sink],
              seed: Optional[int], progress: ProgressPoint,
              before_publish: Callable[[], None] = lambda: None, resume: Optional[dict] = None) -> None:
        """Begin acting with ``algorithm``'s rollout policy; envs reset with ``seed`` (``None``: their own), or, with
        ``resume`` (a ``state_dict`` from a checkpoint), put back where they were. ``before_publish`` runs before
        parameters are copied to another process (the learner's non-finite check, so no NaN policy is shipped)."""
        raise NotImplementedError

    def state_dict(self) -> Optional[dict]:
        """What ``start(resume=...)`` needs to continue the envs' episodes exactly; None where that cannot be done
        (an async unroll: what was in flight in the child is timing-dependent)."""
        return None

    def collect(self, steps_per_env: int) -> float:
        """Hand ``steps_per_env`` steps of every env to the sink; returns the steps per env collected (env steps over
        the number of envs: a fraction where envs delivered unequal counts, as several async unroll processes may)."""
        raise NotImplementedError

    def warm_up(self, steps_per_env: int) -> float:
        """Collect before training starts (the initial collect steps); default: ``collect``."""
        return self.collect(steps_per_env)

    def collect_trajectory(self, steps_per_env: int, with_grad: bool = True) -> Experience:
        """On-policy: the transformed trajectory ``[steps_per_env + 1, B]`` with gradients (last row bootstraps), or
        without (``with_grad=False``: the algorithm recomputes its rollout infos)."""
        raise NotImplementedError(f"{type(self).__name__} cannot unroll with gradients in this process")

    def publish_parameters(self, iteration: int, progress: ProgressPoint) -> None:
        """Make the current rollout parameters the acting ones where they are copies (after each iteration)."""

    def summary(self) -> dict[str, float]:
        """Scalars for TensorBoard, by tag."""
        return {}

    def close(self) -> None:
        raise NotImplementedError


class SyncCollector(Collector):
    """Steps the envs in this process with the algorithm itself (no copy of the policy).

    random_warm_up_actions: the warm-up acts uniformly at random (TD3 paper, SB3's ``learning_starts``); the algorithm
    must store no rollout info (checked by ``check_random_actions_storable``).
    device: the training device, where the algorithm (and so its rollout policy) lives.
    restarts: with env worker processes (``vectorization='async'``), a budget of restarts
    (``Trainer.restart_crashed_envs``): a worker that dies, raises or hangs is replaced, with all the batch's workers
    (gymnasium's vector env restarts as a whole), instead of ending the run; every env's episode in flight is cut
    (the steps taken are stored, the newest of each env marked LAST as a time-limit truncation, and the episode not
    counted as finished), and an on-policy trajectory in progress is discarded and unrolled again. None: fail fast.
    """

    def __init__(self, env: BatchedEnv, random_warm_up_actions: bool = False, device: torch.device = CPU,
                 restarts: Optional[RestartBudget] = None):
        self.env, self.device = env, device
        self.spec = EnvSpec.of(env)
        self.stats = EpisodeStats(env.num_envs)
        self.random_warm_up_actions = random_warm_up_actions
        self.restarts = restarts
        self.unroller: Optional[Unroller] = None
        self._sink: Optional[Sink] = None
        self._seed: Optional[int] = None

    def start(self, algorithm: Algorithm, transformer: DataTransformer, sink: Optional[Sink],
              seed: Optional[int], progress: ProgressPoint,
              before_publish: Callable[[], None] = lambda: None, resume: Optional[dict] = None) -> None:
        self._sink, self._seed = sink, seed
        self._replay = online_replay_of(sink)
        self.publish_parameters(progress.iterations, progress)
        self.unroller = Unroller(self.env, algorithm, self.stats, transformer.rollout_view(update_stats=True), seed,
                                 self.device)
        self.resumed_exactly = False
        if resume is None:
            return
        matched = self.unroller.load_state_dict(resume)
        self.resumed_exactly = all(matched)
        if not all(matched):
            differ = [i for i, ok in enumerate(matched) if not ok]
            logging.warning("exact resume: env '%s' is not deterministic (or its episode was too long to log): "
                            "replaying the episode in flight of env(s) %s did not reproduce its last observation; "
                            "the episodes in flight restart instead, and the resumed run will differ from one that "
                            "never stopped", self.env.env_name, differ)
            self.unroller.reset(seed)

    def state_dict(self) -> Optional[dict]:
        return self.unroller.state_dict() if self.unroller is not None else None

    def collect(self, steps_per_env: int) -> int:
        self._unroll_to_sink(steps_per_env)
        return steps_per_env

    def warm_up(self, steps_per_env: int) -> int:
        self._unroll_to_sink(steps_per_env, random_actions=self.random_warm_up_actions)
        return steps_per_env

    def _unroll_to_sink(self, steps_per_env: int, random_actions: bool = False) -> None:
        """Unroll, handing the steps to the sink in chunks of ``WRITE_CHUNK_STEPS`` (``add_steps``). Nothing reads
        the sink during an unroll, and each step's tensors are its own (the env's arrays are copies: gymnasium's
        vector envs copy by default), so holding them until the chunk is written changes nothing stored."""
        pending: list[Experience] = []

        def write() -> None:
            if len(pending) == 1:  # (an unroll of one step, SAC's: no stacking)
                self._sink.add(pending[0])
            else:
                self._sink.add_steps(nest.stack(pending, dim=1))
            pending.clear()

        taken = 0

        def store(step: Experience) -> None:
            nonlocal taken
            taken += 1
            pending.append(step)
            if len(pending) == WRITE_CHUNK_STEPS:
                write()

        while taken < steps_per_env:
            try:
                self.unroller.unroll(steps_per_env - taken, store, random_actions=random_actions)
            except EnvWorkerError as failure:
                if pending:
                    write()
                self._restart(failure)
                self._sink.truncate_episodes()  # the stored episodes end where the workers failed
        if pending:
            write()

    def collect_trajectory(self, steps_per_env: int, with_grad: bool = True) -> Experience:
        while True:
            try:
                return self.unroller.unroll_on_policy(steps_per_env, with_grad)
            except EnvWorkerError as failure:
                self._restart(failure)  # (the trajectory so far is dropped: it never trains half)

    def _restart(self, failure: EnvWorkerError) -> None:
        """New env workers after ``failure`` (re-raised without a restart budget, or past it); the envs reset with
        the next reseed of their seed, not into the same failure."""
        if self.restarts is None:
            raise failure
        self.restarts.spend(failure, f"restarting the {self.env.num_envs} env workers of '{self.env.env_name}': "
                                     "every env's episode in flight is cut", error=EnvWorkerError)
        self.env.restart_workers()
        self.unroller.reset(reseed(self.env.seed if self._seed is None else self._seed, self.restarts.count))

    def publish_parameters(self, iteration: int, progress: ProgressPoint) -> None:
        """The algorithm itself acts: the steps of the next unroll are this iteration's (their stored policy
        iteration)."""
        if self._replay is not None:
            self._replay.set_current_iteration(iteration)
            self._replay.set_acting_iteration(iteration)

    def summary(self) -> dict[str, float]:
        return {} if self.restarts is None else {"collect/env_restarts": float(self.restarts.count)}

    def close(self) -> None:
        self.env.close()


def check_random_actions_storable(algorithm: Algorithm, transformer: DataTransformer, spec: EnvSpec) -> None:
    """Random warm-up actions come without rollout info; an algorithm that stores some (e.g. PPO's log-probs) cannot
    train on them. Raises a ValueError saying so."""
    device = next(iter(algorithm.parameters())).device
    with torch.inference_mode():
        seen = transformer.rollout_view(update_stats=False)(to_device(spec.zero_time_step(), device))
        info = algorithm.rollout_step(seen).info
    if nest.flatten(info):
        raise ValueError(f"Trainer.random_warm_up_actions=True: {type(algorithm).__name__} stores rollout info with "
                         "each step, which random actions do not have; set it to False")


def example_experience(algorithm: Algorithm, transformer: DataTransformer, spec: EnvSpec) -> Experience:
    """An Experience ``[B]`` with the structure the collectors store for ``algorithm`` (to restore a replay buffer
    without an env)."""
    time_step = spec.zero_time_step()
    device = next(iter(algorithm.parameters())).device
    with torch.inference_mode():
        alg_step = algorithm.rollout_step(transformer.rollout_view(update_stats=False)(to_device(time_step, device)))
    return Experience.from_time_step(time_step, *to_device((alg_step.output, alg_step.info), CPU))


