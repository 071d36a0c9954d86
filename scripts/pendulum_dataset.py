"""A D4RL-style Pendulum-v1 dataset from a scripted controller, for the offline and hybrid benchmarks and confs.

    python scripts/pendulum_dataset.py --out runs/datasets/pendulum_medium.npz --num_steps 20000 --noise 1.5

Imports only numpy and gymnasium, so both alfish's environment and d3rlpy's separate one
(``tools/bench/d3rlpy_side.py``) make the very same file; the output's folder is made if missing. The controller is
near-optimal (about -150 per episode); Gaussian torque noise degrades it: ``--noise 1.5`` gives a "medium" dataset
(about -290 per episode on average), ``0.3`` an expert one (about -150).
"""
from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np


def pendulum_controller(obs: np.ndarray) -> float:
    """Energy-shaping swing-up far from the top, PD control near it. Pendulum-v1's dynamics are
    theta'' = a sin(theta) + b u with a = 3g/(2l) = 15, b = 3/(m l^2) = 3 (theta = 0 upright), so
    E = theta'^2/2 + a cos(theta) is conserved at u = 0 and dE/dt = b theta' u; upright at rest is E = a."""
    cos_t, sin_t, theta_dot = float(obs[0]), float(obs[1]), float(obs[2])
    theta = math.atan2(sin_t, cos_t)
    a = 15.0
    if abs(theta) < 0.5 and abs(theta_dot) < 4.0:
        u = -10.0 * theta - 2.0 * theta_dot                # PD: closed loop theta'' = -15 theta - 6 theta'
    else:
        energy = 0.5 * theta_dot ** 2 + a * cos_t
        u = 0.5 * (a - energy) * theta_dot                  # pumps energy towards the upright level
        if abs(theta_dot) < 1e-3:                           # at rest at the bottom: kick
            u = 1.0
    return float(np.clip(u, -2.0, 2.0))


def make_pendulum_dataset(out: str, num_steps: int, noise: float, seed: int) -> dict:
    """Runs the heuristic controller with N(0, noise^2) torque noise (clipped to [-2, 2]) through
    gymnasium's Pendulum-v1 for ``num_steps`` steps (episodes of 200 steps, ended by the time limit:
    ``timeouts`` True at each episode's last row, ``terminals`` all False) and saves a D4RL-style .npz."""
    import gymnasium as gym

    env = gym.make("Pendulum-v1")
    rng = np.random.default_rng(seed)
    obs_dim = env.observation_space.shape[0]
    act_dim = env.action_space.shape[0]
    data = {
        "observations": np.zeros((num_steps, obs_dim), np.float32),
        "actions": np.zeros((num_steps, act_dim), np.float32),
        "rewards": np.zeros(num_steps, np.float32),
        "terminals": np.zeros(num_steps, bool),
        "timeouts": np.zeros(num_steps, bool),
        "next_observations": np.zeros((num_steps, obs_dim), np.float32),
    }
    episode_returns, ret, episode = [], 0.0, 0
    obs, _ = env.reset(seed=seed)
    for t in range(num_steps):
        action = np.clip(pendulum_controller(obs) + noise * rng.standard_normal(act_dim), -2.0, 2.0)
        next_obs, reward, terminated, truncated, _ = env.step(action.astype(np.float32))
        data["observations"][t] = obs
        data["actions"][t] = action
        data["rewards"][t] = reward
        data["terminals"][t] = terminated
        data["next_observations"][t] = next_obs
        ret += float(reward)
        last = t == num_steps - 1
        if terminated or truncated or last:
            data["timeouts"][t] = not terminated            # a cut-off last episode is a timeout too
            if terminated or truncated:
                episode_returns.append(ret)
            ret, episode = 0.0, episode + 1
            obs, _ = env.reset(seed=seed + episode)
        else:
            obs = next_obs
    env.close()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    np.savez(out, **data)
    return {
        "out": out, "num_steps": num_steps, "noise": noise, "seed": seed, "episodes": len(episode_returns),
        "episode_return_mean": float(np.mean(episode_returns)),
        "episode_return_std": float(np.std(episode_returns)),
        "episode_return_min": float(np.min(episode_returns)),
        "episode_return_max": float(np.max(episode_returns)),
    }



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the .npz file to write")
    parser.add_argument("--num_steps", type=int, default=20000)
    parser.add_argument("--noise", type=float, default=1.5, help="std of the Gaussian torque noise")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(make_pendulum_dataset(args.out, args.num_steps, args.noise, args.seed)))


if __name__ == "__main__":
    main()
