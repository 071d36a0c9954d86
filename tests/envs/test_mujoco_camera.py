"""Recorded MuJoCo videos follow the robot (``alfish.envs.mujoco_camera``): gymnasium's free camera stays where the
first frame was taken, so without the fix a frame taken after the cheetah has run 20 m shows only the floor."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("mujoco")

from alfish.envs.factory import EnvFactory  # noqa: E402


def camera_id(env_name, env_kwargs=None, render_mode="rgb_array"):
    """The camera the env renders from (-1: gymnasium's free camera)."""
    env = EnvFactory.here(env_name, env_kwargs, render_mode)()
    try:
        return env.unwrapped.mujoco_renderer.camera_id
    finally:
        env.close()


def test_locomotion_envs_render_from_their_robot_tracking_camera():
    for name in ("HalfCheetah-v5", "Hopper-v5", "Ant-v5"):
        assert camera_id(name) == 0, name  # the model's camera 0: 'track' (TRACKCOM)


def test_chosen_views_fixed_base_tasks_and_unrendered_envs_are_left_alone():
    assert camera_id("HalfCheetah-v5", {"default_camera_config": {"distance": 7.0}}) == -1  # the user's free view
    assert camera_id("HalfCheetah-v5", render_mode=None) == -1                               # not rendering
    assert camera_id("InvertedDoublePendulum-v5") == -1  # no tracking camera in the model: gymnasium's view


RENDER = textwrap.dedent("""
    import mujoco, numpy as np
    from alfish.envs.factory import EnvFactory
    env = EnvFactory.here("HalfCheetah-v5", {}, "rgb_array")()
    env.reset(seed=0)
    data, model = env.unwrapped.data, env.unwrapped.model
    env.render()  # the episode's first frame, as a recording takes it (gymnasium places its camera then)
    data.qpos[0] = 20.0  # the cheetah 20 m down the track
    mujoco.mj_forward(model, data)
    frame = env.render().astype(int)
    print(int(((frame[..., 0] - frame[..., 2]) > 60).sum()))  # orange pixels: the robot (the floor is green/black)
""")


@pytest.mark.timeout(60)
def test_a_recorded_frame_shows_the_cheetah_after_it_has_run_off():
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    proc = subprocess.run([sys.executable, "-c", RENDER], env=env, capture_output=True, text=True, timeout=50)
    if proc.returncode != 0 and ("EGL" in proc.stderr or "OpenGL" in proc.stderr or "GLFW" in proc.stderr):
        pytest.skip(f"MuJoCo cannot render headless here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    robot_pixels = int(proc.stdout.split()[-1])
    assert robot_pixels > 1000, f"only {robot_pixels} robot pixels: the camera lost the cheetah"  # 0 without the fix
