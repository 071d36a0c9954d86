"""Run one training job of alfish, Stable-Baselines3 or SBX and print a JSON line with its timings.

Used by bench_vs_sb3.py, which starts each job in a fresh process so the frameworks never share a process, threads
or warm caches. Only the learning call is timed (imports and model construction are not).

    python tools/bench/run_one.py --framework alfish|sb3|sbx --algo sac|ppo|... --setting identical|tuned \
        --steps N [--eval_every E] [--seed S] [--threads T] [--param BINDING ...]

``make_alfish`` / ``make_sb3`` build a job without running it (``profile_step.py`` instruments them first).

SBX (Stable-Baselines in JAX, ``pip install sbx-rl``) runs in its own virtual environment (it pulls jax; it never
enters alfish's installs): run this file with that environment's python. Its models are SB3's classes with JAX
networks and the same arguments, so ``make_sb3`` builds both, at the same hyperparameters. SBX compiles (XLA) its
training and acting functions at their first call: the timed ``learn`` comes after a warm-up ``learn`` of
``sbx_warm_up_steps`` on the same model (past ``learning_starts`` and through two training phases), started again
from step 0 (``reset_num_timesteps``), so SBX's figure is after its JIT warm-up, without the compile time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFS = {"sac": "confs/sac_pendulum.gin", "ppo": "confs/ppo_cartpole.gin", "td3": "confs/td3_pendulum.gin",
         "ddpg": "confs/ddpg_pendulum.gin", "dqn": "confs/dqn_cartpole.gin", "dqn_noper": "confs/dqn_cartpole.gin",
         "dqn_plain": "confs/dqn_cartpole.gin", "a2c": "confs/a2c_cartpole.gin"}
ENVS = {"sac": "Pendulum-v1", "ppo": "CartPole-v1", "td3": "Pendulum-v1", "ddpg": "Pendulum-v1",
        "dqn": "CartPole-v1", "dqn_noper": "CartPole-v1", "dqn_plain": "CartPole-v1", "a2c": "CartPole-v1"}
EXTRA_PARAMS = {"dqn_noper": ["TrainerConfig.priority_replay=False"],
                # the algorithm SB3's DQN runs: uniform replay and no double Q (SB3 has neither option)
                "dqn_plain": ["TrainerConfig.priority_replay=False", "DqnAlgorithm.double_q=False"]}
EVAL_EPISODES = 5
# as in the confs
ENV_STEPS_PER_ITERATION = {"ppo": 8 * 32, "dqn": 256, "dqn_noper": 256, "dqn_plain": 256, "a2c": 8 * 8}


def make_alfish(args: argparse.Namespace):
    """The alfish trainer of ``args`` (built, not run) and its results directory."""
    from alfish.config import TrainerConfig, load_conf
    from alfish.trainer.build import build_trainer

    root = tempfile.mkdtemp(prefix=f"bench-alfish-{args.algo}-")
    params = [f"TrainerConfig.num_env_steps={args.steps}", "TrainerConfig.num_iterations=0",
              f"TrainerConfig.random_seed={args.seed}", "TrainerConfig.num_checkpoints=0",
              "TrainerConfig.summary_interval=1000000", "TrainerConfig.summarize_first_interval=False",
              "Trainer.progress_log_interval_s=1e9"]
    if args.eval_every:
        per_iter = ENV_STEPS_PER_ITERATION.get(args.algo, 1)
        params += ["TrainerConfig.evaluate=True", f"TrainerConfig.eval_interval={max(1, args.eval_every // per_iter)}",
                   f"TrainerConfig.num_eval_episodes={EVAL_EPISODES}", "TrainerConfig.num_eval_environments=1"]
    else:
        params += ["TrainerConfig.evaluate=False"]
    if args.threads:
        params.append(f"Trainer.num_threads={args.threads}")
    params += EXTRA_PARAMS.get(args.algo, []) + list(args.param)
    load_conf(os.path.join(REPO, CONFS[args.algo]), params)
    return build_trainer(TrainerConfig(root_dir=root)), root


def run_alfish(args: argparse.Namespace) -> dict:
    trainer, root = make_alfish(args)
    start = time.perf_counter()
    trainer.run()
    learn_s = time.perf_counter() - start
    # seconds torch.compile spent compiling in the run (0 when eager: dynamo never loaded), by dynamo's own account
    dynamo = sys.modules.get("torch._dynamo.utils")
    compile_s = sum(dynamo.compilation_time_metrics.get("_compile.compile_inner", [])) if dynamo else 0.0
    evals = []
    log = os.path.join(root, "eval_log.jsonl")
    if os.path.exists(log):
        offset = trainer.counters.elapsed_s() - learn_s  # the log's clock starts when the parts are built
        for line in open(log):
            rec = json.loads(line)
            evals.append((rec["env_steps"], rec["elapsed_s"] - offset, rec["average_return"]))
    return dict(steps=trainer.counters.env_steps, learn_s=learn_s, evals=evals, compile_s=compile_s)


def make_sb3(args: argparse.Namespace, library: str = "sb3"):
    """The Stable-Baselines3 (``library='sb3'``) or SBX (``'sbx'``) model of ``args`` (built, not trained) and its
    evaluation callback. SBX's DQN has no gradient clipping (``max_grad_norm``) to set; it has no A2C."""
    import importlib

    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    if library == "sbx" and args.algo == "a2c":
        raise SystemExit("SBX has no A2C (it has SAC, TD3, DDPG, DQN, PPO, CrossQ, TQC)")
    lib = importlib.import_module("stable_baselines3" if library == "sb3" else "sbx")
    PPO, SAC = lib.PPO, lib.SAC
    if args.threads and library == "sb3":
        import torch

        torch.set_num_threads(args.threads)

    class TimedEval(BaseCallback):
        """Deterministic evaluation every ``eval_every`` env steps, recording the wall-clock since learn() began."""

        def __init__(self, eval_env, every: int):
            super().__init__()
            self.eval_env, self.every, self.records, self.next_at = eval_env, every, [], every

        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            if self.every and self.num_timesteps >= self.next_at:
                self.next_at += self.every
                mean, _ = evaluate_policy(self.model, self.eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
                self.records.append((self.num_timesteps, time.perf_counter() - self.start, float(mean)))
            return True

    if args.algo in ("td3", "ddpg"):
        import numpy as np
        from stable_baselines3.common.noise import NormalActionNoise

        noise = NormalActionNoise(mean=np.zeros(1), sigma=0.1 * np.ones(1))  # in SB3's [-1, 1] action units
        cls = lib.TD3 if args.algo == "td3" else lib.DDPG
        model = cls("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, batch_size=256, buffer_size=200_000,
                    learning_starts=1000, tau=0.005, gamma=0.98, train_freq=1, gradient_steps=1, action_noise=noise,
                    policy_kwargs=dict(net_arch=[256, 256]), seed=args.seed, verbose=0, device="cpu")
    elif args.algo in ("dqn", "dqn_noper", "dqn_plain"):
        clip = dict(max_grad_norm=10) if library == "sb3" else {}  # (SBX's DQN does not clip)
        model = lib.DQN("MlpPolicy", "CartPole-v1", learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                        learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
                        gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04,
                        policy_kwargs=dict(net_arch=[256, 256]), seed=args.seed, verbose=0, device="cpu", **clip)
    elif args.algo == "sac":
        model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, batch_size=256, buffer_size=100_000,
                    learning_starts=100, tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1,
                    policy_kwargs=dict(net_arch=[256, 256]), seed=args.seed, verbose=0, device="cpu")
    elif args.algo == "a2c":  # confs/a2c_cartpole.gin: Adam (SB3's default is RMSprop), GAE lambda 1, no advantage
        # normalization, grad-norm clip 0.5, 64x64 tanh (SB3's default net)
        env = make_vec_env("CartPole-v1", n_envs=8, seed=args.seed)
        model = lib.A2C("MlpPolicy", env, n_steps=8, learning_rate=1e-3, gamma=0.99, gae_lambda=1.0, ent_coef=0.0,
                    vf_coef=0.5, max_grad_norm=0.5, use_rms_prop=False, normalize_advantage=False, seed=args.seed,
                    verbose=0, device="cpu")
    else:
        env = make_vec_env("CartPole-v1", n_envs=8, seed=args.seed)
        if args.setting == "tuned":  # RL Zoo's ppo.yml CartPole-v1 entry, linear schedules included
            lr, clip = (lambda f: f * 1e-3), (lambda f: f * 0.2)
        else:
            lr, clip = 1e-3, 0.2
        model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, n_epochs=20, gae_lambda=0.8, gamma=0.98,
                    ent_coef=0.0, learning_rate=lr, clip_range=clip, seed=args.seed, verbose=0, device="cpu")
    import gymnasium as gym

    return model, TimedEval(gym.make(ENVS[args.algo]), args.eval_every)


def run_sb3(args: argparse.Namespace) -> dict:
    model, callback = make_sb3(args)
    start = time.perf_counter()
    model.learn(total_timesteps=args.steps, callback=callback)
    return dict(steps=int(model.num_timesteps), learn_s=time.perf_counter() - start, evals=callback.records)


#: Env steps of SBX's untimed warm-up ``learn``: past ``learning_starts`` and through two training phases, so that
#: every function it jit-compiles (acting, the update) is compiled before the timed run.
SBX_WARM_UP_STEPS = {"sac": 100 + 2, "td3": 1000 + 2, "ddpg": 1000 + 2, "dqn": 1000 + 2 * 256,
                     "dqn_noper": 1000 + 2 * 256, "dqn_plain": 1000 + 2 * 256, "ppo": 2 * 8 * 32}


def run_sbx(args: argparse.Namespace) -> dict:
    if args.threads not in (0, 1):
        raise SystemExit(f"--threads {args.threads}: SBX (XLA on the CPU) is run at its default threads (0) or at 1")
    if args.threads == 1:  # XLA's CPU thread pools, set before jax is imported
        os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    model, callback = make_sb3(args, library="sbx")
    model.learn(total_timesteps=SBX_WARM_UP_STEPS[args.algo])  # the JIT warm-up, not timed
    start = time.perf_counter()
    model.learn(total_timesteps=args.steps, callback=callback, reset_num_timesteps=True)
    return dict(steps=int(model.num_timesteps), learn_s=time.perf_counter() - start, evals=callback.records,
                jit_warm_up_steps=SBX_WARM_UP_STEPS[args.algo])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=["alfish", "sb3", "sbx"], required=True)
    parser.add_argument("--algo", choices=sorted(CONFS), required=True)
    parser.add_argument("--setting", choices=["identical", "tuned"], default="identical")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--eval_every", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--param", action="append", default=[],
                        help="alfish only: an extra gin binding, e.g. \"Learner.compile_mode='default'\" (repeatable)")
    args = parser.parse_args()
    if args.param and args.framework != "alfish":
        parser.error("--param binds alfish's gin settings; it has no meaning for the peers")
    result = dict(alfish=run_alfish, sb3=run_sb3, sbx=run_sbx)[args.framework](args)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
