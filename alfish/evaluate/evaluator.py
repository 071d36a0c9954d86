"""Evaluation of the greedy (or epsilon-greedy) policy on separate environments, and how a result is recorded.

``Evaluator`` runs the episodes in this process (``TrainerConfig.async_eval=False``); ``AsyncEvaluator``
(``alfish.evaluate.async_evaluator``) runs the same ``Evaluator`` in a child process on a copy of the parameters. The
Trainer sees either through the same three calls (``EvaluatorPart``): ``record`` when an evaluation is due, ``wait``
at the end of a run, ``close``. Both record a result the same way (``write_evaluation``): TensorBoard ``eval/...`` at
the evaluated iteration, ``eval_vs_env_steps/average_return`` at its env steps, one line of ``eval_log.jsonl``.

With ``TrainerConfig.eval_uncertainty`` a result also has the spread of the episode returns (``return_std``,
``return_min``, ``return_max``; the std over episodes, ``ddof=0``) and, for an algorithm with an ensemble of critics
``algorithm.critics`` (``(obs, action) -> [E, N, 1]``: SAC, TD3/DDPG, IQL), the critics' estimates of the evaluation's
own state-action pairs: ``critic_mean`` (mean over the counted steps of the ensemble mean) and, with ``E >= 2``
members, ``critic_std`` (mean over the counted steps of the std across members, ``ddof=0``). Algorithms without such
an ensemble (PPO, A2C, DQN, BC) record the return spread only.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Callable, NamedTuple, Optional, Protocol

import torch
from torch import nn

from alfish.algorithms.base import Algorithm
from alfish.data import nest
from alfish.data.types import TimeStep
from alfish.envs.batched_env import BatchedEnv
from alfish.evaluate.acting import Acted, EpisodeWatcher, GreedyPolicy, run_episodes
from alfish.learn.device import CPU
from alfish.rundir import eval_log
from alfish.rundir.eval_log import recorded_iterations  # noqa: F401  (re-exported: the trainer reads it from here)
from alfish.seeding import reseed

#: The ``eval_uncertainty`` fields of a result, in the order they are recorded.
UNCERTAINTY_FIELDS = ("return_std", "return_min", "return_max", "critic_mean", "critic_std")


class EvalResult(NamedTuple):
    average_return: float
    average_length: float
    num_episodes: int
    # eval_uncertainty only (None otherwise, and critic_* None for an algorithm without a critic ensemble):
    return_std: Optional[float] = None
    return_min: Optional[float] = None
    return_max: Optional[float] = None
    critic_mean: Optional[float] = None
    critic_std: Optional[float] = None

    def uncertainty(self) -> dict[str, float]:
        """The ``eval_uncertainty`` fields that have a value."""
        return {name: getattr(self, name) for name in UNCERTAINTY_FIELDS if getattr(self, name) is not None}


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One recorded evaluation, as the trainer's callbacks get it (``alfish.trainer.callbacks``).

    iteration, env_steps: the counters of the evaluated parameters. snapshot: those parameters, ``{"algorithm": state
    dict, "transformers": state dict}`` (CPU copies), when they are no longer the trainer's current ones (asynchronous
    evaluation with ``keep_snapshots``); ``None``: the trainer's current parameters.
    """

    iteration: int
    env_steps: int
    result: EvalResult
    snapshot: Optional[dict[str, Any]] = None


class EvaluatorPart(Protocol):
    """What the Trainer calls on its evaluator, synchronous or not (DESIGN.md §3.11)."""

    #: Evaluations so far: the k-th resets its envs with ``reseed(eval seed, k)``; set on resume to continue the
    #: sequence (``iteration // eval_interval``).
    num_evaluations: int
    #: Keep a copy of the evaluated parameters with each asynchronous result (``Evaluation.snapshot``).
    keep_snapshots: bool

    def record(self, algorithm: Algorithm, summaries: Any, root_dir: str, counters: Any) -> None:
        """Evaluate the current parameters and record the result against ``counters``' iteration and env steps."""

    def check(self) -> None:
        """Raise what went wrong since the last call, without waiting (called every iteration, so a failed
        asynchronous evaluator stops the run at once, not at the next due evaluation)."""

    def completed(self) -> list[Evaluation]:
        """The evaluations recorded since the last call, oldest first (for the trainer's callbacks)."""

    def stop_recording(self) -> None:
        """Record no more results: the run stops, and its last checkpoint keeps what is pending."""

    def pending(self) -> list[dict]:
        """Evaluations asked for and not yet recorded, for a checkpoint (see ``AsyncEvaluator.pending``)."""

    def resubmit(self, pending: list[dict], summaries: Any, root_dir: str) -> None:
        """Evaluate again the evaluations a stop interrupted (``pending`` from the checkpoint)."""

    def wait(self) -> None:
        """Return once every evaluation asked for is recorded (raises what went wrong on the way)."""

    def close(self) -> None:
        """Release the eval envs (and processes); never raises."""


class Evaluator:
    """Runs ``num_episodes`` on ``env`` (``B`` envs).

    Counting is unbiased towards short episodes: each env contributes exactly its first ``ceil(num_episodes / B)``
    episodes, so the result averages ``B * ceil(num_episodes / B)`` episodes. Each evaluation resets the envs with a
    new seed (``reseed(seed, k)`` for the k-th evaluation): reproducible, but not always the same start states.
    ``uncertainty``: also measure the spread of returns and of the critic ensemble's estimates (module docstring).
    """

    def __init__(self, env: BatchedEnv, num_episodes: int, epsilon_greedy: float, seed: int = 0,
                 max_steps: int = 1_000_000, transform: Optional[Callable[[TimeStep], TimeStep]] = None,
                 uncertainty: bool = False):
        self.env = env
        self.transform = transform or (lambda time_step: time_step)  # data transformers, statistics frozen
        self.seed = seed
        self.num_evaluations = 0
        self.keep_snapshots = False  # (the current parameters are the evaluated ones when callbacks see a result)
        self._completed: list[Evaluation] = []
        self.per_env = math.ceil(num_episodes / env.num_envs)
        self.epsilon_greedy = epsilon_greedy
        self.max_steps = max_steps
        self.uncertainty = uncertainty

    @torch.inference_mode()
    def evaluate(self, algorithm: Algorithm) -> EvalResult:
        was_training = algorithm.training
        algorithm.eval()
        critics = CriticSpread(algorithm) if self.uncertainty and has_critic_ensemble(algorithm) else None
        time_step = self.env.reset(seed=reseed(self.seed, self.num_evaluations))
        self.num_evaluations += 1
        policy = GreedyPolicy(algorithm, self.transform, self.epsilon_greedy)  # (on the device the algorithm trains on)
        episodes = run_episodes(self.env, policy, time_step, self.per_env, max_steps=self.max_steps, watcher=critics)
        if not episodes.finished:
            raise RuntimeError(f"evaluation did not finish {self.per_env} episodes per env within {self.max_steps} "
                               "steps; does the env ever end an episode (add a TimeLimit)?")
        algorithm.train(was_training)
        returns, lengths = episodes.returns, episodes.lengths
        average = sum(returns) / len(returns)
        result = EvalResult(average, sum(lengths) / len(lengths), len(returns))
        if self.uncertainty:
            spread = math.sqrt(sum((r - average) ** 2 for r in returns) / len(returns))
            result = nest.replace_fields(result, return_std=spread, return_min=min(returns), return_max=max(returns),
                                     **(critics.result() if critics is not None else {}))
        return result

    # --- the Trainer's part (EvaluatorPart): evaluate now, record at once ---------------------------------------------
    def record(self, algorithm: Algorithm, summaries: Any, root_dir: str, counters: Any) -> None:
        """Evaluate in this process (training waits), then ``write_evaluation``. ``counters``: the trainer's
        (``iteration``, ``env_steps``, ``elapsed_s()``)."""
        start = time.monotonic()
        result = self.evaluate(algorithm)
        write_evaluation(result, summaries, root_dir,
                         RecordedAt(counters.iteration, counters.env_steps, counters.elapsed_s()),
                         time.monotonic() - start)
        self._completed.append(Evaluation(counters.iteration, counters.env_steps, result))

    def completed(self) -> list[Evaluation]:
        done, self._completed = self._completed, []
        return done

    def stop_recording(self) -> None:
        """Nothing is ever in flight here."""

    def pending(self) -> list[dict]:
        return []  # (each evaluation is recorded before record returns)

    def resubmit(self, pending: list[dict], summaries: Any, root_dir: str) -> None:
        if pending:  # (this evaluates the live algorithm only)
            logging.warning("the checkpoint holds %d asynchronous evaluation(s) that the stop interrupted (iteration "
                            "%s); this run evaluates synchronously (TrainerConfig.async_eval=False), so they are not "
                            "re-run", len(pending), ", ".join(str(p["iteration"]) for p in pending))

    def check(self) -> None:
        """Nothing runs in the background here."""

    def wait(self) -> None:
        """Nothing is ever in flight here."""

    def close(self) -> None:
        self.env.close()


def has_critic_ensemble(algorithm: nn.Module) -> bool:
    """True for a continuous-action algorithm with ``critics``, an ensemble ``(obs, action) -> [E, N, 1]`` (not one
    that reads an encoder's features, ``critics_read_observations`` False: SAC with a shared encoder; nor mixed-action
    SAC's, ``[E, N, n]``)."""
    return (isinstance(getattr(algorithm, "critics", None), nn.Module) and not getattr(algorithm, "discrete", True)
            and getattr(algorithm, "critics_read_observations", True)
            and getattr(algorithm, "action_kind", "box") == "box")


class CriticSpread(EpisodeWatcher):
    """Accumulates the critic ensemble's estimates ``Q_e(s, a)`` of evaluation steps: their ensemble mean and std
    (``ddof=0``), each summed over the counted steps (float64, on the host)."""

    def __init__(self, algorithm: Any):
        self.algorithm = algorithm
        self.mean_sum = self.std_sum = 0.0
        self.count = 0
        self.members = 0

    def acted(self, acted: Acted, counted: torch.Tensor) -> None:
        """The pairs whose transition is counted: envs still counting, not at LAST (``EpisodeWatcher``)."""
        self.observe(acted.seen.observation, acted.action, counted)

    def observe(self, observation: Any, action: torch.Tensor, counted: torch.Tensor) -> None:
        alg = self.algorithm
        q = alg.critics(alg.network_input(observation), alg.unscale_action(action.float()))
        if q.dim() != 3 or q.shape[-1] != 1 or q.shape[1] != counted.shape[0]:
            raise ValueError(f"{type(alg).__name__}.critics returned shape {list(q.shape)}; eval_uncertainty expects "
                             f"[ensemble, {counted.shape[0]}, 1]")
        q = q.squeeze(-1).to(CPU, torch.float64)  # [E, B]
        self.members = q.shape[0]
        self.mean_sum += float(q.mean(0)[counted].sum())
        self.std_sum += float(q.std(0, correction=0)[counted].sum())
        self.count += int(counted.sum())

    def result(self) -> dict[str, float]:
        if self.count == 0:
            return {}
        out = dict(critic_mean=self.mean_sum / self.count)
        if self.members >= 2:
            out["critic_std"] = self.std_sum / self.count
        return out


@dataclasses.dataclass(frozen=True)
class RecordedAt:
    """What a result is recorded against: the evaluated parameters' iteration and env steps, and the run's wall-clock
    seconds (``elapsed_s``) when they were evaluated (asynchronous: when they were sent)."""

    iteration: int
    env_steps: int
    elapsed_s: float


def write_evaluation(result: EvalResult, summaries: Any, root_dir: str, at: RecordedAt, eval_s: float,
                     asynchronous: bool = False) -> None:
    """Write ``result`` to TensorBoard (``eval/`` at ``at.iteration``, ``eval_vs_env_steps/average_return`` at
    ``at.env_steps``), one line to ``root_dir/eval_log.jsonl`` (``alfish.rundir.eval_log``) and the log. ``eval_s``:
    the seconds the evaluation took. ``asynchronous``: the result comes from the async evaluator (the record says so,
    ``"asynchronous": true``)."""
    iteration, env_steps, elapsed_s = at.iteration, at.env_steps, at.elapsed_s
    uncertainty = result.uncertainty()
    summaries.scalars("eval", dict(average_return=result.average_return,
                                   average_episode_length=result.average_length, num_episodes=result.num_episodes,
                                   **uncertainty), iteration)
    summaries.scalar("eval_vs_env_steps/average_return", result.average_return, env_steps)
    record = dict(iteration=iteration, env_steps=env_steps, elapsed_s=round(elapsed_s, 3), eval_s=round(eval_s, 3),
                  average_return=result.average_return, average_episode_length=result.average_length,
                  num_episodes=result.num_episodes, **uncertainty)
    if asynchronous:
        record["asynchronous"] = True
    eval_log.append_record(root_dir, record)
    spread = "".join(f", {name.replace('_', ' ')} {value:.3g}" for name, value in uncertainty.items())
    logging.info("eval at iteration %d (env steps %d): return %.2f, length %.1f over %d episodes%s (%.1fs%s)",
                 iteration, env_steps, result.average_return, result.average_length, result.num_episodes, spread,
                 eval_s, ", asynchronous" if asynchronous else "")


def policy_snapshot(algorithm: nn.Module, transformer: nn.Module) -> dict[str, Any]:
    """CPU copies of the policy's parameters and the transformers' statistics, as a checkpoint stores them
    (``{"algorithm": state dict, "transformers": state dict}``)."""
    return {"algorithm": {k: v.detach().to("cpu", copy=True) for k, v in algorithm.state_dict().items()},
            "transformers": {k: v.detach().to("cpu", copy=True) for k, v in transformer.state_dict().items()}}
