"""TrainerConfig's summary switches (debug_summaries, summarize_grads_and_vars, summarize_action_distributions,
summarize_output, summarize_gradient_noise_scale, update_counter_every_mini_batch): each one's tags appear in
TensorBoard when it is on and not when it is off; the values make sense (PPO's clip fraction in [0, 1] and KL >= 0,
explained variance <= 1, the gradient noise scale near the truth on a problem where it is known); with the global
counter per mini-batch the TensorBoard steps are update counts; and an iteration without a summary makes exactly the
host syncs it makes with every switch off (``SyncCounter``)."""
from __future__ import annotations

import contextlib
import math

import gin
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from alfish.algorithms.base import Algorithm
from alfish.algorithms.debug_stats import explained_variance, masked_stats
from alfish.config import TrainerConfig, load_conf
from alfish.data.types import AlgStep, LossInfo
from alfish.learn.diagnostics import Diagnostics, GradientNoiseScale, gradient_noise_estimates
from alfish.learn.learner import Learner, term_tag
from alfish.learn.sync_debug import SyncCounter
from alfish.trainer.summary import GlobalStep, Summaries
from tests.integration.inprocess import OFF_POLICY_POINT_GOAL, eval_log, run_trainer_from_text

pytestmark = pytest.mark.timeout(120)

SWITCHES = ("debug_summaries", "summarize_grads_and_vars", "summarize_action_distributions", "summarize_output",
            "summarize_gradient_noise_scale")
# The tags each switch adds (scalars and histograms).
OWNS = {"debug_summaries": ("debug/",), "summarize_grads_and_vars": ("vars/", "grads/"),
        "summarize_action_distributions": ("action/",), "summarize_output": ("output/",),
        "summarize_gradient_noise_scale": ("gns/",)}

QUICK = """
TrainerConfig.num_env_steps = 0
TrainerConfig.num_iterations = 8
TrainerConfig.initial_collect_steps = 40
TrainerConfig.mini_batch_size = 32
TrainerConfig.summary_interval = 4
TrainerConfig.summarize_first_interval = False
TrainerConfig.evaluate = False
"""
SAC = (OFF_POLICY_POINT_GOAL + QUICK
       + "TrainerConfig.algorithm_ctor = @SacAlgorithm\nSacAlgorithm.hidden_sizes = (16,)\n")
CONFS = {
    "sac": SAC,
    "td3": OFF_POLICY_POINT_GOAL + QUICK + "TrainerConfig.algorithm_ctor = @Td3Algorithm\n"
                                           "DdpgAlgorithm.hidden_sizes = (16,)\n",
    "iql": OFF_POLICY_POINT_GOAL + QUICK + "TrainerConfig.algorithm_ctor = @IqlAlgorithm\n"
                                           "IqlAlgorithm.hidden_sizes = (16,)\n",
    "dqn": OFF_POLICY_POINT_GOAL + QUICK + "create_environment.env_name = 'alfish/Chain-v0'\n"
                                           "TrainerConfig.algorithm_ctor = @DqnAlgorithm\n"
                                           "DqnAlgorithm.hidden_sizes = (16,)\n",
    "ppo": """
create_environment.env_name = 'alfish/Chain-v0'
create_environment.num_parallel_environments = 4
PpoAlgorithm.hidden_sizes = (16,)
PpoAlgorithm.lr = 3e-3
TrainerConfig.algorithm_ctor = @PpoAlgorithm
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 4
TrainerConfig.unroll_length = 16
TrainerConfig.whole_replay_buffer_training = True
TrainerConfig.clear_replay_buffer = True
TrainerConfig.replay_buffer_length = 17
TrainerConfig.mini_batch_size = 16
TrainerConfig.mini_batch_length = 1
TrainerConfig.num_updates_per_train_iter = 4
TrainerConfig.summary_interval = 2
TrainerConfig.summarize_first_interval = False
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 0
""",
    "a2c": """
create_environment.env_name = 'CartPole-v1'
create_environment.num_parallel_environments = 4
A2cAlgorithm.hidden_sizes = (16,)
TrainerConfig.algorithm_ctor = @A2cAlgorithm
TrainerConfig.random_seed = 0
TrainerConfig.num_iterations = 4
TrainerConfig.unroll_length = 8
TrainerConfig.summary_interval = 2
TrainerConfig.summarize_first_interval = False
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 0
""",
}
STEPS_PER_ENV = {"ppo": 16, "a2c": 8}
STAT3 = ("mean", "min", "max")
DEBUG_TAGS = {
    "sac": {f"debug/{x}.{s}" for x in ("q", "td_target", "entropy") for s in STAT3}
    | {"debug/alpha", "debug/target_entropy"},
    "td3": {f"debug/{x}.{s}" for x in ("q", "td_target") for s in STAT3},
    "dqn": {f"debug/{x}.{s}" for x in ("q", "td_target") for s in STAT3},
    "iql": {f"debug/{x}.{s}" for x in ("q", "td_target") for s in STAT3}
    | {f"debug/{x}.{s}" for x in ("advantage", "weight") for s in ("mean", "std", "min", "max")},
    "ppo": {"debug/advantage.mean", "debug/advantage.std", "debug/explained_variance"},
    "a2c": {"debug/advantage.mean", "debug/advantage.std", "debug/explained_variance"},
}


def tensorboard(root) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list]]:
    """``(scalars, histograms)`` of ``root/tb``: tag -> [(step, value)], tag -> [HistogramEvent]."""
    acc = EventAccumulator(str(root / "tb"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in tags["scalars"]}
    return scalars, {tag: acc.Histograms(tag) for tag in tags["histograms"]}


def owned(tags, switch: str) -> set[str]:
    return {tag for tag in tags if tag.startswith(OWNS[switch])}


@contextlib.contextmanager
def built(tmp_path, conf_text: str, params=()):
    """A trainer assembled from ``conf_text`` (+ ``params``), started and warmed up, closed afterwards."""
    from alfish.trainer.build import build_trainer

    tmp_path.mkdir(parents=True, exist_ok=True)
    conf = tmp_path / "conf.gin"
    conf.write_text(conf_text)
    load_conf(str(conf), list(params))
    trainer = build_trainer(TrainerConfig(root_dir=str(tmp_path / "root")))
    try:
        trainer._restore_or_start()
        trainer._warm_up()
        yield trainer
    finally:
        trainer.close()
        gin.clear_config()


def iterate(trainer, name: str) -> None:
    """One iteration of the loop's training part (collect and train), counted."""
    trainer.training.run(STEPS_PER_ENV.get(name, 1))
    trainer.counters.iteration += 1


# ------------------------------------------------------------------------------------------ each switch in TB ----
@pytest.mark.parametrize("switch", SWITCHES)
def test_a_switch_writes_its_tags_and_no_other(tmp_path, switch):
    scalars, histograms = tensorboard(run_trainer_from_text(tmp_path, SAC, [f"TrainerConfig.{switch} = True"]))
    tags = set(scalars) | set(histograms)
    expected = {
        "debug_summaries": DEBUG_TAGS["sac"],
        "summarize_grads_and_vars": {"vars/actor.0.weight.norm", "grads/actor.0.weight.norm", "vars/log_alpha",
                                     "grads/log_alpha", "vars/critics.weights.0", "grads/critics.weights.0"},
        "summarize_action_distributions": {"action/dim0", "action/dim0.mean", "action/dim0.std"},
        "summarize_output": {f"output/{net}.{s}" for net in ("actor", "critics", "target_critics")
                             for s in ("mean", "std", "min", "max")},
        "summarize_gradient_noise_scale": {"gns/simple", "gns/grad_norm_sq", "gns/noise_trace"},
    }[switch]
    assert expected <= tags, sorted(tags)
    for other in SWITCHES:
        if other != switch:
            assert not owned(tags, other), (other, sorted(owned(tags, other)))
    for tag in owned(scalars, switch):  # written at the summaries only (iterations 4 and 8), all finite
        assert [step for step, _ in scalars[tag]] == [4, 8], tag
        assert all(math.isfinite(value) for _, value in scalars[tag]), (tag, scalars[tag])
    if switch == "summarize_grads_and_vars":  # histograms: the parameter's values
        assert [e.step for e in histograms["vars/log_alpha"]] == [4, 8]
        # 2 critics x (1 observation + 1 action) x 16 hidden units
        assert histograms["vars/critics.weights.0"][-1].histogram_value.num == 2 * 2 * 16
    if switch == "summarize_action_distributions":  # one sampled mini-batch's actions in the env's bounds [-1, 1]
        hist = histograms["action/dim0"][-1].histogram_value
        assert 0 < hist.num <= 2 * 32 and -1.0 <= hist.min <= hist.max <= 1.0
    if switch == "summarize_gradient_noise_scale":
        assert scalars["gns/simple"][-1][1] == pytest.approx(scalars["gns/noise_trace"][-1][1]
                                                              / scalars["gns/grad_norm_sq"][-1][1], rel=1e-4)


def test_every_switch_off_writes_none_of_their_tags(tmp_path):
    scalars, histograms = tensorboard(run_trainer_from_text(tmp_path, SAC))
    assert "loss/total" in scalars
    for switch in SWITCHES:
        assert not owned(set(scalars) | set(histograms), switch), switch


def test_discrete_action_distributions_count_each_action(tmp_path):
    scalars, histograms = tensorboard(run_trainer_from_text(
        tmp_path, CONFS["ppo"], ["TrainerConfig.summarize_action_distributions = True"]))
    frequencies = {tag: values for tag, values in scalars.items() if tag.startswith("action/frequency.")}
    assert set(frequencies) == {"action/frequency.0", "action/frequency.1"}  # Chain-v0: two actions
    for i in range(len(frequencies["action/frequency.0"])):
        assert sum(values[i][1] for values in frequencies.values()) == pytest.approx(1.0)
    hist = histograms["action/discrete"][-1].histogram_value
    # this iteration's rollout: 4 envs x 15 trained steps (the newest only bootstraps), without LAST steps
    assert 0 < hist.num <= 4 * 15 and hist.min >= 0 and hist.max <= 1


# ---------------------------------------------------------------------------------- debug terms per algorithm ----
@pytest.mark.parametrize("name", list(CONFS))
def test_debug_terms_of_each_algorithm_only_when_on(tmp_path, name):
    with built(tmp_path, CONFS[name], ["TrainerConfig.debug_summaries = True"]) as trainer:
        assert trainer.algorithm.debug_summaries  # set at assembly from the config
        for _ in range(2):
            iterate(trainer, name)
        summary = trainer.learner.summary()
        debug = {tag for tag in summary if tag.startswith("debug/")}
        assert debug == DEBUG_TAGS[name]
        assert all(math.isfinite(float(summary[tag])) for tag in debug), {t: float(summary[t]) for t in debug}
        if name in ("ppo", "a2c"):
            assert float(summary["debug/explained_variance"]) <= 1.0
            assert float(summary["debug/advantage.std"]) >= 0.0
        if name == "ppo":  # after the first epoch the policy moved: a KL and a clip fraction to check
            assert float(summary["loss/approx_kl"]) >= 0.0
            assert 0.0 <= float(summary["loss/clip_fraction"]) <= 1.0
        if name in ("sac", "td3", "dqn", "iql"):
            for x in ("q", "td_target"):
                assert float(summary[f"debug/{x}.min"]) <= float(summary[f"debug/{x}.mean"]) <= float(
                    summary[f"debug/{x}.max"])
        trainer.algorithm.debug_summaries = False
        iterate(trainer, name)
        assert not [tag for tag in trainer.learner.summary() if tag.startswith("debug/")]


def test_debug_summaries_are_off_by_default(tmp_path):
    with built(tmp_path, CONFS["dqn"]) as trainer:
        assert trainer.algorithm.debug_summaries is False
        iterate(trainer, "dqn")
        assert not [tag for tag in trainer.learner.summary() if tag.startswith("debug/")]


def test_debug_statistics_by_hand():
    x = torch.tensor([[1.0, 2.0, 30.0], [3.0, 4.0, -50.0]])  # [E=2, N=3]; sample 2 is masked out
    valid = torch.tensor([1.0, 1.0, 0.0])
    stats = {k: float(v) for k, v in masked_stats("q", x, valid, ("mean", "std", "min", "max")).items()}
    assert stats == pytest.approx({"debug/q.mean": 2.5, "debug/q.std": math.sqrt(1.25), "debug/q.min": 1.0,
                                   "debug/q.max": 4.0})
    assert all(math.isnan(float(v)) for v in masked_stats("q", x, torch.zeros(3)).values())
    target = torch.tensor([1.0, 2.0, 3.0, 4.0, 100.0])
    some = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])
    assert float(explained_variance(target, target, some)) == pytest.approx(1.0)
    assert float(explained_variance(torch.full((5,), 2.5), target, some)) == pytest.approx(0.0)
    # a prediction off by [1, -1, 1, -1]: Var 1 against Var[target] 1.25
    assert float(explained_variance(target + torch.tensor([1.0, -1, 1, -1, 7]), target, some)) == pytest.approx(0.2)
    assert math.isnan(float(explained_variance(target, torch.ones(5), some)))


def test_term_tags():
    assert term_tag("critic_loss") == "loss/critic_loss"
    assert term_tag("offline/critic_loss") == "loss/offline/critic_loss"
    assert term_tag("debug/q.mean") == "debug/q.mean"
    assert term_tag("offline/debug/q.mean") == "debug/offline/q.mean"  # a hybrid loss's offline part
    assert term_tag("notdebug/x") == "loss/notdebug/x"


# ------------------------------------------------------------------------------------------- network outputs ----
def test_on_policy_outputs_come_from_the_unroll_and_the_hooks_are_removed(tmp_path):
    with built(tmp_path, CONFS["a2c"], ["TrainerConfig.summarize_output = True",
                                        "TrainerConfig.summary_interval = 1"]) as trainer:
        iterate(trainer, "a2c")
        summary = trainer.learner.summary()
        assert {f"output/net.{net}.{s}" for net in ("policy", "value_net") for s in ("mean", "std", "min", "max")
                } == {tag for tag in summary if tag.startswith("output/")}
        assert (float(summary["output/net.policy.min"]) <= float(summary["output/net.policy.mean"])
                <= float(summary["output/net.policy.max"]))
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in trainer.algorithm.modules())
        assert not [tag for tag in trainer.learner.summary() if tag.startswith("output/")]  # reported once


# ------------------------------------------------------------------------------------- gradient noise scale ----
def test_gradient_noise_estimates_by_hand():
    # |G_small|^2 = 5 at B_small = 1, |G_big|^2 = 2 at B_big = 4:
    # |G|^2 = (4 * 2 - 1 * 5) / 3 = 1, tr(Sigma) = (5 - 2) / (1 - 1/4) = 4
    assert gradient_noise_estimates(5.0, 2.0, 1, 4) == pytest.approx((1.0, 4.0))
    with pytest.raises(ValueError, match="B_small < B_big"):
        gradient_noise_estimates(5.0, 2.0, 4, 4)
    gns = GradientNoiseScale(decay=0.5)
    assert gns.summary() == {}
    gns.update(torch.tensor(5.0), torch.tensor(2.0), 1, 4)  # the first measurement, bias-corrected: itself
    assert float(gns.summary()["gns/simple"]) == pytest.approx(4.0)
    gns.update(torch.tensor(float("nan")), torch.tensor(2.0), 1, 4)  # a NaN loss's measurement is left out
    assert float(gns.summary()["gns/simple"]) == pytest.approx(4.0)
    gns.update(torch.tensor(9.0), torch.tensor(3.0), 1, 4)  # |G|^2 = (12 - 9) / 3 = 1, tr = 6 / 0.75 = 8
    summary = {k: float(v) for k, v in gns.summary().items()}
    # EMA weights 0.25 and 0.5 (sum 0.75): |G|^2 = 1, tr = (0.25 * 4 + 0.5 * 8) / 0.75 = 20 / 3
    assert summary["gns/grad_norm_sq"] == pytest.approx(1.0)
    assert summary["gns/noise_trace"] == pytest.approx(20 / 3)
    assert summary["gns/simple"] == pytest.approx(20 / 3)
    assert summary["gns/small_batch_grad_norm_sq"] == 9.0 and summary["gns/big_batch_grad_norm_sq"] == 3.0


class MeanEstimate(Algorithm):
    """Per-sample loss ``(w - y)^2 / 2`` of ``y ~ N(0, 1)``: the gradient of a sample is ``w - y``, so ``G = w``,
    ``tr(Sigma) = 1`` and the simple noise scale is ``1 / w^2``."""

    def __init__(self, w: float):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([w]))

    def param_groups(self) -> list[dict]:
        return [dict(name="w", params=[self.w], lr=0.0)]  # w stays put: the truth stays known

    def train_step(self, y, state=()):
        return AlgStep(info=())

    def calc_loss(self, y, train_info) -> LossInfo:
        return LossInfo(loss=(0.5 * (self.w - y) ** 2).unsqueeze(0))  # [1, B]


def test_the_learners_gradient_noise_scale_is_near_the_truth_on_a_known_problem():
    torch.manual_seed(0)
    algorithm = MeanEstimate(0.3)
    learner = Learner(algorithm)
    learner.diagnostics = Diagnostics(algorithm, gradient_noise_scale=True, outputs=False, due=lambda update: True)
    for _ in range(60):
        learner.update(torch.randn(64))
        summary = learner.summary()  # re-arms: every update is measured
    simple = float(summary["gns/simple"])
    assert math.isfinite(simple) and 1 / 0.3 ** 2 / 4 < simple < 1 / 0.3 ** 2 * 4, simple
    assert float(summary["gns/grad_norm_sq"]) == pytest.approx(0.09, rel=0.5)
    assert float(summary["gns/noise_trace"]) == pytest.approx(1.0, rel=0.5)
    assert algorithm.w.grad is not None and float(algorithm.w.grad) == pytest.approx(0.3, abs=0.5)


def test_one_update_per_summary_is_measured():
    algorithm = MeanEstimate(0.3)
    learner = Learner(algorithm)
    measured = []
    learner.diagnostics = Diagnostics(algorithm, True, False, due=lambda update: measured.append(update) or True)
    for _ in range(3):
        learner.update(torch.randn(8))
    assert measured == [1, 1]  # asked before the first update (update() and its step), then not again
    learner.summary()
    learner.update(torch.randn(8))
    assert measured == [1, 1, 4, 4]


# --------------------------------------------------------------------------- update_counter_every_mini_batch ----
def test_the_global_counter_per_mini_batch_steps_summaries_by_updates(tmp_path):
    params = ["TrainerConfig.num_updates_per_train_iter = 3", "TrainerConfig.summary_interval = 6",
              "TrainerConfig.evaluate = True", "TrainerConfig.eval_interval = 4",
              "TrainerConfig.summarize_gradient_noise_scale = True"]
    root = run_trainer_from_text(tmp_path, SAC, params + ["TrainerConfig.update_counter_every_mini_batch = True"],
                                 name="updates")
    scalars, _ = tensorboard(root)
    # 3 updates per iteration: the counts 6, 12, 18 and 24 are reached after iterations 2, 4, 6 and 8
    assert [step for step, _ in scalars["loss/total"]] == [6, 12, 18, 24]
    assert [step for step, _ in scalars["gns/simple"]] == [6, 12, 18, 24]
    assert [step for step, _ in scalars["train/env_steps"]] == [6, 12, 18, 24]
    assert [r["iteration"] for r in eval_log(root)] == [4, 8]  # evaluations stay in iterations
    scalars, _ = tensorboard(run_trainer_from_text(tmp_path, SAC, params, name="iterations"))
    assert [step for step, _ in scalars["loss/total"]] == [6]  # iterations: the 6th of 8


class Count:
    def __init__(self):
        self.value = 0

    def __call__(self):
        return self.value


@pytest.mark.parametrize("first_interval, expected", [(False, [2, 4, 5, 7]), (True, [1, 2, 4, 5, 7])])
def test_summaries_due_by_update_count(tmp_path, first_interval, expected):
    updates = Count()
    summaries = Summaries(str(tmp_path), 6, first_interval, 10, 10, global_step=GlobalStep(updates))
    due = []
    for iteration, count in enumerate([3, 6, 8, 13, 18, 18, 24], start=1):  # iteration 6 made no update
        updates.value = count
        assert summaries.due_for_update(iteration, count) == (count % 6 == 0 or (first_interval and count < 6))
        if summaries.is_due(iteration):
            due.append(iteration)
        assert summaries.step(iteration) == count
    assert due == expected
    summaries.close()


# ------------------------------------------------------------------------------------------------ host syncs ----
SYNC_CONFS = {"sac": SAC + "Learner.finite_check_interval = 1000\n",
              "ppo": CONFS["ppo"] + "Learner.finite_check_interval = 1000\n",
              "a2c": CONFS["a2c"] + "Learner.finite_check_interval = 1000\n"}
ALL_ON = [f"TrainerConfig.{switch} = True" for switch in SWITCHES] + [
    "TrainerConfig.update_counter_every_mini_batch = True"]


def syncs_between_summaries(tmp_path, name: str, params: list[str]) -> tuple[list[str], list[str], object]:
    """The syncing calls of 3 iterations (collection and training) between summaries, and then the tags of a
    summary after an iteration where one is due."""
    with built(tmp_path, SYNC_CONFS[name], params + ["TrainerConfig.summary_interval = 1000"]) as trainer:
        iterate(trainer, name)  # optimizer state, the guard's latch
        with SyncCounter() as syncs:
            for _ in range(3):
                iterate(trainer, name)
                assert not trainer.summaries.is_due(trainer.counters.iteration)
        trainer.counters.iteration = 999  # the next iteration is summarized (counting iterations)
        trainer.learner.num_updates = 999  # (or counting updates: its first update is the 1000th)
        iterate(trainer, name)
        tags = list(trainer.learner.summary())
        return syncs.calls, syncs.sites, tags


@pytest.mark.parametrize("name", list(SYNC_CONFS))
def test_every_switch_on_adds_no_host_sync_between_summaries(tmp_path, name):
    calls_off, _, tags_off = syncs_between_summaries(tmp_path / "off", name, [])
    calls_on, sites_on, tags_on = syncs_between_summaries(tmp_path / "on", name, ALL_ON)
    assert sorted(calls_on) == sorted(calls_off), "\n".join(sites_on)
    training = [site for site in sites_on if "alfish/learn/" in site or "alfish/trainer/" in site
                or "alfish/algorithms/" in site]
    assert training == []
    assert not [tag for tag in tags_off if tag.startswith(("gns/", "output/", "debug/"))]
    assert {"gns/simple", "debug/advantage.mean" if name != "sac" else "debug/q.mean"} <= set(tags_on)
    assert [tag for tag in tags_on if tag.startswith("output/")]  # the summarized iteration was diagnosed


def test_histograms_leave_out_non_finite_values(tmp_path):
    summaries = Summaries(str(tmp_path), 1, False, 10, 10)
    # an fp16 update whose gradients overflowed (the step was skipped) must not crash the summary
    summaries.histogram("grads/w", torch.tensor([1.0, float("inf"), float("nan"), 2.0]), 1)
    summaries.histogram("grads/all_nan", torch.tensor([float("nan")]), 1)
    summaries.close()
    _, histograms = tensorboard(tmp_path)
    assert set(histograms) == {"grads/w"} and histograms["grads/w"][0].histogram_value.num == 2
