"""An alfish conf's hyperparameters in Stable-Baselines3's terms: the peer side of ``validate_confs.py --peer sb3``.

``translate(conf, params)`` parses the conf with gin (as ``alfish.bin.train`` would; nothing is trained) and returns a
``Sb3Job``: SB3's algorithm name, the env, ``n_envs``, the constructor's keyword arguments (with ``policy_kwargs``),
``VecNormalize``'s settings and the evaluation protocol. Every binding the conf makes must be either translated or a
run-bookkeeping one (seeds, budgets, summaries, checkpoints) that does not change what is learned: a binding with no
SB3 counterpart is a one-line ``TranslateError`` naming it, so the peer never runs at silently different settings.

Plain data only (names, numbers, tuples): SB3 is not imported here, so the translation is testable without it.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import pathlib
from typing import Any, Callable, Optional, Sequence

# bindings that change what is run but not what is learned (or that the translation reads itself)
BOOKKEEPING = {
    "TrainerConfig": {"random_seed", "num_iterations", "num_env_steps", "summary_interval", "evaluate",
                      "eval_interval", "num_eval_episodes", "num_eval_environments", "num_checkpoints",
                      "whole_replay_buffer_training", "mini_batch_length", "clear_replay_buffer", "algorithm_ctor",
                      "data_transformer_ctor", "unroll_length", "mini_batch_size", "num_updates_per_train_iter",
                      "replay_buffer_length", "initial_collect_steps", "summarize_first_interval"},
    "Trainer": {"random_warm_up_actions", "num_threads", "stop_value", "progress_log_interval_s",
                "presample_mini_batches"},
    # how alfish runs the same arithmetic (a compiled update, presampled mini-batches): speed, not hyperparameters
    "Learner": {"compile_mode", "compile_scope", "compile_backend"},
    "create_environment": {"env_name", "num_parallel_environments"},
    "ObservationNormalizer": {"clip_value", "update_mode"},
    "RewardNormalizer": {"clip_value", "gamma"},
    "OptimizerConfig": {"max_grad_norm", "eps"},
    "ActorCriticNetworks": {"initial_log_std"},
}
ACTIVATIONS = {"relu": "ReLU", "tanh": "Tanh", "elu": "ELU", "leaky_relu": "LeakyReLU", "gelu": "GELU",
               "silu": "SiLU"}


class TranslateError(Exception):
    """A conf setting SB3 cannot reproduce; one line naming it."""


@dataclasses.dataclass
class Sb3Job:
    """What the SB3 side runs. ``kwargs`` go to SB3's algorithm class; ``activation`` (a ``torch.nn`` class name) and
    ``action_noise_sigma`` (TD3/DDPG: Gaussian noise std in [-1, 1]-scaled action units) are built by the runner."""
    algo: str
    env_name: str
    n_envs: int
    seed: int
    env_steps: int
    eval_every: int  # env steps between evaluations (the conf's eval_interval iterations x env steps per iteration)
    eval_episodes: int
    kwargs: dict
    activation: str
    normalize: Optional[dict] = None  # VecNormalize(**normalize); None: no VecNormalize
    action_noise_sigma: Optional[float] = None


def _settings(fn: Callable, bound: dict) -> dict:
    """``fn``'s parameters: its defaults, overridden by the conf's gin bindings ``bound``."""
    # a class's __init__ (its own signature can be __new__'s: SacAlgorithm picks its mixed-action subclass there)
    signature = inspect.signature(fn.__init__ if isinstance(fn, type) else fn)
    values = {name: p.default for name, p in signature.parameters.items()
              if p.default is not inspect.Parameter.empty}
    values.update(bound)
    return values


def _bindings() -> dict[str, dict]:
    """The parsed conf's bindings by configurable name (``'SacAlgorithm'``); scoped bindings are refused."""
    import gin

    out: dict[str, dict] = {}
    for scope, selector in gin.config._CONFIG:  # gin has no public iterator over bindings
        name = selector.rsplit(".", 1)[-1]
        if scope and name.endswith("Scheduler"):
            continue  # read through the instance the parameter it is bound to resolves to (see _constant, _dqn)
        if scope:
            raise TranslateError(f"scoped bindings ({scope}/{name}: e.g. a scheduler) have no SB3 translation here; "
                                 "train the peer with constant values or extend scripts/sb3_translate.py")
        out[name] = dict(gin.get_bindings(selector))  # references resolved to the classes they name
    return out


def _refuse_unknown(bindings: dict[str, dict], translated: dict[str, set]) -> None:
    for name, values in bindings.items():
        known = BOOKKEEPING.get(name, set()) | translated.get(name, set())
        extra = sorted(set(values) - known)
        if extra:
            raise TranslateError(f"{name}.{extra[0]} has no SB3 translation in scripts/sb3_translate.py; unbind it "
                                 "or add its translation, so that both frameworks run the same hyperparameters")


def _epsilon_schedule(value: Any) -> dict:
    """DQN's exploration in SB3's terms: a constant, or a linear schedule from ``(0, e0)`` to ``(f, e1)`` over the
    run's fraction ``f`` (``progress_type='percent'``) = ``exploration_initial_eps``, ``exploration_final_eps``,
    ``exploration_fraction``."""
    if isinstance(value, (int, float)):
        return dict(exploration_initial_eps=float(value), exploration_final_eps=float(value), exploration_fraction=0.0)
    points, values = list(getattr(value, "points", ())), list(getattr(value, "values", ()))
    if type(value).__name__ != "LinearScheduler" or value.progress_type != "percent" or len(points) != 2 \
            or points[0] != 0:
        raise TranslateError(f"DqnAlgorithm.epsilon_greedy = {value!r}: SB3's exploration is linear from the start "
                             "over a fraction of the run; use LinearScheduler with progress_type 'percent' and "
                             "schedule [(0, e0), (f, e1)]")
    return dict(exploration_initial_eps=float(values[0]), exploration_final_eps=float(values[1]),
                exploration_fraction=float(points[1]))


def _constant(name: str, value: Any) -> float:
    if not isinstance(value, (int, float)):
        raise TranslateError(f"{name} = {value!r} is a schedule; the SB3 peer takes constants only here")
    return float(value)


def _one_lr(algo: str, values: dict, names: Sequence[str]) -> float:
    lrs = {n: _constant(f"{algo}.{n}", values[n]) for n in names}
    if len(set(lrs.values())) != 1:
        raise TranslateError(f"SB3 uses one learning rate for all networks; the conf sets {lrs}")
    return next(iter(lrs.values()))


def _sizes(values: dict, part: str) -> list[int]:
    return list(values.get(f"{part}_hidden_sizes") or values["hidden_sizes"])


def _off_policy_common(values: dict, trainer: dict, warm_up: bool, n_envs: int) -> dict:
    if n_envs != 1:
        raise TranslateError("the off-policy peer translation covers one env (num_parallel_environments = 1)")
    if trainer["initial_collect_steps"] and not warm_up:
        raise TranslateError("SB3 acts uniformly at random before learning_starts; bind "
                             "Trainer.random_warm_up_actions = True for the same warm-up")
    return dict(learning_rate=None, buffer_size=int(trainer["replay_buffer_length"]),
                learning_starts=int(trainer["initial_collect_steps"]), batch_size=int(trainer["mini_batch_size"]),
                tau=_constant("target_update_tau", values["target_update_tau"]), gamma=float(values["gamma"]),
                train_freq=int(trainer["unroll_length"]), gradient_steps=int(trainer["num_updates_per_train_iter"]))


def _sac(values: dict, common: dict) -> tuple[dict, set]:
    kwargs = dict(common, learning_rate=_one_lr("SacAlgorithm", values, ("actor_lr", "critic_lr", "alpha_lr")))
    if values["target_update_period"] != 1:
        kwargs["target_update_interval"] = int(values["target_update_period"])
    if values["ent_coef"] is not None:
        kwargs["ent_coef"] = float(values["ent_coef"])
    else:  # SB3's 'auto_X': learned, starting at alpha X
        kwargs["ent_coef"] = f"auto_{math.exp(float(values['initial_log_alpha'])):g}"
    if values["target_entropy"] is not None:
        kwargs["target_entropy"] = _constant("SacAlgorithm.target_entropy", values["target_entropy"])
    policy = dict(net_arch=dict(pi=_sizes(values, "actor"), qf=_sizes(values, "critic")),
                  n_critics=int(values["num_critics"]))
    if values["use_sde"]:
        kwargs.update(use_sde=True, sde_sample_freq=int(values["sde_sample_freq"]))
        if not values["full_std"]:
            raise TranslateError("SacAlgorithm.full_std = False: SB3's SAC always uses one sigma per (latent unit, "
                                 "action dim)")
        if values["log_std_init"] is not None:
            policy["log_std_init"] = float(values["log_std_init"])
    kwargs["policy_kwargs"] = policy
    return kwargs, {"hidden_sizes", "actor_hidden_sizes", "critic_hidden_sizes", "actor_lr", "critic_lr", "alpha_lr",
                    "gamma", "target_update_tau", "target_update_period", "initial_log_alpha", "target_entropy",
                    "num_critics", "ent_coef", "activation", "use_sde", "sde_sample_freq", "log_std_init",
                    "full_std", "update_order"}  # (SB3's own order is critic-first; sb3_peer.py --update_order: joint)


def _td3(values: dict, common: dict) -> tuple[dict, set]:
    if values["target_update_period"] != 1:
        raise TranslateError("SB3's TD3 updates its targets with the delayed actor; Td3Algorithm.target_update_period "
                             "has no counterpart")
    kwargs = dict(common, learning_rate=_one_lr("Td3Algorithm", values, ("actor_lr", "critic_lr")),
                  policy_delay=int(values["policy_delay"]), target_policy_noise=float(values["target_policy_noise"]),
                  target_noise_clip=float(values["target_noise_clip"]),
                  policy_kwargs=dict(net_arch=dict(pi=_sizes(values, "actor"), qf=_sizes(values, "critic")),
                                     n_critics=int(values["num_critics"])))
    return kwargs, {"hidden_sizes", "actor_hidden_sizes", "critic_hidden_sizes", "actor_lr", "critic_lr", "gamma",
                    "target_update_tau", "target_update_period", "exploration_noise", "num_critics",
                    "target_policy_noise", "target_noise_clip", "policy_delay", "activation",
                    "update_order"}  # (SB3 runs its own, critic-first order; sb3_peer.py --update_order emulates joint)


def _grad_norm(value: Optional[float]) -> float:
    return float("inf") if value is None else float(value)  # alfish: no clipping unless bound; SB3 needs a number


def _ppo(values: dict, trainer: dict, optimizer: dict, networks: dict) -> tuple[dict, set]:
    if values["ortho_init"] is None:
        raise TranslateError("PpoAlgorithm.ortho_init = None (hidden layers at PyTorch's init, outputs orthogonal) has "
                             "no SB3 counterpart; bind it to True or False")
    log_std = values["log_std_init"] if values["use_sde"] and values["log_std_init"] is not None \
        else networks["initial_log_std"]
    clip_vf = values["clip_range_vf"]
    kwargs = dict(learning_rate=_constant("PpoAlgorithm.lr", values["lr"]), n_steps=int(trainer["unroll_length"]),
                  batch_size=int(trainer["mini_batch_size"]), n_epochs=int(trainer["num_updates_per_train_iter"]),
                  gamma=float(values["gamma"]), gae_lambda=float(values["gae_lambda"]),
                  clip_range=_constant("PpoAlgorithm.clip_range", values["clip_range"]),
                  clip_range_vf=None if clip_vf is None else _constant("PpoAlgorithm.clip_range_vf", clip_vf),
                  ent_coef=_constant("PpoAlgorithm.entropy_coef", values["entropy_coef"]),
                  vf_coef=float(values["value_loss_coef"]), normalize_advantage=bool(values["normalize_advantages"]),
                  target_kl=values["target_kl"], use_sde=bool(values["use_sde"]),
                  sde_sample_freq=int(values["sde_sample_freq"]),
                  max_grad_norm=_grad_norm(optimizer["max_grad_norm"]),
                  policy_kwargs=dict(net_arch=dict(pi=list(values["hidden_sizes"]), vf=list(values["hidden_sizes"])),
                                     ortho_init=bool(values["ortho_init"]), log_std_init=float(log_std),
                                     # torch's Adam eps unless the conf binds one (SB3's PPO defaults to 1e-5)
                                     optimizer_kwargs=dict(eps=1e-8 if optimizer["eps"] is None
                                                           else float(optimizer["eps"]))))
    if values["use_sde"]:
        kwargs["policy_kwargs"]["full_std"] = bool(values["full_std"])
    return kwargs, {"hidden_sizes", "activation", "lr", "gamma", "gae_lambda", "clip_range", "value_loss_coef",
                    "entropy_coef", "normalize_advantages", "clip_range_vf", "target_kl", "ortho_init", "use_sde",
                    "sde_sample_freq", "log_std_init", "full_std"}


def _dqn(values: dict, trainer: dict, optimizer: dict, n_envs: int) -> tuple[dict, set]:
    for name, wanted, why in (("double_q", False, "SB3's DQN has no double-Q targets"),
                              ("n_step", 1, "SB3's DQN uses 1-step returns"),
                              ("huber_loss", True, "SB3's DQN uses the Huber loss")):
        if values[name] != wanted:
            raise TranslateError(f"DqnAlgorithm.{name} = {values[name]!r}: {why}; bind it to {wanted!r} for the peer")
    env_steps_per_update = int(trainer["unroll_length"]) * n_envs / int(trainer["num_updates_per_train_iter"])
    target_every = values["target_update_period"] * env_steps_per_update  # SB3 counts env steps
    if target_every != int(target_every):
        raise TranslateError(f"the target update every {values['target_update_period']} updates is "
                             f"{target_every} env steps; SB3 counts whole env steps")
    policy = dict(net_arch=list(values["hidden_sizes"]))
    if optimizer["eps"] is not None:
        policy["optimizer_kwargs"] = dict(eps=float(optimizer["eps"]))
    kwargs = dict(learning_rate=_constant("DqnAlgorithm.lr", values["lr"]),
                  buffer_size=int(trainer["replay_buffer_length"]),
                  # alfish's DQN warms up with its epsilon-greedy policy (epsilon starts at 1 in the confs); SB3
                  # acts uniformly before learning_starts
                  learning_starts=int(trainer["initial_collect_steps"]), batch_size=int(trainer["mini_batch_size"]),
                  tau=_constant("DqnAlgorithm.target_update_tau", values["target_update_tau"]),
                  gamma=float(values["gamma"]), train_freq=int(trainer["unroll_length"]),
                  gradient_steps=int(trainer["num_updates_per_train_iter"]), target_update_interval=int(target_every),
                  max_grad_norm=_grad_norm(optimizer["max_grad_norm"]), policy_kwargs=policy,
                  **_epsilon_schedule(values["epsilon_greedy"]))
    return kwargs, {"hidden_sizes", "activation", "lr", "gamma", "n_step", "double_q", "target_update_period",
                    "target_update_tau", "epsilon_greedy", "huber_loss"}


def _normalize(trainer: dict, bindings: dict, gamma: float) -> Optional[dict]:
    names = [getattr(c, "__name__", str(c)) for c in (trainer["data_transformer_ctor"] or [])]
    unknown = sorted(set(names) - {"ObservationNormalizer", "RewardNormalizer"})
    if unknown:
        raise TranslateError(f"the data transformer {unknown[0]} has no SB3 translation (VecNormalize covers "
                             "ObservationNormalizer and RewardNormalizer)")
    if not names:
        return None
    from alfish.transforms.normalizers import ObservationNormalizer, RewardNormalizer

    obs = _settings(ObservationNormalizer, bindings.get("ObservationNormalizer", {}))
    reward = _settings(RewardNormalizer, bindings.get("RewardNormalizer", {}))
    if "ObservationNormalizer" in names and obs["update_mode"] != "rollout":
        raise TranslateError("VecNormalize updates its statistics from the rollout; bind "
                             "ObservationNormalizer.update_mode = 'rollout'")
    if "RewardNormalizer" in names and reward.get("gamma") is None:
        raise TranslateError("VecNormalize scales rewards by the discounted return's std; bind RewardNormalizer.gamma "
                             "to the algorithm's gamma for the same scaling")
    return dict(norm_obs="ObservationNormalizer" in names, norm_reward="RewardNormalizer" in names,
                clip_obs=float(obs["clip_value"] or math.inf), clip_reward=float(reward["clip_value"]), gamma=gamma)


def translate(conf: pathlib.Path, params: Sequence[str] = ()) -> Sb3Job:
    """The SB3 job that trains ``conf`` (with the extra gin ``params``) at the same hyperparameters."""
    from alfish.config import TrainerConfig, load_conf
    from alfish.envs.batched_env import create_environment
    from alfish.learn.optim import OptimizerConfig

    load_conf(str(conf), list(params))
    bindings = _bindings()
    trainer = _settings(TrainerConfig, bindings.get("TrainerConfig", {}))
    env = _settings(create_environment, bindings.get("create_environment", {}))
    algorithm = trainer["algorithm_ctor"]
    values = _settings(algorithm, bindings.get(algorithm.__name__, {}))
    n_envs = int(env["num_parallel_environments"])
    warm_up = bool(bindings.get("Trainer", {}).get("random_warm_up_actions", False))
    optimizer = _settings(OptimizerConfig, bindings.get("OptimizerConfig", {}))
    noise = None
    if algorithm.__name__ == "SacAlgorithm":
        algo, (kwargs, used) = "SAC", _sac(values, _off_policy_common(values, trainer, warm_up, n_envs))
    elif algorithm.__name__ == "Td3Algorithm":
        algo, (kwargs, used) = "TD3", _td3(values, _off_policy_common(values, trainer, warm_up, n_envs))
        noise = _constant("Td3Algorithm.exploration_noise", values["exploration_noise"])
    elif algorithm.__name__ == "PpoAlgorithm":
        from alfish.algorithms.actor_critic import ActorCriticNetworks

        networks = _settings(ActorCriticNetworks, bindings.get("ActorCriticNetworks", {}))
        algo, (kwargs, used) = "PPO", _ppo(values, trainer, optimizer, networks)
    elif algorithm.__name__ == "DqnAlgorithm":
        algo, (kwargs, used) = "DQN", _dqn(values, trainer, optimizer, n_envs)
    else:
        raise TranslateError(f"{algorithm.__name__}: the SB3 peer translates SacAlgorithm, Td3Algorithm, "
                             "PpoAlgorithm and DqnAlgorithm confs")
    if algo in ("SAC", "TD3") and bindings.get("OptimizerConfig"):
        raise TranslateError("OptimizerConfig bindings are translated for PPO and DQN only (SB3's SAC and TD3 use "
                             "torch's Adam defaults)")
    _refuse_unknown(bindings, {algorithm.__name__: used})
    per_iteration = int(trainer["unroll_length"]) * n_envs
    return Sb3Job(algo=algo, env_name=env["env_name"], n_envs=n_envs, seed=int(trainer["random_seed"]),
                  env_steps=int(trainer["num_env_steps"]), eval_every=int(trainer["eval_interval"]) * per_iteration,
                  eval_episodes=int(trainer["num_eval_episodes"]), kwargs=kwargs,
                  activation=ACTIVATIONS[values["activation"]],
                  normalize=_normalize(trainer, bindings, float(values["gamma"])), action_noise_sigma=noise)
