"""Bit flipping (Andrychowicz et al. 2017, HER paper §3.1): the goal-conditioned env where plain exploration fails.

Registered as ``alfish/BitFlipping-v0`` (``num_bits`` via ``create_environment.env_kwargs``).
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class BitFlipping(gym.Env):
    """State: ``num_bits`` bits; goal: another random bit string. Action ``i`` flips bit ``i``.

    Observation: ``{'observation': bits, 'achieved_goal': bits, 'desired_goal': goal}`` (float32 ``[num_bits]`` each).
    Reward -1 per step, 0 on the step that reaches the goal, which ends the episode (terminated); otherwise the
    episode is cut after ``num_bits`` steps. Start and goal always differ. The optimal policy flips each differing bit
    once: return ``-(d - 1)`` for Hamming distance ``d``; averaged over random starts (``E[d | d >= 1]``) the optimum is
    ``-(num_bits / 2 / (1 - 2**-num_bits) - 1)`` (-3.02 for 8 bits). A policy that never reaches a goal gets
    ``-num_bits``; random actions almost never reach one when ``num_bits`` is large.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, num_bits: int = 8, render_mode: str | None = None):
        if num_bits < 1:
            raise ValueError(f"BitFlipping num_bits={num_bits} must be >= 1")
        self.num_bits = num_bits
        bits = gym.spaces.Box(0.0, 1.0, shape=(num_bits,), dtype=np.float32)
        self.observation_space = gym.spaces.Dict(
            {"observation": bits, "achieved_goal": bits, "desired_goal": bits})
        self.action_space = gym.spaces.Discrete(num_bits)
        self.render_mode = render_mode
        self._state = np.zeros(num_bits, dtype=np.float32)
        self._goal = np.ones(num_bits, dtype=np.float32)

    @staticmethod
    def optimal_return(num_bits: int) -> float:
        return -(num_bits / 2.0 / (1.0 - 2.0 ** -num_bits) - 1.0)

    def _obs(self) -> dict:
        return {"observation": self._state.copy(), "achieved_goal": self._state.copy(),
                "desired_goal": self._goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self._state = self.np_random.integers(0, 2, self.num_bits).astype(np.float32)
        self._goal = self._state
        while np.array_equal(self._goal, self._state):
            self._goal = self.np_random.integers(0, 2, self.num_bits).astype(np.float32)
        return self._obs(), {}

    def step(self, action: Any):
        bit = int(np.asarray(action).reshape(-1)[0])
        self._state = self._state.copy()
        self._state[bit] = 1.0 - self._state[bit]
        reached = bool(np.array_equal(self._state, self._goal))
        return self._obs(), (0.0 if reached else -1.0), reached, False, {"is_success": reached}

    def render(self) -> np.ndarray:
        """Top row: the bits (black = 1); bottom row: the goal; 16x16 pixels per bit."""
        rows = np.stack([self._state, self._goal])  # [2, num_bits]
        frame = np.where(rows[:, :, None] > 0.5, 0, 255).astype(np.uint8).repeat(3, axis=2)  # [2, n, 3]
        frame[1, :, 1] = np.maximum(frame[1, :, 1], 120)  # the goal row tinted green
        return frame.repeat(16, axis=0).repeat(16, axis=1)


def register_bit_flipping() -> None:
    """Register ``alfish/BitFlipping-v0``; the time limit equals ``num_bits`` (set per instance in the wrapper)."""
    if "alfish/BitFlipping-v0" not in gym.registry:
        gym.register(id="alfish/BitFlipping-v0", entry_point=_make_with_time_limit)


def _make_with_time_limit(num_bits: int = 8, render_mode: str | None = None) -> gym.Env:
    return gym.wrappers.TimeLimit(BitFlipping(num_bits, render_mode), max_episode_steps=num_bits)


register_bit_flipping()
