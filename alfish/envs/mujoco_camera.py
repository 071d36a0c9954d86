"""Recorded MuJoCo videos follow the robot.

gymnasium renders a MuJoCo env's ``rgb_array`` frames from a free camera placed where the robot stands when the first
frame is taken; its ``default_camera_config`` sets distance and angles, but a free camera follows no body (the
``trackbodyid`` some of those configs name is not used: every frame is rendered with the camera type set back to
free). So in a recording of HalfCheetah, Ant, Hopper or Walker2d (gymnasium 1.4, MuJoCo 4) the robot runs out of the
picture within seconds and the rest of the video shows the floor.

Every gymnasium locomotion model defines a camera that follows the robot (``track``: mode TRACKCOM, beside the robot,
looking at its centre of mass). ``follow_the_robot`` makes an env that renders to arrays use that camera, which is the
side view of the published videos. It applies only where the caller chose no camera (``camera_id`` / ``camera_name``
/ ``default_camera_config`` in ``create_environment.env_kwargs``) and the model has such a camera: a fixed-base task
(Reacher, the pendulums) keeps gymnasium's view, and a user's choice is left as it is.
"""
from __future__ import annotations

from typing import Optional

import gymnasium as gym

#: env kwargs that choose the view: when any is given, the user's choice stands
CAMERA_KWARGS = ("camera_id", "camera_name", "default_camera_config")
ARRAY_MODES = ("rgb_array", "depth_array", "rgbd_tuple")  # (``human`` opens a window the user steers)


def follow_the_robot(env: gym.Env, env_kwargs: dict) -> bool:
    """Make ``env`` render from its model's robot-tracking camera, if it is a gymnasium MuJoCo env rendering to arrays
    from its free camera, its model has a tracking camera, and ``env_kwargs`` chose no camera. Returns whether it
    changed the view."""
    if any(key in env_kwargs for key in CAMERA_KWARGS) or env.render_mode not in ARRAY_MODES:
        return False
    unwrapped = env.unwrapped
    renderer = getattr(unwrapped, "mujoco_renderer", None)
    model = getattr(unwrapped, "model", None)
    if renderer is None or model is None or getattr(renderer, "camera_id", None) not in (None, -1):
        return False  # not a gymnasium MuJoCo env, or it already renders from one of the model's cameras
    camera = tracking_camera(model)
    if camera is None:
        return False
    renderer.camera_id = camera
    return True


def tracking_camera(model) -> Optional[int]:
    """The id of the first camera of the MuJoCo ``model`` that follows a body (mode TRACK or TRACKCOM), or None."""
    import mujoco  # (imported with the env: this runs only for MuJoCo envs)

    tracking = (mujoco.mjtCamLight.mjCAMLIGHT_TRACK, mujoco.mjtCamLight.mjCAMLIGHT_TRACKCOM)
    return next((i for i, mode in enumerate(model.cam_mode) if int(mode) in tracking), None)
