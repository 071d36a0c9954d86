"""``alfish/Latency-v0``: any gymnasium env whose steps take a fixed extra wall-clock time, standing in for a robot
or a real-time simulator (benchmarks of async unroll), optionally failing on purpose (fault-injection tests).

    create_environment.env_name = 'alfish/Latency-v0'
    create_environment.env_kwargs = {'env_name': 'Pendulum-v1', 'latency_s': 0.003}
"""
from __future__ import annotations

import time
from typing import Any

import gymnasium as gym


class LatencyWrapper(gym.Wrapper):
    """Each ``step`` sleeps ``latency_s`` seconds after stepping the wrapped env.

    raise_at_step: if > 0, the step with this number (counted over the env's lifetime, from 1) raises RuntimeError.
    hang_at_step: if > 0, the step with this number never returns (it sleeps forever: a hung simulator).
    """

    def __init__(self, env: gym.Env, latency_s: float = 0.003, raise_at_step: int = 0, hang_at_step: int = 0):
        super().__init__(env)
        if latency_s < 0:
            raise ValueError(f"alfish/Latency-v0 latency_s={latency_s} must be >= 0 (seconds)")
        self.latency_s, self.raise_at_step, self.hang_at_step = latency_s, raise_at_step, hang_at_step
        self.num_steps = 0

    def step(self, action: Any):
        self.num_steps += 1
        if self.raise_at_step and self.num_steps == self.raise_at_step:
            raise RuntimeError(f"alfish/Latency-v0: injected failure at step {self.num_steps}")
        while self.hang_at_step and self.num_steps == self.hang_at_step:
            time.sleep(3600)  # injected hang
        result = self.env.step(action)
        if self.latency_s:
            time.sleep(self.latency_s)
        return result


def make_latency_env(env_name: str = "Pendulum-v1", latency_s: float = 0.003, raise_at_step: int = 0,
                     hang_at_step: int = 0, render_mode: str | None = None, **env_kwargs: Any) -> gym.Env:
    return LatencyWrapper(gym.make(env_name, render_mode=render_mode, **env_kwargs), latency_s, raise_at_step,
                          hang_at_step)


if "alfish/Latency-v0" not in gym.registry:
    gym.register(id="alfish/Latency-v0", entry_point=make_latency_env)
