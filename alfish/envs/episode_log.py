"""Putting an env back where it was without pickling it (exact resume, DESIGN.md §3.12): each episode has a seed of
its own, and the current episode's actions are kept, so the env can be re-created, reset with that seed and stepped
through the same actions.

Episode seeds: a reset with a seed ``s`` (alfish's reset of the batch: env ``i`` gets ``seed + i``) starts episode 0
with ``s``; every later reset without a seed (gymnasium's autoreset) starts episode ``e`` with
``episode_seed(s, e)``, derived from ``(s, e)`` by numpy's ``SeedSequence``. (Before exact resume, autoresets drew
from the env's RNG as the previous episode left it; the starting states of episodes after the first are different
draws now, equally distributed.)

``resume_state()`` (read through the vector env's ``call``, in its workers too) returns the base seed, the episode,
the episode's actions so far, its last observation and whether it has just ended. ``reset(seed=i,
options={RESTORE: states})`` puts env ``i`` back: reset with the episode's seed, the actions replayed, the last
observation compared with the stored one (``restored_exactly()`` says whether it matched: a nondeterministic env does
not). An env restored right after its episode ended resets itself at its next ``step`` (ignoring the action), as the
vector env's next-step autoreset would have.
"""
from __future__ import annotations

from typing import Any, Optional

import gymnasium as gym
import numpy as np

#: The reset option that carries the states to restore, ``{env index: resume_state()}``.
RESTORE = "alfish_restore"
#: An episode longer than this many steps stops being logged (bounded memory for envs without a time limit): it
#: cannot be restored exactly, and a resume in its middle says so.
MAX_LOGGED_ACTIONS = 200_000


def episode_seed(base_seed: int, episode: int) -> int:
    """The seed of episode ``episode`` of an env first reset with ``base_seed`` (episode 0: ``base_seed`` itself)."""
    if episode == 0:
        return int(base_seed)
    return int(np.random.SeedSequence([int(base_seed) % 2**63, episode]).generate_state(1, np.uint32)[0])


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return np.array_equal(np.asarray(a), np.asarray(b))


class EpisodeLog(gym.Wrapper):
    """Seeds each episode and logs its actions (module docstring)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.base_seed: Optional[int] = None
        self.episode = 0
        self.actions: list[np.ndarray] = []
        self.last_observation: Any = None
        self.ended = False
        self.pending_reset = False
        self.matched = True

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[Any, dict]:
        if options and RESTORE in options:
            return self._restore(options[RESTORE][seed])
        if seed is not None:
            self.base_seed, self.episode = int(seed), 0
        elif self.base_seed is not None:  # an autoreset: the next episode's own seed
            self.episode += 1
            seed = episode_seed(self.base_seed, self.episode)
        observation, info = self.env.reset(seed=seed, options=options)
        self.actions, self.last_observation, self.ended, self.pending_reset = [], observation, False, False
        return observation, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        if self.pending_reset:  # restored just after its episode ended: the autoreset the vector env would have done
            observation, info = self.reset()
            return observation, 0.0, False, False, info
        observation, reward, terminated, truncated, info = self.env.step(action)
        if len(self.actions) < MAX_LOGGED_ACTIONS:
            self.actions.append(np.array(action, copy=True))
        else:
            self.base_seed = None  # too long to replay: this episode is not restorable
        self.last_observation, self.ended = observation, bool(terminated or truncated)
        return observation, reward, terminated, truncated, info

    def resume_state(self) -> dict:
        """What ``reset(options={RESTORE: ...})`` needs to put this env back (numpy arrays and ints)."""
        actions = np.stack(self.actions) if self.actions else np.zeros((0,) + np.shape(self.env.action_space.sample()))
        return dict(base_seed=self.base_seed, episode=self.episode, actions=actions,
                    last_observation=self.last_observation, ended=self.ended)

    def restored_exactly(self) -> bool:
        """Whether the last restore reproduced the stored last observation."""
        return self.matched

    def _restore(self, state: dict) -> tuple[Any, dict]:
        self.base_seed, self.episode = state["base_seed"], int(state["episode"])
        seed = None if self.base_seed is None else episode_seed(self.base_seed, self.episode)
        observation, info = self.env.reset(seed=seed)
        actions = list(np.asarray(state["actions"]))
        for action in actions:
            observation, _, _, _, info = self.env.step(action)
        self.actions, self.last_observation = actions, observation
        self.ended = self.pending_reset = bool(state["ended"])
        self.matched = self.base_seed is not None and _same(observation, state["last_observation"])
        return observation, info
