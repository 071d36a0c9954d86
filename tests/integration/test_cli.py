"""CLI tier: every shipped conf trains a few iterations, checkpoints, resumes and plays (recording a gif), all through
``python -m alfish.bin.train`` / ``python -m alfish.bin.play`` in real subprocesses.

Children run with OMP_NUM_THREADS=1 (see tests/conftest.py: on 2 cores torch's default thread team is very slow
while another process is busy) and SDL_VIDEODRIVER=dummy (rendering to rgb arrays needs no display).
"""
import os
import re
import subprocess
import sys
import time

import imageio.v2 as imageio
import pytest

from alfish.rundir.checkpoint import Checkpointer
from tests.shipped_confs import BOX2D_CONFS, CLASSIC_CONTROL_CONFS, MUJOCO_CONFS, data_params, skip_unless_installed

from .inprocess import CONFS, REPO, eval_log

pytestmark = [pytest.mark.cli]

EVAL_SMALL = ["TrainerConfig.num_eval_episodes=1", "TrainerConfig.num_eval_environments=1",
              "TrainerConfig.num_checkpoints=2"]

ATARI_SMALL = ["create_environment.env_kwargs={'max_episode_steps': 50}"] + EVAL_SMALL

# The RL Zoo benchmark confs (issue 30; tests/shipped_confs.py): 50-step episodes, a small buffer, one warm-up batch.
ZOO_SMALL = ["create_environment.env_kwargs={'max_episode_steps': 50}"] + EVAL_SMALL
ZOO_OFF_POLICY = ["TrainerConfig.initial_collect_steps=256", "TrainerConfig.replay_buffer_length=1000",
                  "TrainerConfig.eval_interval=20"] + ZOO_SMALL
ZOO_ON_POLICY = ["TrainerConfig.unroll_length=16", "TrainerConfig.replay_buffer_length=17",
                 "TrainerConfig.mini_batch_size=16", "TrainerConfig.num_updates_per_train_iter=2",
                 "TrainerConfig.eval_interval=1"] + ZOO_SMALL
ZOO_PPO_ENVS = {"ppo_lunarlander.gin": 16, "ppo_bipedalwalker.gin": 32}  # the others: 1 env

# conf -> (bindings of the first, short run; env-step budget of the second run; env steps per iteration;
#          env steps taken before the first iteration; episode length limit of the env)
SHRINK = {
    # 100 warm-up steps + 1 step per iteration: 150 env steps = 50 iterations, then 200 = 98 iterations.
    "sac_pendulum.gin": (["TrainerConfig.num_env_steps=150", "TrainerConfig.initial_collect_steps=100",
                          "TrainerConfig.eval_interval=25"] + EVAL_SMALL, 200),
    # 8 envs x 32 steps per iteration (+1 warm-up step per env): 512 env steps = 2 iterations, 1024 = 4.
    "ppo_cartpole.gin": (["TrainerConfig.num_env_steps=512", "TrainerConfig.num_updates_per_train_iter=2",
                          "TrainerConfig.eval_interval=1"] + EVAL_SMALL, 1024),
    # 8 envs x 8 steps per iteration: 192 env steps = 3 iterations, 384 = 6.
    "a2c_cartpole.gin": (["TrainerConfig.num_env_steps=192", "TrainerConfig.eval_interval=1"] + EVAL_SMALL, 384),
    # as ppo_cartpole.gin, plus the observation normalizer (its statistics are checkpointed and used by play)
    "ppo_cartpole_normalized.gin": (["TrainerConfig.num_env_steps=512", "TrainerConfig.num_updates_per_train_iter=2",
                                     "TrainerConfig.eval_interval=1"] + EVAL_SMALL, 1024),
    # as ppo_cartpole.gin, recurrent (a GRU encoder; the rollout state is checkpointed with the policy and used by play)
    "ppo_cartpole_novelocity.gin": (["TrainerConfig.num_env_steps=512", "TrainerConfig.num_updates_per_train_iter=2",
                                     "TrainerConfig.eval_interval=1"] + EVAL_SMALL, 1024),
    # 20 warm-up steps + 4 steps per iteration: 60 env steps = 10 iterations, then 100 = 20.
    "dqn_cartpole.gin": (["TrainerConfig.num_env_steps=60", "TrainerConfig.initial_collect_steps=20",
                          "TrainerConfig.unroll_length=4", "TrainerConfig.num_updates_per_train_iter=2",
                          "TrainerConfig.eval_interval=5"] + EVAL_SMALL, 100),
    # as sac_pendulum.gin
    "td3_pendulum.gin": (["TrainerConfig.num_env_steps=150", "TrainerConfig.initial_collect_steps=100",
                          "TrainerConfig.eval_interval=25"] + EVAL_SMALL, 200),
    "ddpg_pendulum.gin": (["TrainerConfig.num_env_steps=150", "TrainerConfig.initial_collect_steps=100",
                           "TrainerConfig.eval_interval=25"] + EVAL_SMALL, 200),
    # as sac_pendulum.gin, with a small dataset mixed into every batch (RLPD)
    "sac_pendulum_hybrid.gin": (["TrainerConfig.num_env_steps=150", "TrainerConfig.initial_collect_steps=100",
                                 "TrainerConfig.eval_interval=25"] + EVAL_SMALL, 200),
    # as sac_pendulum.gin, with async unroll (the child is restarted on resume) and a 5 ms env-step latency
    "sac_pendulum_realtime.gin": (["TrainerConfig.num_env_steps=150", "TrainerConfig.initial_collect_steps=100",
                                   "TrainerConfig.eval_interval=25"] + EVAL_SMALL, 200),
    # 80 warm-up steps (10 per env) + 8 envs x 10 steps per iteration: 240 env steps = 2 iterations, 400 = 4.
    "dqn_her_bitflip.gin": (["TrainerConfig.num_env_steps=240", "TrainerConfig.initial_collect_steps=80",
                             "TrainerConfig.eval_interval=1"] + EVAL_SMALL, 400),
    # Atari (run only where `pip install alfish[atari]` is installed): 50-step games and a small buffer.
    # DQN: 40 warm-up steps + 4 steps per iteration: 80 env steps = 10 iterations, then 120 = 20.
    "dqn_pong.gin": (["TrainerConfig.num_env_steps=80", "TrainerConfig.initial_collect_steps=40",
                      "TrainerConfig.eval_interval=5", "TrainerConfig.replay_buffer_length=500"] + ATARI_SMALL, 120),
    "dqn_breakout.gin": (["TrainerConfig.num_env_steps=80", "TrainerConfig.initial_collect_steps=40",
                          "TrainerConfig.eval_interval=5", "TrainerConfig.replay_buffer_length=500"] + ATARI_SMALL,
                         120),
    # PPO: 8 envs x 8 steps per iteration (+1 warm-up step per env): 136 env steps = 2 iterations, 264 = 4.
    "ppo_pong.gin": (["TrainerConfig.num_env_steps=136", "TrainerConfig.unroll_length=8",
                      "TrainerConfig.replay_buffer_length=9", "TrainerConfig.eval_interval=1"] + ATARI_SMALL, 264),
    "ppo_breakout.gin": (["TrainerConfig.num_env_steps=136", "TrainerConfig.unroll_length=8",
                          "TrainerConfig.replay_buffer_length=9", "TrainerConfig.eval_interval=1"] + ATARI_SMALL, 264),
    # RL Zoo benchmark confs. SAC/TD3: 256 warm-up steps + 1 step per iteration: 300 env steps = 44 iterations, then
    # 340 = 84. DQN: 128 warm-up steps + 4 per iteration: 200 = 18 iterations, then 240 = 28.
    **{conf: (["TrainerConfig.num_env_steps=300"] + ZOO_OFF_POLICY, 340)
       for conf in MUJOCO_CONFS + BOX2D_CONFS if conf.startswith(("sac_", "td3_"))},
    "dqn_lunarlander.gin": (["TrainerConfig.num_env_steps=200", "TrainerConfig.initial_collect_steps=128",
                             "TrainerConfig.replay_buffer_length=1000", "TrainerConfig.eval_interval=5"] + ZOO_SMALL,
                            240),
    # PPO: n envs x 16 steps per iteration: 2 iterations, then 4.
    **{conf: ([f"TrainerConfig.num_env_steps={32 * ZOO_PPO_ENVS.get(conf, 1)}"] + ZOO_ON_POLICY,
              64 * ZOO_PPO_ENVS.get(conf, 1))
       for conf in MUJOCO_CONFS + BOX2D_CONFS if conf.startswith("ppo_")},
    # SAC with gSDE (32 or 64 env steps and as many updates per iteration in the confs): 256 warm-up steps + 8 steps
    # and 2 updates per iteration: 300 env steps = 6 iterations, then 340 = 11.
    **{conf: (["TrainerConfig.num_env_steps=300", "TrainerConfig.unroll_length=8",
               "TrainerConfig.num_updates_per_train_iter=2"] + ZOO_OFF_POLICY, 340)
       for conf in ("sac_mountaincar_continuous.gin", "sac_bipedalwalker.gin")},
}
# Pure offline confs (no env steps): iterations of the first run, then of the resumed one.
OFFLINE_SHRINK = {"bc_pendulum.gin": (["NUM_ITERATIONS=20", "TrainerConfig.eval_interval=10"] + EVAL_SMALL, 40),
                  "iql_pendulum.gin": (["NUM_ITERATIONS=20", "TrainerConfig.eval_interval=10"] + EVAL_SMALL, 40)}
EPISODE_LIMIT = {"sac_pendulum.gin": 200, "sac_pendulum_hybrid.gin": 200, "ppo_cartpole.gin": 500,
                 "a2c_cartpole.gin": 500,
                 "ppo_cartpole_normalized.gin": 500, "ppo_cartpole_novelocity.gin": 500,
                 "dqn_cartpole.gin": 500, "td3_pendulum.gin": 200,
                 "ddpg_pendulum.gin": 200, "dqn_her_bitflip.gin": 10,
                 "sac_pendulum_realtime.gin": 200, "dqn_pong.gin": 50, "dqn_breakout.gin": 50, "ppo_pong.gin": 50,
                 "ppo_breakout.gin": 50, **{conf: 50 for conf in MUJOCO_CONFS + BOX2D_CONFS + CLASSIC_CONTROL_CONFS}}


# The default run trains, resumes and plays one conf of each kind (off-policy SAC, on-policy PPO, DQN with HER and a
# dict observation, offline BC); the other confs run the same test in the slow tier (`python -m pytest -m slow
# tests`), about 20 s each. Their features are tested in the default run elsewhere: TD3/DDPG learning, the hybrid
# mixture, async unroll, the normalizer and recurrent resume (tests/integration, tests/offline).
DEFAULT_TIER = {"sac_pendulum.gin", "ppo_cartpole.gin", "dqn_her_bitflip.gin", "bc_pendulum.gin"}


def tiered(confs):
    """``confs`` as parameters, those outside DEFAULT_TIER marked slow."""
    return [pytest.param(c, marks=() if c in DEFAULT_TIER else pytest.mark.slow) for c in sorted(confs)]


def test_every_shipped_conf_is_exercised_here():
    assert set(SHRINK) | set(OFFLINE_SHRINK) | {"sl_sine.gin"} == {p.name for p in CONFS.glob("*.gin")}


def child_env():
    env = dict(os.environ, OMP_NUM_THREADS="1", SDL_VIDEODRIVER="dummy", PYTHONUNBUFFERED="1")
    env.setdefault("MUJOCO_GL", "egl")  # MuJoCo renders headless through EGL (its default, GLFW, needs a display)
    env.pop("DISPLAY", None)
    return env


def run(args, timeout=90):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=timeout)
    proc.elapsed = time.monotonic() - start
    return proc


def train(conf, root, params):
    args = ["alfish.bin.train", "--conf", str(conf), "--root_dir", str(root)]
    for p in params:
        args += ["--conf_param", p]
    return run(args)


def checkpoint_steps(root):
    return Checkpointer(os.path.join(root, "checkpoints")).steps()


def check_ok(proc):
    assert proc.returncode == 0, (f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                                  f"stderr:\n{proc.stderr[-3000:]}")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("conf", tiered(SHRINK))
def test_conf_trains_checkpoints_resumes_and_plays(tmp_path, conf):
    skip_unless_installed(conf)
    first_params, second_budget = SHRINK[conf]
    first_params = first_params + data_params(conf, tmp_path / "data")
    root = tmp_path / "root"

    # --- a short run ---------------------------------------------------------------------------------------------
    proc = train(CONFS / conf, root, first_params)
    check_ok(proc)
    steps = checkpoint_steps(root)
    assert steps, "no checkpoint directory under root_dir/checkpoints"
    first_last = steps[-1]
    ckpt = Checkpointer(os.path.join(root, "checkpoints")).load(first_last)  # verifies sha256 and loads tensors
    assert ckpt.meta["iteration"] == first_last
    operative = (root / "config" / "operative.gin").read_text()
    budget = first_params[0].split("=")[1]
    assert f"TrainerConfig.num_env_steps = {budget}" in operative
    assert "TrainerConfig.algorithm_ctor = @" in operative
    first_evals = eval_log(root)
    assert first_evals and first_evals[-1]["iteration"] == first_last
    assert os.listdir(root / "tb")

    # --- the same command with a larger budget resumes where it stopped ---------------------------------------------
    second_params = [p for p in first_params if not p.startswith("TrainerConfig.num_env_steps")]
    proc = train(CONFS / conf, root, second_params + [f"TrainerConfig.num_env_steps={second_budget}"])
    check_ok(proc)
    ckpt_dir = os.path.join(root, "checkpoints", f"ckpt-{first_last}")
    assert f"resumed from {ckpt_dir}: iteration {first_last}," in proc.stderr, proc.stderr[-3000:]
    final = checkpoint_steps(root)[-1]
    assert final > first_last
    later_evals = eval_log(root)[len(first_evals):]
    assert later_evals and all(r["iteration"] > first_last for r in later_evals)
    assert later_evals[-1]["env_steps"] >= second_budget > first_evals[-1]["env_steps"]

    # --- play the newest checkpoint and record it -----------------------------------------------------------------
    gif = tmp_path / "out.gif"
    proc = run(["alfish.bin.play", "--root_dir", str(root), "--num_episodes", "1", "--record_file", str(gif)])
    check_ok(proc)
    episodes = re.findall(r"^episode 1: return (-?\d+(?:\.\d+)?) length (\d+)$", proc.stdout, re.MULTILINE)
    assert len(episodes) == 1, proc.stdout
    length = int(episodes[0][1])
    assert 1 <= length <= EPISODE_LIMIT[conf]
    if conf in ("sac_pendulum.gin", "sac_pendulum_realtime.gin", "sac_pendulum_hybrid.gin"):
        assert length == 200  # Pendulum only ends by its time limit
    assert f"ckpt-{final}" in proc.stdout
    assert gif.is_file() and gif.stat().st_size > 0
    with open(gif, "rb") as f:
        assert f.read(6) in (b"GIF87a", b"GIF89a")
    assert f"recorded {length + 1} frames to {gif}" in proc.stdout  # the reset frame plus one per step
    # The gif writer may merge pixel-identical consecutive frames (CartPole barely moves in one step).
    # An untrained Breakout policy that never serves leaves every frame of its 50 steps the same.
    frames = imageio.mimread(gif)
    assert (1 if conf == "dqn_breakout.gin" or conf == "ppo_breakout.gin" else 2) <= len(frames) <= length + 1
    assert frames[0].ndim == 3 and frames[0].shape[2] in (3, 4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("conf", tiered(OFFLINE_SHRINK))
def test_offline_conf_trains_without_env_steps_resumes_and_plays(tmp_path, conf):
    first_params, second_iterations = OFFLINE_SHRINK[conf]
    data = data_params(conf, tmp_path / "data")
    root = tmp_path / "root"
    check_ok(train(CONFS / conf, root, first_params + data))
    first_last = checkpoint_steps(root)[-1]
    first_evals = eval_log(root)
    assert first_evals[-1]["iteration"] == first_last == 20 and first_evals[-1]["env_steps"] == 0
    proc = train(CONFS / conf, root, first_params[1:] + data + [f"NUM_ITERATIONS={second_iterations}"])
    check_ok(proc)
    assert f"resumed from {os.path.join(root, 'checkpoints', f'ckpt-{first_last}')}: iteration {first_last}," \
        in proc.stderr, proc.stderr[-3000:]
    assert eval_log(root)[-1]["iteration"] == second_iterations
    assert "training finished: 40 iterations, 0 env steps" in proc.stderr
    gif = tmp_path / "out.gif"
    proc = run(["alfish.bin.play", "--root_dir", str(root), "--num_episodes", "1", "--record_file", str(gif)])
    check_ok(proc)
    assert re.search(r"^episode 1: return -?\d+(\.\d+)? length 200$", proc.stdout, re.MULTILINE), proc.stdout
    assert gif.is_file() and gif.stat().st_size > 0


@pytest.mark.timeout(120)
def test_the_supervised_conf_trains_resumes_and_refuses_play(tmp_path):
    root = tmp_path / "root"
    check_ok(train(CONFS / "sl_sine.gin", root, ["TrainerConfig.num_iterations=300"]))
    assert checkpoint_steps(root) == [150, 300]
    proc = train(CONFS / "sl_sine.gin", root, ["TrainerConfig.num_iterations=600"])
    check_ok(proc)
    assert f"resumed from {os.path.join(root, 'checkpoints', 'ckpt-300')}: iteration 300," in proc.stderr
    assert "training finished: 600 iterations, 0 env steps" in proc.stderr
    proc = run(["alfish.bin.play", "--root_dir", str(root), "--num_episodes", "1"])
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("trained a supervised model (TrainerConfig.ml_type='sl'): there is no "
                                        "policy to play")


@pytest.mark.timeout(30)
def test_misspelled_parameter_fails_fast_naming_file_line_and_suggestion(tmp_path):
    lines = (CONFS / "a2c_cartpole.gin").read_text().splitlines()
    line_no = next(i for i, line in enumerate(lines, 1) if line.startswith("A2cAlgorithm.gamma"))
    lines[line_no - 1] = lines[line_no - 1].replace("A2cAlgorithm.gamma", "A2cAlgorithm.gama")
    conf = tmp_path / "typo.gin"
    conf.write_text("\n".join(lines) + "\n")
    proc = train(conf, tmp_path / "root", [])
    assert proc.returncode != 0
    assert not (tmp_path / "root").exists()  # refused before anything was set up (no logging, no env, no checkpoint)
    err_lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert err_lines == [f"error: {conf}:{line_no}: 'A2cAlgorithm' has no parameter 'gama'; did you mean 'gamma'?"]
    assert not os.path.exists(tmp_path / "root" / "checkpoints")  # failed before anything was built


# slow: three subprocesses (15 s in CI); the fallback past damaged checkpoints runs in the default run in-process for
# play, evaluate and resume (tests/rundir/test_untrusted_reads.py, test_corrupt_runs.py)
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_corrupted_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    conf, root = CONFS / "ppo_cartpole.gin", tmp_path / "root"
    first_params, _ = SHRINK["ppo_cartpole.gin"]
    check_ok(train(conf, root, first_params))
    assert checkpoint_steps(root) == [1, 2]  # num_checkpoints=2 over 2 iterations
    model = root / "checkpoints" / "ckpt-2" / "algorithm.pt"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    model.write_bytes(bytes(data))

    params = [p for p in first_params if not p.startswith("TrainerConfig.num_env_steps")]
    proc = train(conf, root, params + ["TrainerConfig.num_env_steps=1024"])
    check_ok(proc)
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line and str(model) in line]
    assert len(warnings) == 1, proc.stderr[-3000:]
    assert "does not match its manifest" in warnings[0]
    assert "falling back to an older checkpoint (step 1)" in warnings[0]
    ckpt1 = os.path.join(root, "checkpoints", "ckpt-1")
    assert f"resumed from {ckpt1}: iteration 1," in proc.stderr
    assert checkpoint_steps(root) == [1, 2, 4]
    # ckpt-2 was written again by the resumed run and verifies now.
    assert Checkpointer(os.path.join(root, "checkpoints")).load(2).meta["iteration"] == 2
