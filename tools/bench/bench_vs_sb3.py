"""alfish against Stable-Baselines3 (and SBX) in the same run, at the same hyperparameters.

    python tools/bench/bench_vs_sb3.py [--algos sac td3 ...] [--repeats 3] [--threads 0 1] [--learn]
                                       [--peers sb3 sbx --sbx_python .sbx/bin/python]

Peers: Stable-Baselines3 (``sb3``, the default) and SBX (``sbx``: Stable-Baselines in JAX, SB3's algorithms with
JAX networks and XLA-compiled updates). SBX pulls jax, so it lives in its own virtual environment, never in alfish's
installs; ``--sbx_python`` names that environment's python:
    python -m venv .sbx && .sbx/bin/pip install torch==2.13.0 sbx-rl
SBX is timed after its JIT warm-up (``run_one.py``: an untimed ``learn`` first, so compile time is left out); it has
no A2C (its cell is empty). SBX's DQN is uniform replay, single Q and no gradient clipping: every dqn row compares
against that one algorithm.

Throughput: each framework trains ``--throughput_steps`` env steps without evaluation, in a fresh process, alternating
alfish/SB3 ``--repeats`` times; the median env steps/s and the ratio alfish/SB3 are printed, once per thread setting
of ``--threads``: 0 = each framework at its default (alfish: the conf's ``Trainer.num_threads``, ``'auto'`` unless a
conf pins it; SB3: torch's default, one thread per core), N = both at N torch threads. A markdown table of every
(algorithm, setting) closes the output.
Learning (``--learn``): one full run each with a deterministic 5-episode evaluation every ``eval_every`` env steps:
wall-clock to the first evaluation at or above the threshold, and the final evaluation return.
  * SAC on Pendulum-v1 at RL Zoo's hyperparameters (lr 1e-3, batch 256, 256x256, 1 gradient step per env step),
    20k env steps, threshold -200. Identical hyperparameters on both sides; this is also the RL Zoo tuned conf.
  * PPO on CartPole-v1: 8 envs, n_steps 32, batch 256, 20 epochs, GAE 0.8, gamma 0.98. Throughput at identical
    (constant lr 1e-3, clip 0.2) settings; learning with alfish's conf vs RL Zoo's tuned conf (linear schedules).
  * TD3 / DDPG on Pendulum-v1 (confs/td3_pendulum.gin, confs/ddpg_pendulum.gin: lr 1e-3, batch 256, 256x256,
    gamma 0.98, Gaussian noise 0.1, 1000 warm-up steps, 1 gradient step per env step), 20k env steps.
  * DQN on CartPole-v1 (confs/dqn_cartpole.gin, RL Zoo's hyperparameters) against SB3's DQN, 50k env steps:
    with prioritized replay and double Q (dqn, the conf), uniform replay (dqn_noper), and uniform replay without
    double Q (dqn_plain: the algorithm SB3's DQN computes; it has neither option).
  Learning also prints the evaluation returns of both at equal env steps and their mean over the run's last quarter.
Also prints the SAC update's FLOP floor (tools/bench/sac_update_floor.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = {
    "sac": dict(throughput_steps=2000, learn_steps=20000, eval_every=1000, threshold=-200.0),
    "ppo": dict(throughput_steps=20480, learn_steps=100000, eval_every=5120, threshold=475.0),
    # issue 3's algorithms (throughput only; their confs pin Trainer.num_threads=1, so run with --threads 1)
    "td3": dict(throughput_steps=3000, learn_steps=20000, eval_every=1000, threshold=-200.0),
    "ddpg": dict(throughput_steps=3000, learn_steps=20000, eval_every=1000, threshold=-200.0),
    "dqn": dict(throughput_steps=10240, learn_steps=50000, eval_every=5120, threshold=475.0),
    "dqn_noper": dict(throughput_steps=10240, learn_steps=50000, eval_every=5120, threshold=475.0),
    "dqn_plain": dict(throughput_steps=10240, learn_steps=50000, eval_every=5120, threshold=475.0),
    # A2C on CartPole-v1 (confs/a2c_cartpole.gin: 8 envs, 8 steps per update, Adam on both sides)
    "a2c": dict(throughput_steps=40960, learn_steps=300000, eval_every=20480, threshold=475.0),
}


#: Algorithms SBX has (``run_one.py`` builds them at the same hyperparameters as SB3's).
SBX_ALGOS = ("sac", "td3", "ddpg", "dqn", "dqn_noper", "dqn_plain", "ppo")
#: The python of each framework's environment (``--sbx_python`` sets SBX's).
PYTHON = {"alfish": sys.executable, "sb3": sys.executable, "sbx": None}


#: Extra gin bindings for alfish's runs (``--alfish_param``), e.g. a compile mode to measure.
ALFISH_PARAMS: list[str] = []
#: ``--compiled``: an "alfish_compiled" column, alfish with the whole update compiled (``Learner.compile_scope``'s CPU
#: default) and, where an iteration runs many updates from a replay buffer, its mini-batches presampled and its
#: updates run as one compiled scan (``Learner.scan_updates``).
COMPILED_PARAMS = ["Learner.compile_mode='default'"]
PRESAMPLED_PARAMS = ["Trainer.presample_mini_batches=True", "Learner.scan_updates=True"]
PRESAMPLED = ("dqn", "dqn_noper", "dqn_plain")
#: A2C builds its loss while unrolling (on-policy with gradients): nothing to compile (the Learner refuses it).
NOT_COMPILED = ("a2c",)
VARIANTS: list[str] = ["alfish"]  # the alfish columns: "alfish", and "alfish_compiled" with --compiled


def run(framework: str, algo: str, steps: int, setting: str = "identical", eval_every: int = 0,
        threads: int = 0) -> dict:
    params = list(ALFISH_PARAMS)
    if framework == "alfish_compiled":
        framework = "alfish"
        params += COMPILED_PARAMS + (PRESAMPLED_PARAMS if algo in PRESAMPLED else [])
    cmd = [PYTHON[framework], os.path.join(HERE, "run_one.py"), "--framework", framework, "--algo", algo,
           "--steps", str(steps), "--setting", setting, "--eval_every", str(eval_every), "--threads", str(threads)]
    if framework == "alfish":
        cmd += [arg for param in params for arg in ("--param", param)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")


def time_to_threshold(evals: list, threshold: float) -> float | None:
    for _, elapsed, ret in evals:
        if ret >= threshold:
            return elapsed
    return None


def returns_at_equal_env_steps(alfish: list, peer: list) -> list[tuple[int, float, float]]:
    """Pair each of the peer's evaluations with alfish's evaluation at the nearest env-step count (within 5%)."""
    pairs = []
    for steps, _, peer_return in peer:
        if not alfish:
            break
        near = min(alfish, key=lambda e: abs(e[0] - steps))
        if abs(near[0] - steps) <= 0.05 * steps:
            pairs.append((steps, near[2], peer_return))
    return pairs


def check_sbx_python(path: str | None) -> str:
    """The SBX environment's python, or a one-line error that says how to make one."""
    if not path or not os.path.isfile(path):
        raise SystemExit(f"--peers sbx needs --sbx_python, the python of a virtual environment with SBX "
                         f"({'not given' if not path else f'{path} does not exist'}): python -m venv .sbx && "
                         ".sbx/bin/pip install torch==2.13.0 sbx-rl, then --sbx_python .sbx/bin/python")
    return path


def measure_throughput(algo: str, peers: list[str], threads: int, repeats: int) -> dict[str, float]:
    """Median env steps/s per framework over ``repeats`` runs, alternating the frameworks; prints them."""
    peer_names = [p for p in peers if p != "sbx" or algo in SBX_ALGOS]
    frameworks = [v for v in VARIANTS if v != "alfish_compiled" or algo not in NOT_COMPILED] + peer_names
    rates = {fw: [] for fw in frameworks}
    compile_s: list[float] = []
    steps = SPEC[algo]["throughput_steps"]
    for _ in range(repeats):
        for fw in frameworks:
            r = run(fw, algo, steps, threads=threads)
            # compiled: timed after compiling, as SBX after its JIT warm-up (the compile time is printed)
            compiling = r.get("compile_s", 0.0) if fw == "alfish_compiled" else 0.0
            compile_s += [compiling] if fw == "alfish_compiled" else []
            rates[fw].append(r["steps"] / (r["learn_s"] - compiling))
    med = {fw: statistics.median(v) for fw, v in rates.items()}
    setting = setting_name(threads)
    figures = "  ".join(f"{fw} {med[fw]:.0f}" for fw in frameworks)
    ratios = "  ".join(f"{variant}/{fw} {med[variant] / med[fw]:.2f}" for variant in VARIANTS if variant in med
                       for fw in peer_names)
    if compile_s:
        ratios += f"  (alfish_compiled: compile time {[round(x, 1) for x in compile_s]} s, left out)"
    every = ", ".join(f"{fw} {[round(x) for x in v]}" for fw, v in rates.items())
    print(f"[{algo}, {setting}] env steps/s over {steps} steps, median of {repeats}: {figures}  {ratios}  "
          f"(all: {every})" + ("  (SBX after its JIT warm-up)" if "sbx" in frameworks else ""), flush=True)
    return med


def setting_name(threads: int) -> str:
    return "default threads" if threads == 0 else f"{threads} thread{'s' if threads > 1 else ''} each"


def compare_learning(algo: str, peers: list[str], threads: int, summary: dict) -> None:
    """One full run each (alfish's conf, each peer's tuned setting): time to the threshold, final return, the returns
    at equal env steps; printed and put in ``summary``."""
    spec = SPEC[algo]
    frameworks = ["alfish"] + [p for p in peers if p != "sbx" or algo in SBX_ALGOS]
    res = {fw: run(fw, algo, spec["learn_steps"], "tuned", spec["eval_every"], threads) for fw in frameworks}
    for fw, r in res.items():
        ttt = time_to_threshold(r["evals"], spec["threshold"])
        final = r["evals"][-1][2] if r["evals"] else float("nan")
        print(f"[{algo}] {fw}: {r['steps']} env steps in {r['learn_s']:.0f}s; first eval >= "
              f"{spec['threshold']:g} at {'never' if ttt is None else f'{ttt:.0f}s'}; final eval return "
              f"{final:.1f}; evals {[(s, round(t), round(v, 1)) for s, t, v in r['evals']]}", flush=True)
        summary[f"{fw}_time_to_threshold_s"] = ttt
        summary[f"{fw}_final_return"] = final
    for peer in frameworks[1:]:
        same_steps = returns_at_equal_env_steps(res["alfish"]["evals"], res[peer]["evals"])
        print(f"[{algo}] eval return at equal env steps (env steps: alfish, {peer}): "
              f"{[(s, round(a, 1), round(b, 1)) for s, a, b in same_steps]}", flush=True)
        if same_steps:
            tail = same_steps[-max(1, len(same_steps) // 4):]  # the last quarter of the run
            mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
            print(f"[{algo}] mean eval return over the last quarter: alfish {mean([x[1] for x in tail]):.1f}, "
                  f"{peer} {mean([x[2] for x in tail]):.1f}", flush=True)
        summary["returns_at_equal_env_steps" + ("" if peer == "sb3" else f"_{peer}")] = same_steps
        a, b = summary["alfish_time_to_threshold_s"], summary[f"{peer}_time_to_threshold_s"]
        if a is not None and b is not None:
            print(f"[{algo}] wall-clock to threshold, alfish/{peer}: {a / b:.2f}", flush=True)


def table(rows: list[tuple[str, str, dict[str, float]]], peers: list[str]) -> str:
    """The markdown table of every (algorithm, threads, medians): env steps/s per framework and alfish's ratios."""
    names = {"sb3": "SB3", "sbx": "SBX", "alfish": "alfish", "alfish_compiled": "alfish compiled"}
    head = ["algorithm", "threads"] + [f"{names[v]} env steps/s" for v in VARIANTS] + \
        [f"{names[p]} env steps/s" for p in peers] + [f"{names[v]} / {names[p]}" for v in VARIANTS for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for algo, setting, med in rows:
        cells = [algo, setting] + [f"{med[v]:.0f}" if v in med else "" for v in VARIANTS] + \
            [f"{med[p]:.0f}" if p in med else "" for p in peers] + \
            [f"{med[v] / med[p]:.2f}" if p in med and v in med else "" for v in VARIANTS for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=list(SPEC), choices=list(SPEC),
                        help="dqn: with prioritized replay (SB3's DQN has none); dqn_noper: uniform replay; "
                             "dqn_plain: uniform replay, no double Q (what SB3's DQN computes)")
    parser.add_argument("--repeats", type=int, default=3, help="throughput runs per framework (0: skip)")
    parser.add_argument("--learn", action="store_true", help="also run the full learning comparison")
    parser.add_argument("--threads", type=int, nargs="+", default=[0],
                        help="thread settings to measure: 0 = each framework's default, N = both at N torch threads "
                             "(SBX: 0 or 1); --learn uses the first")
    parser.add_argument("--peers", nargs="+", default=["sb3"], choices=["sb3", "sbx"],
                        help="the frameworks alfish is timed against (default: sb3)")
    parser.add_argument("--sbx_python", default=os.environ.get("ALFISH_SBX_PYTHON"),
                        help="the python of SBX's own virtual environment (default: $ALFISH_SBX_PYTHON)")
    parser.add_argument("--compiled", action="store_true",
                        help="also time alfish with the whole update compiled (and DQN's mini-batches presampled, "
                             "its 128 updates one scan), "
                             "compile time left out as SBX's JIT warm-up is")
    parser.add_argument("--alfish_param", action="append", default=[],
                        help="an extra gin binding for alfish's runs (repeatable), e.g. "
                             "\"Learner.compile_mode='default'\"")
    args = parser.parse_args()
    ALFISH_PARAMS.extend(args.alfish_param)
    if args.compiled:
        VARIANTS.append("alfish_compiled")
    if args.alfish_param:
        print(f"alfish runs with {args.alfish_param}", flush=True)
    if "sbx" in args.peers:
        PYTHON["sbx"] = check_sbx_python(args.sbx_python)
        if any(t not in (0, 1) for t in args.threads):
            parser.error(f"--threads {' '.join(map(str, args.threads))}: SBX (XLA on the CPU) runs at its default "
                         "threads (0) or at 1")
    summary, rows = {}, []
    for algo in args.algos:
        summary[algo] = {}
        for threads in args.threads if args.repeats > 0 else []:
            med = measure_throughput(algo, args.peers, threads, args.repeats)
            setting = setting_name(threads)
            summary[algo][setting] = dict(steps_per_s=med, **{
                ("ratio" if peer == "sb3" else f"ratio_{peer}"): med["alfish"] / med[peer]
                for peer in args.peers if peer in med})
            rows.append((algo, setting, med))
        if args.learn:
            compare_learning(algo, args.peers, args.threads[0], summary[algo])
    if rows:
        print("\n" + table(rows, args.peers), flush=True)
    if "sac" in args.algos:
        cmd = [sys.executable, os.path.join(HERE, "sac_update_floor.py")]
        if args.threads[0]:
            cmd += ["--threads", str(args.threads[0])]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        print(out.stdout.splitlines()[0] if out.returncode == 0 else out.stderr[-2000:], flush=True)
    print("SUMMARY " + json.dumps(summary))


if __name__ == "__main__":
    main()
