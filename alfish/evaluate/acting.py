"""The one way a trained policy acts outside training, and the one loop that plays whole episodes with it.

``GreedyPolicy`` is how evaluation (``Evaluator``), play and evaluation videos (``episodes.play_episodes``),
``alfish.bin.collect`` and the export check (``alfish.export.verify``) choose actions: the env's time step crosses to
the policy's device, goes through the data transformers' rollout view with their statistics frozen, and
``algorithm.predict_step`` picks the greedy action (or, with probability ``epsilon_greedy`` per env, the algorithm's
own exploratory one) from the recurrent state it carries, set back to ``initial_state`` at each env's FIRST step
(``EMPTY`` and untouched for a stateless policy); all under ``torch.inference_mode``.

``run_episodes`` steps a batched env with it until every env has finished its share of episodes. After a LAST step
the env autoresets: the FIRST step it returns belongs to no episode, so its reward is not counted.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Optional

import torch

from alfish.algorithms.base import Algorithm
from alfish.collect.unroller import to_device
from alfish.data.types import StepType, TimeStep
from alfish.learn.device import CPU


@dataclasses.dataclass(frozen=True)
class Acted:
    """One decision of a ``GreedyPolicy`` for a batch ``[B]`` of envs."""

    seen: TimeStep  # the time step as the algorithm saw it: on the policy's device, transformed
    action: torch.Tensor  # [B, ...] on the policy's device


class GreedyPolicy:
    """``algorithm`` acting greedily (or ``epsilon_greedy``) on time steps ``[B]``, carrying its recurrent state.

    transform: the data transformers' rollout view, statistics frozen (``transformer.rollout_view(update_stats=False)``,
        see ``frozen``); None: the time step as it is. The policy acts on the device of ``algorithm``'s parameters.
    """

    def __init__(self, algorithm: Algorithm, transform: Optional[Callable[[TimeStep], TimeStep]] = None,
                 epsilon_greedy: float = 0.0):
        self.algorithm = algorithm
        self.transform = transform or (lambda time_step: time_step)
        self.epsilon_greedy = epsilon_greedy
        self.device = next(iter(algorithm.parameters())).device
        #: The state the next ``act`` starts from; None: ``initial_state`` of the next time step's batch. Set it to
        #: act from a given state (the export check's sampled states).
        self.state: Any = None

    @classmethod
    def frozen(cls, transformer: Any, algorithm: Algorithm, epsilon_greedy: float = 0.0) -> GreedyPolicy:
        """Acting through a new stream of ``transformer``'s rollout view, statistics frozen."""
        return cls(algorithm, transformer.rollout_view(update_stats=False), epsilon_greedy)

    def reset(self) -> None:
        """Start over: the next ``act`` starts from ``initial_state``."""
        self.state = None

    @torch.inference_mode()
    def act(self, time_step: TimeStep) -> Acted:
        """The action for ``time_step`` (``[B]``, on any device); advances ``state``."""
        seen = self.transform(to_device(time_step, self.device))  # once per step each way, batched over the envs
        if self.state is None:
            self.state = self.algorithm.initial_state(seen.step_type.shape[0], self.device)
        alg_step = self.algorithm.predict_step(seen, self.algorithm.reset_state(self.state, seen.step_type),
                                               epsilon_greedy=self.epsilon_greedy)
        self.state = alg_step.state
        return Acted(seen, alg_step.output)

    def __call__(self, time_step: TimeStep) -> torch.Tensor:
        """The action for ``time_step`` on the host, as the env takes it."""
        return to_device(self.act(time_step).action, CPU)


class EpisodeWatcher:
    """What a caller of ``run_episodes`` sees of the episodes besides their returns; each method does nothing here.

    A step of env ``i`` is *counted* when that env still owes episodes and the step belongs to an episode (it is not
    the autoreset FIRST step after a LAST).
    """

    def acted(self, acted: Acted, counted: torch.Tensor) -> None:
        """Before the env steps: the policy's decision; ``counted`` (bool ``[B]``, host) marks the envs whose
        transition from here is counted (still owing episodes, not at a LAST step)."""

    def stepped(self, time_step: TimeStep, counted: torch.Tensor) -> None:
        """After the env stepped: what it returned; ``counted`` (bool ``[B]``) marks the counted steps."""

    def episode_ended(self, index: int, episode_return: float, length: int) -> None:
        """An episode ended: the ``index``-th (from 1, in the order they end), its return and length (steps)."""


@dataclasses.dataclass(frozen=True)
class Episodes:
    """What ``run_episodes`` played: returns and lengths in the order the episodes ended (envs in index order within a
    step); ``finished``: False when ``max_steps`` ran out first."""

    returns: list[float]
    lengths: list[int]
    finished: bool


@torch.inference_mode()
def run_episodes(env: Any, policy: GreedyPolicy, time_step: TimeStep, episodes_per_env: int,
                 max_steps: Optional[int] = None, watcher: Optional[EpisodeWatcher] = None) -> Episodes:
    """Steps ``env`` (``B`` envs) with ``policy`` from ``time_step`` (just after a reset), from its initial state,
    until each env has finished its first ``episodes_per_env`` episodes (unbiased towards short episodes: a fast env
    does not contribute more), or ``max_steps`` steps were taken (None: no limit). Returns are summed in float64."""
    watcher = watcher or EpisodeWatcher()
    n = env.num_envs
    done = torch.zeros(n, dtype=torch.int64)
    ret = torch.zeros(n, dtype=torch.float64)
    length = torch.zeros(n, dtype=torch.int64)
    returns: list[float] = []
    lengths: list[int] = []
    policy.reset()
    for _ in range(max_steps) if max_steps is not None else itertools.count():
        if bool((done >= episodes_per_env).all()):
            break
        acted = policy.act(time_step)
        watcher.acted(acted, (done < episodes_per_env) & (time_step.step_type != StepType.LAST))
        time_step = env.step(to_device(acted.action, CPU))
        counted = (done < episodes_per_env) & (time_step.step_type != StepType.FIRST)
        watcher.stepped(time_step, counted)
        ret += torch.where(counted, time_step.reward.double(), 0.0)
        length += counted.long()
        finished = counted & (time_step.step_type == StepType.LAST)
        if bool(finished.any()):
            for episode_return, episode_length in zip(ret[finished].tolist(), length[finished].tolist()):
                returns.append(episode_return)
                lengths.append(episode_length)
                watcher.episode_ended(len(returns), episode_return, episode_length)
            ret[finished], length[finished] = 0.0, 0
            done += finished.long()
    else:
        return Episodes(returns, lengths, finished=False)
    return Episodes(returns, lengths, finished=True)
