"""``alfish/CartPoleNoVelocity-v1``: CartPole-v1 with its two velocities hidden, the standard partially observed
control benchmark (sb3-contrib's ``CartPoleNoVel-v1``).

The observation is ``[cart position, pole angle]`` (float32, shape ``[2]``); the dynamics, rewards and the 500-step
limit are CartPole-v1's. A feed-forward policy sees no velocity and cannot tell a pole that is falling from one that
is recovering; a recurrent policy can infer the velocities from consecutive observations.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np

#: Indices of CartPole's observation that stay visible: cart position and pole angle.
VISIBLE = (0, 2)


class HideVelocities(gym.ObservationWrapper):
    """Keeps only CartPole's positions: ``[x, x_dot, theta, theta_dot] -> [x, theta]``."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        low, high = env.observation_space.low[list(VISIBLE)], env.observation_space.high[list(VISIBLE)]
        self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, dtype=np.float32)[list(VISIBLE)]


def make_cartpole_no_velocity(render_mode: str | None = None) -> gym.Env:
    # max_episode_steps is given at registration (the TimeLimit outermost, as for CartPole-v1 itself)
    return HideVelocities(gym.make("CartPole-v1", render_mode=render_mode, max_episode_steps=None,
                                   disable_env_checker=True).unwrapped)


if "alfish/CartPoleNoVelocity-v1" not in gym.registry:
    gym.register(id="alfish/CartPoleNoVelocity-v1", entry_point=make_cartpole_no_velocity, max_episode_steps=500,
                 reward_threshold=475.0)
