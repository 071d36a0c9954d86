"""alfish against Stable-Baselines3 on Atari Pong from pixels, in the same run, at the same hyperparameters; and how
close alfish's conv updates get to this machine's floor.

    python tools/bench/bench_atari.py [--algos dqn ppo] [--repeats 3] [--dqn_steps 3000] [--ppo_steps 3072]
                                      [--floor_only] [--learn_steps 0]

Needs ``pip install alfish[atari]`` and the peer: ``pip install -r tools/bench/requirements-peers.txt``.

Throughput: each framework trains ``--*_steps`` agent steps of ``ALE/Pong-v5`` (4 frames each) in a fresh process,
alternating alfish / SB3 ``--repeats`` times; the medians of agent steps/s and their ratio are printed.
  * DQN: confs/dqn_pong.gin (Nature CNN, Adam 1e-4, batch 32, one update per 4 env steps, target every 1000 env
    steps) against SB3's ``DQN('CnnPolicy')`` at RL Zoo's Atari settings; both start updating after 1,000 random steps
    (instead of 100k) so the measured window is mostly training, and keep a 100k replay buffer.
  * PPO: confs/ppo_pong.gin (8 envs x 128 steps, 4 epochs of 256, shared Nature CNN) against SB3's
    ``PPO('CnnPolicy')`` at RL Zoo's Atari settings. alfish runs the conf's vectorization ('async', env workers);
    SB3 its default for ``make_atari_env`` (a DummyVecEnv in process): each framework at its default.
  Env pipelines: alfish's ``make_atari`` (sticky actions 0.25, AtariPreprocessing, frames stacked from replay); SB3's
  ``make_atari_env`` (``AtariWrapper``) over the same ``ALE/Pong-v5`` with frameskip 1 and sticky actions 0.25, and
  ``VecFrameStack(4)``. Threads: each framework's default.
Floor (``--floor_only`` prints only this): the Nature CNN's FLOPs per sample (convs as im2col matmuls, 2 FLOPs per
multiply-add) over the best rate this machine reaches on a bare ``nn.Sequential`` Nature CNN (forward, and forward +
backward, batches 8 to 256, NCHW and channels_last, best of 5 each): the time an update or a forward pass cannot go
below here. Beside it, the same work done by the bare network at the same batch size (what the kernels reach there)
and alfish's measured times.
Learning (``--learn_steps N``): one run each of N agent steps with a 5-episode evaluation at the end (game score).
Env only (``--env_only``): agent steps/s of ``ALE/Pong-v5`` through alfish's ``BatchedEnv`` with random actions, for
each vectorization ('sync', 'async', 'envpool' when installed) at 1 and 8 envs, medians of ``--repeats``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFS = {"dqn": "confs/dqn_pong.gin", "ppo": "confs/ppo_pong.gin"}
WARM_UP = 1000  # random steps before DQN's first update (both frameworks)


# ------------------------------------------------------------------------------------------------- floor ----
def nature_cnn_layers(in_channels: int = 4, size: int = 84, num_actions: int = 6) -> list[tuple[str, int, int]]:
    """``(name, multiply-adds per sample, outputs per sample)`` of each layer of the Nature CNN + 512 + head."""
    layers, c, s = [], in_channels, size
    for out, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
        s = (s - kernel) // stride + 1
        layers.append((f"conv {out}x{kernel}x{kernel}/{stride}", s * s * out * c * kernel * kernel, s * s * out))
        c = out
    flat = c * s * s
    layers += [("fc 512", flat * 512, 512), (f"head {num_actions}", 512 * num_actions, num_actions)]
    return layers


def forward_flops(in_channels: int = 4, num_actions: int = 6) -> float:
    return 2.0 * sum(macs for _, macs, _ in nature_cnn_layers(in_channels, num_actions=num_actions))


def training_flops(in_channels: int = 4, num_actions: int = 6) -> float:
    """Forward + backward of one sample: backward computes weight and input gradients (2x forward), except the first
    conv, whose input (the image) needs no gradient (1x)."""
    macs = [m for _, m, _ in nature_cnn_layers(in_channels, num_actions=num_actions)]
    return 2.0 * (sum(macs) + 2 * sum(macs) - macs[0])


def nature_cnn(num_actions: int = 6):
    import torch
    from torch import nn

    return nn.Sequential(nn.Conv2d(4, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(),
                         nn.Linear(512, num_actions)).to(torch.float32)


def best_time(fn, repeats: int = 5, number: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def machine_rates(batches: tuple[int, ...] = (8, 32, 128, 256)) -> tuple[float, float]:
    """The best FLOP/s this machine reaches on a plain Nature CNN's forward, and on its forward + backward, over
    ``batches`` and both memory formats (contiguous NCHW, channels_last NHWC: oneDNN's convolutions prefer the latter
    on CPUs), with nothing of a framework around the kernels: the peak the floors are computed from."""
    import torch

    forward = train = 0.0
    for memory_format in (torch.contiguous_format, torch.channels_last):
        net = nature_cnn().to(memory_format=memory_format)
        for batch in batches:
            x = torch.rand(batch, 4, 84, 84).contiguous(memory_format=memory_format)

            def step(x: torch.Tensor = x, net: torch.nn.Module = net) -> None:
                net.zero_grad(set_to_none=True)
                net(x).sum().backward()

            with torch.no_grad():
                forward = max(forward, batch * forward_flops() / best_time(lambda x=x, net=net: net(x)))
            train = max(train, batch * training_flops() / best_time(step))
    return forward, train


def alfish_times() -> dict:
    """alfish's DQN update (batch 32, [2, 32, 4, 84, 84] uint8) and policy forward (1 and 8 observations), in s."""
    import gymnasium as gym
    import numpy as np
    import torch

    from alfish.algorithms.dqn import DqnAlgorithm
    from alfish.data.types import Experience
    from alfish.learn.optim import OptimizerConfig
    from alfish.networks.encoding import EncodingNetwork

    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    import functools

    import alfish.networks.heads as heads
    ctor = functools.partial(heads.FeedForwardNetwork, hidden_sizes=(),
                             encoding_network_ctor=functools.partial(EncodingNetwork, fc_layers=(512,)))
    alg = DqnAlgorithm(space, gym.spaces.Discrete(6), double_q=False, q_network_cls=ctor)
    opt = OptimizerConfig().build(alg.param_groups())
    length, batch = 2, 32
    exp = Experience(torch.ones(length, batch, dtype=torch.int8), torch.randn(length, batch),
                     torch.ones(length, batch), torch.randint(0, 256, (length, batch, 4, 84, 84), dtype=torch.uint8),
                     torch.randint(0, 6, (length, batch)), torch.zeros(length, batch, dtype=torch.long))

    def update() -> None:
        loss = alg.calc_loss(exp, alg.train_step(exp).info).loss.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    out = {"update_s": best_time(update, number=5)}
    for n in (1, 8):
        obs = torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8)
        with torch.inference_mode():
            out[f"forward{n}_s"] = best_time(lambda o=obs: alg._act(o, greedy=True), number=20)
    return out


def plain_times() -> dict:
    """The same work done by a bare channels_last ``nn.Sequential`` Nature CNN on float inputs (no framework, no uint8
    conversion, no loss): forward + backward at 32 plus a no-grad forward at 32 (the DQN update's network work), and
    no-grad forwards at 1 and 8. Shows what the kernels reach at these batch sizes."""
    import torch

    net = nature_cnn().to(memory_format=torch.channels_last)
    x32 = torch.rand(32, 4, 84, 84).contiguous(memory_format=torch.channels_last)

    def update() -> None:
        net.zero_grad(set_to_none=True)
        net(x32).sum().backward()
        with torch.no_grad():
            net(x32)

    out = {"update_s": best_time(update, number=5)}
    with torch.no_grad():
        for n in (1, 8):
            x = torch.rand(n, 4, 84, 84).contiguous(memory_format=torch.channels_last)
            out[f"forward{n}_s"] = best_time(lambda x=x: net(x), number=20)
    return out


def floor_report() -> list[str]:
    import torch

    forward_rate, train_rate = machine_rates()
    times, plain = alfish_times(), plain_times()
    fwd, train = forward_flops(), training_flops()
    rows = [f"machine: {torch.get_num_threads()} torch threads; Nature CNN forward {fwd / 1e6:.1f} MFLOP per sample, "
            f"forward + backward {train / 1e6:.1f} MFLOP; best measured rates (batches 8-256, both memory formats): "
            f"forward {forward_rate / 1e9:.1f} GFLOP/s, forward + backward {train_rate / 1e9:.1f} GFLOP/s",
            "| what | FLOPs | floor | bare torch net | alfish | floor / alfish | bare / alfish |",
            "|---|---|---|---|---|---|---|"]
    # DQN update, batch 32: online forward + backward on obs_0, target-network forward on obs_1.
    for name, key, flops, floor in (
            ("DQN update (batch 32)", "update_s", 32 * (train + fwd), 32 * (train / train_rate + fwd / forward_rate)),
            ("policy forward, 1 observation", "forward1_s", fwd, fwd / forward_rate),
            ("policy forward, 8 observations", "forward8_s", 8 * fwd, 8 * fwd / forward_rate)):
        rows.append(f"| {name} | {flops / 1e9:.3f} G | {floor * 1e3:.2f} ms | {plain[key] * 1e3:.2f} ms | "
                    f"{times[key] * 1e3:.2f} ms | {floor / times[key]:.0%} | {plain[key] / times[key]:.0%} |")
    return rows


# ------------------------------------------------------------------------------------------------ env only ----
def env_rate(num_envs: int, vectorization: str, steps: int = 4000, warm_up: int = 50) -> float:
    """Agent steps/s of ``num_envs`` Pong games through ``BatchedEnv``, random actions."""
    from alfish.envs import create_environment

    env = create_environment(env_name="ALE/Pong-v5", num_parallel_environments=num_envs, seed=0,
                             vectorization=vectorization)
    try:
        env.reset()
        for _ in range(warm_up):
            env.step(env.random_action())
        batches = max(1, steps // num_envs)
        start = time.perf_counter()
        for _ in range(batches):
            env.step(env.random_action())
        return batches * num_envs / (time.perf_counter() - start)
    finally:
        env.close()


def env_report(repeats: int) -> list[str]:
    import importlib.util

    modes = ["sync", "async"] + (["envpool"] if importlib.util.find_spec("envpool") else [])
    rows = ["| envs | vectorization | agent steps/s |", "|---|---|---|"]
    for num_envs in (1, 8):
        for mode in modes:
            rates = [env_rate(num_envs, mode) for _ in range(max(1, repeats))]
            rows.append(f"| {num_envs} | {mode} | {statistics.median(rates):.0f} |")
    return rows


# -------------------------------------------------------------------------------------------- end to end ----
def run_alfish(algo: str, steps: int, learn: bool) -> dict:
    from alfish.config import TrainerConfig, load_conf
    from alfish.trainer.build import build_trainer

    root = tempfile.mkdtemp(prefix=f"bench-atari-{algo}-")
    params = [f"TrainerConfig.num_env_steps={steps}", "TrainerConfig.num_checkpoints=0",
              "TrainerConfig.summary_interval=1000000", "TrainerConfig.summarize_first_interval=False",
              "Trainer.progress_log_interval_s=1e9"]
    # learning: one evaluation of 5 games when training ends (the trainer evaluates its last iteration)
    params += (["TrainerConfig.evaluate=True", "TrainerConfig.eval_interval=1000000000",
                "TrainerConfig.num_eval_episodes=5", "TrainerConfig.num_eval_environments=1"] if learn
               else ["TrainerConfig.evaluate=False"])
    if algo == "dqn":
        params += [f"TrainerConfig.initial_collect_steps={WARM_UP}"]
    load_conf(os.path.join(REPO, CONFS[algo]), params)
    trainer = build_trainer(TrainerConfig(root_dir=root))
    start = time.perf_counter()
    trainer.run()
    learn_s = time.perf_counter() - start
    result = dict(steps=trainer.counters.env_steps, learn_s=learn_s)
    if learn:
        with open(os.path.join(root, "eval_log.jsonl")) as log:
            result["score"] = [json.loads(line) for line in log if line.strip()][-1]["average_return"]
    return result


def sb3_env(n_envs: int, seed: int):
    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    env = make_atari_env("ALE/Pong-v5", n_envs=n_envs, seed=seed,
                         env_kwargs=dict(frameskip=1, repeat_action_probability=0.25))
    return VecFrameStack(env, n_stack=4)


def run_sb3(algo: str, steps: int, learn: bool) -> dict:
    if algo == "dqn":
        from stable_baselines3 import DQN

        model = DQN("CnnPolicy", sb3_env(1, 0), learning_rate=1e-4, buffer_size=100_000, learning_starts=WARM_UP,
                    batch_size=32, train_freq=4, gradient_steps=1, target_update_interval=1000,
                    exploration_fraction=0.1, exploration_final_eps=0.01, optimize_memory_usage=False, seed=0,
                    verbose=0, device="cpu")
    else:
        from stable_baselines3 import PPO

        model = PPO("CnnPolicy", sb3_env(8, 0), n_steps=128, n_epochs=4, batch_size=256,
                    learning_rate=lambda f: 2.5e-4 * f, clip_range=lambda f: 0.1 * f, vf_coef=0.5, ent_coef=0.01,
                    seed=0, verbose=0, device="cpu")
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    result = dict(steps=int(model.num_timesteps), learn_s=time.perf_counter() - start)
    if learn:
        from stable_baselines3.common.evaluation import evaluate_policy

        mean, _ = evaluate_policy(model, sb3_env(1, 100), n_eval_episodes=5, deterministic=True)
        result["score"] = float(mean)
    return result


def one(framework: str, algo: str, steps: int, learn: bool) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", framework, algo, str(steps)] + (["--learn"] if learn
                                                                                                else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=6 * 3600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algos", nargs="+", choices=sorted(CONFS), default=["dqn", "ppo"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dqn_steps", type=int, default=3000)
    parser.add_argument("--ppo_steps", type=int, default=3072)
    parser.add_argument("--floor_only", action="store_true")
    parser.add_argument("--learn_steps", type=int, default=0)
    parser.add_argument("--env_only", action="store_true")
    parser.add_argument("--one", nargs=3, metavar=("FRAMEWORK", "ALGO", "STEPS"), help=argparse.SUPPRESS)
    parser.add_argument("--learn", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        framework, algo, steps = args.one
        result = (run_alfish if framework == "alfish" else run_sb3)(algo, int(steps), args.learn)
        print("RESULT " + json.dumps(result), flush=True)
        return
    if args.env_only:
        print("\n".join(env_report(args.repeats)), flush=True)
        return
    for row in floor_report():
        print(row, flush=True)
    if args.floor_only:
        return
    table = ["| algorithm | agent steps | alfish steps/s | SB3 steps/s | alfish / SB3 |", "|---|---|---|---|---|"]
    for algo in args.algos if args.repeats > 0 else []:
        steps = args.dqn_steps if algo == "dqn" else args.ppo_steps
        rates = {"alfish": [], "sb3": []}
        for _ in range(args.repeats):
            for framework in ("alfish", "sb3"):
                result = one(framework, algo, steps, False)
                rates[framework].append(result["steps"] / result["learn_s"])
                print(f"{algo} {framework}: {rates[framework][-1]:.1f} agent steps/s", flush=True)
        a, s = statistics.median(rates["alfish"]), statistics.median(rates["sb3"])
        table.append(f"| {algo} Pong | {steps} | {a:.1f} | {s:.1f} | {a / s:.2f} |")
    if args.repeats > 0:
        print("\n".join(table))
    if args.learn_steps:
        for algo in args.algos:
            scores = {fw: one(fw, algo, args.learn_steps, True)["score"] for fw in ("alfish", "sb3")}
            print(f"{algo} Pong after {args.learn_steps} agent steps: alfish {scores['alfish']:.1f}, "
                  f"SB3 {scores['sb3']:.1f} (mean game score of 5 episodes)", flush=True)


if __name__ == "__main__":
    main()
