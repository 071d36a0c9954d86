"""Pixel toy environments for the conv encoders: small enough to learn in seconds on a CPU, with a known optimum.

``alfish/PixelCorridor-v0``: seven cells in a row; the agent starts in the middle and the goal is at one end, chosen at
random each episode. The observation is a uint8 image ``(1, 5, 7)`` (CHW): row 2 shows the agent (255) and the goal
(128), the other rows are black. Actions: 0 = left, 1 = right. Reward -0.1 per step, +1 on reaching the goal (which
terminates); truncated after 10 steps. Optimal return 0.8 (three steps); a policy that does not read the image
averages at most (0.8 - 1.0) / 2 = -0.1.

``alfish/DictCorridor-v0``: the same task with a dict observation: ``image`` (uint8 ``(1, 5, 7)``, the agent only) and
``goal`` (float32 one-hot ``[2]``: left, right), so a policy needs both keys (per-key encoders).
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class PixelCorridor(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    OPTIMAL_RETURN = 0.8
    CELLS, ROWS = 7, 5

    def __init__(self, render_mode: str | None = None, dict_observation: bool = False):
        self.dict_observation = dict_observation
        image = gym.spaces.Box(0, 255, shape=(1, self.ROWS, self.CELLS), dtype=np.uint8)
        self.observation_space = gym.spaces.Dict(
            {"image": image, "goal": gym.spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)}) \
            if dict_observation else image
        self.action_space = gym.spaces.Discrete(2)
        self.render_mode = render_mode
        self._pos, self._goal = self.CELLS // 2, 0

    def _obs(self) -> Any:
        image = np.zeros((1, self.ROWS, self.CELLS), dtype=np.uint8)
        row = self.ROWS // 2
        if not self.dict_observation:
            image[0, row, self._goal] = 128
        image[0, row, self._pos] = 255
        if not self.dict_observation:
            return image
        goal = np.zeros(2, dtype=np.float32)
        goal[0 if self._goal == 0 else 1] = 1.0
        return {"image": image, "goal": goal}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._pos = self.CELLS // 2
        self._goal = 0 if self.np_random.random() < 0.5 else self.CELLS - 1
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self._pos = int(np.clip(self._pos + (1 if int(action) == 1 else -1), 0, self.CELLS - 1))
        at_goal = self._pos == self._goal
        return self._obs(), (1.0 if at_goal else -0.1), at_goal, False, {}

    def render(self) -> np.ndarray:
        frame = np.full((16, 16 * self.CELLS, 3), 255, dtype=np.uint8)
        frame[:, 16 * self._goal:16 * self._goal + 16, 1] = 180
        frame[4:12, 16 * self._pos + 4:16 * self._pos + 12, :] = (200, 0, 0)
        return frame


def register_pixel_envs() -> None:
    """Register the pixel toy envs with gymnasium (idempotent)."""
    for env_id, kwargs in (("alfish/PixelCorridor-v0", {}), ("alfish/DictCorridor-v0", {"dict_observation": True})):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=PixelCorridor, max_episode_steps=10, kwargs=kwargs)


register_pixel_envs()
