"""Atari 2600 games (the Arcade Learning Environment, ``pip install alfish[atari]``) as alfish trains on them.

Every env name ``ALE/<Game>-v5`` (e.g. ``ALE/Pong-v5``, ``ALE/Breakout-v5``) is made by ``make_atari`` with the
evaluation protocol of Machado et al. (2018), "Revisiting the Arcade Learning Environment": sticky actions
(``repeat_action_probability=0.25``) instead of no-op starts alone as the source of stochasticity, the minimal action
set, whole games as episodes (no termination on a lost life), and the usual DQN preprocessing (gymnasium's
``AtariPreprocessing``): an agent step is 4 frames with the last two max-pooled, up to 30 no-ops at reset, grayscale
84x84. The observation is one uint8 frame ``(1, 84, 84)`` (channels first): frame stacking is alfish's
``FrameStacker(stack_size=4)``, which rebuilds stacks at sample time, so the replay buffer stores each frame once.
Reward clipping is the ``RewardClipping`` transformer (training data only; returns stay the game's score).

Each setting is a keyword of ``make_atari``, given in a conf as ``create_environment.env_kwargs``; other keywords go to
the ALE env itself (e.g. ``mode``, ``difficulty``). ``ale_py:ALE/Pong-v5`` names the raw ALE env, unprocessed.
This module imports ``ale_py`` and ``cv2`` only inside ``make_atari``: alfish imports without the extra.
"""
from __future__ import annotations

from typing import Any, Optional

import gymnasium as gym

from alfish.errors import OneLineValueError

ATARI_PREFIX = "ALE/"
MISSING_EXTRA = "Atari envs need ale-py and opencv: pip install alfish[atari]"
# ALE keywords that make_atari sets itself, and the make_atari keyword to use instead (None: not a setting).
_SET_HERE = {"frameskip": "frame_skip", "obs_type": None, "max_num_frames_per_episode": "max_episode_steps"}


class AtariDependencyError(OneLineValueError, ImportError):
    """ale-py or opencv is not installed. One line, saying how to install them."""


def is_atari(env_name: str) -> bool:
    """Whether ``env_name`` is made by ``make_atari`` (an ``ALE/...`` id)."""
    return env_name.startswith(ATARI_PREFIX)


def make_atari(
    env_name: str,
    render_mode: Optional[str] = None,
    *,
    repeat_action_probability: float = 0.25,
    frame_skip: int = 4,
    noop_max: int = 30,
    screen_size: int = 84,
    terminal_on_life_loss: bool = False,
    full_action_space: bool = False,
    max_episode_steps: Optional[int] = 27_000,
    **ale_kwargs: Any,
) -> gym.Env:
    """The ALE game ``env_name`` (``ALE/<Game>-v5``) with Machado et al.'s protocol and the DQN preprocessing.

    repeat_action_probability: sticky actions: each frame, the previous action is repeated with this probability.
    frame_skip: frames per agent step (rewards summed, the last two frames max-pooled into the observation).
    noop_max: at reset, 1 to ``noop_max`` no-op actions (0: none).
    screen_size: the observation is ``(1, screen_size, screen_size)`` uint8 grayscale.
    terminal_on_life_loss: end the episode when a life is lost (off, as Machado et al. recommend: an episode is a
        whole game, and its return the game's score).
    full_action_space: all 18 joystick actions instead of the game's minimal set.
    max_episode_steps: agent steps after which an episode is truncated (LAST with discount 1, bootstrapped); 27,000
        steps = 108,000 frames = 30 minutes of play, the usual cap; None: no cap.
    ale_kwargs: more keywords of ``ale_py.env.AtariEnv`` (e.g. ``mode``, ``difficulty``).
    """
    try:
        import ale_py
        import cv2  # noqa: F401  (gymnasium's AtariPreprocessing resizes with it)
    except ImportError:
        raise AtariDependencyError(MISSING_EXTRA) from None
    for name, instead in _SET_HERE.items():
        if name in ale_kwargs:
            use = f"; use '{instead}'" if instead else ""
            raise ValueError(f"env_kwargs '{name}' is set by alfish's Atari preprocessing for {env_name}{use}")
    gym.register_envs(ale_py)
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Warning)  # no version banner from each env (worker)
    env = gym.make(
        env_name,
        frameskip=1,  # AtariPreprocessing skips frames, to max-pool the last two
        repeat_action_probability=repeat_action_probability,
        full_action_space=full_action_space,
        obs_type="grayscale",  # the preprocessing reads the screen itself; a grayscale copy per frame is the cheapest
        max_num_frames_per_episode=None,  # the cap is max_episode_steps, in agent steps
        render_mode=render_mode,
        disable_env_checker=True,  # alfish's ContractCheck checks every step
        **ale_kwargs,
    )
    env = gym.wrappers.AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size,
                                          terminal_on_life_loss=terminal_on_life_loss, grayscale_obs=True,
                                          grayscale_newaxis=False, scale_obs=False)
    env = gym.wrappers.ReshapeObservation(env, (1,) + tuple(env.observation_space.shape))  # HW -> CHW
    if max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps)
    return env
