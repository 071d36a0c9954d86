"""Offline datasets the tests make themselves (nothing is downloaded): rollouts of known policies in alfish's toy envs,
as D4RL-style transition arrays."""
from __future__ import annotations

from typing import Callable

import gymnasium as gym
import numpy as np

import alfish.envs  # noqa: F401  (registers alfish/* envs)


def point_goal_expert(x: np.ndarray) -> np.ndarray:
    """PointGoal's optimal action: full speed towards 0, then exactly onto it (return -0.9)."""
    return np.clip(-x / 0.25, -1.0, 1.0)


def rollouts(env_id: str, policy: Callable[[np.ndarray, np.random.Generator], np.ndarray], episodes: int,
             seed: int = 0) -> dict[str, np.ndarray]:
    """``episodes`` episodes of ``policy(obs, rng)`` in ``env_id`` as D4RL arrays (with next_observations)."""
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {k: [] for k in ("observations", "actions", "rewards", "terminals", "timeouts",
                                             "next_observations")}
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            action = policy(obs, rng)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            for key, value in zip(rows, (obs, action, reward, terminated, truncated, next_obs)):
                rows[key].append(value)
            obs, done = next_obs, terminated or truncated
    env.close()
    out = {k: np.asarray(v) for k, v in rows.items()}
    out["rewards"] = out["rewards"].astype(np.float32)
    out["observations"] = out["observations"].astype(np.float32)
    out["next_observations"] = out["next_observations"].astype(np.float32)
    if out["actions"].dtype.kind == "f":
        out["actions"] = out["actions"].astype(np.float32)
    return out


def episode_returns(arrays: dict[str, np.ndarray]) -> np.ndarray:
    ends = np.flatnonzero(arrays["terminals"] | arrays["timeouts"])
    starts = np.concatenate([[0], ends[:-1] + 1])
    return np.array([arrays["rewards"][s:e + 1].sum() for s, e in zip(starts, ends)])
