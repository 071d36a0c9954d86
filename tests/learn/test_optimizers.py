"""OptimizerConfig's four optimizers (Adam, AdamW, SGD, RMSprop): steps equal to torch's own optimizer built by hand,
hyperparameters reaching torch, checkpoint round trips through a Learner, one-line errors for hyperparameters the
chosen optimizer does not take, a quadratic each one minimizes, and the gin bindings (an SB3-style A2C with RMSprop).
"""
import inspect
import io

import gin
import gymnasium as gym
import pytest
import torch
from torch import nn

from alfish.algorithms import A2cAlgorithm
from alfish.algorithms.base import Algorithm
from alfish.config import load_conf, load_config_text
from alfish.data.types import LossInfo
from alfish.learn.learner import Learner
from alfish.learn.optim import DEFAULTS, OPTIMIZERS, OptimizerConfig

TORCH = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "rmsprop": torch.optim.RMSprop}

# (name, hyperparameters): torch's defaults and a non-default setting of every hyperparameter of each optimizer.
CASES = [
    ("adam", {}),
    ("adam", {"betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    ("adamw", {}),
    ("adamw", {"betas": (0.85, 0.98), "eps": 1e-7, "weight_decay": 0.05}),
    ("sgd", {}),
    ("sgd", {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}),
    ("sgd", {"momentum": 0.8, "dampening": 0.1}),
    ("rmsprop", {}),
    ("rmsprop", {"alpha": 0.99, "eps": 1e-5}),  # Stable-Baselines3's A2C
    ("rmsprop", {"alpha": 0.9, "eps": 1e-6, "momentum": 0.5, "centered": True, "weight_decay": 1e-3}),
]
IDS = [f"{name}-{'-'.join(hp) or 'defaults'}" for name, hp in CASES]


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def tiny_module(seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(3, 2)


def groups(module: nn.Linear) -> list[dict]:
    """Two groups with their own learning rates, as an algorithm gives them."""
    return [{"name": "weight", "params": [module.weight], "lr": 0.05}, {"name": "bias", "params": [module.bias],
                                                                         "lr": 0.02}]


def loss_of(module: nn.Linear, step: int) -> torch.Tensor:
    x = torch.linspace(-1.0, 1.0, 12).view(4, 3) * (1 + step)
    return (module(x) - torch.tensor([1.0, -2.0])).pow(2).mean()


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name, hp", CASES, ids=IDS)
def test_three_steps_equal_the_same_torch_optimizer_built_by_hand(name, hp, fused):
    ours, ref = tiny_module(), tiny_module()
    optimizer = OptimizerConfig(name=name, fused=fused, **hp).build(groups(ours))
    by_hand = TORCH[name](groups(ref), foreach=False, **hp)  # torch's per-tensor reference implementation
    for step in range(3):
        for module, opt in ((ours, optimizer), (ref, by_hand)):
            opt.zero_grad()
            loss_of(module, step).backward()
            opt.step()
    assert not torch.equal(ours.weight, tiny_module().weight)  # the steps moved the parameters
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name, hp", CASES, ids=IDS)
def test_hyperparameters_reach_the_torch_optimizer(name, hp):
    optimizer = OptimizerConfig(name=name, **hp).build(groups(tiny_module()))
    assert type(optimizer) is TORCH[name]
    for key, value in {**DEFAULTS[name], **hp}.items():
        assert optimizer.defaults[key] == value, key
    # fused where torch has a fused kernel, the multi-tensor implementation for RMSprop (which has none)
    assert optimizer.defaults.get("fused") is (True if name != "rmsprop" else None)
    assert optimizer.defaults["foreach"] is (True if name == "rmsprop" else None)
    assert [(g["name"], g["lr"]) for g in optimizer.param_groups] == [("weight", 0.05), ("bias", 0.02)]
    plain = OptimizerConfig(name=name, fused=False, **hp).build(groups(tiny_module()))
    assert not plain.defaults.get("fused") and plain.defaults["foreach"] is None  # torch's own choice


def test_the_default_is_the_fused_adam_of_before():
    module = tiny_module()
    config = OptimizerConfig()
    assert config.name == "adam" and config.fused and (config.betas, config.eps, config.weight_decay) == (
        (0.9, 0.999), 1e-8, 0.0)
    ours = config.build(groups(module))
    before = torch.optim.Adam(groups(module), betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, fused=True)
    assert type(ours) is torch.optim.Adam and ours.defaults == before.defaults


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_defaults_are_torchs(name):
    signature = inspect.signature(TORCH[name]).parameters
    assert DEFAULTS[name] == {key: signature[key].default for key in DEFAULTS[name]}
    assert OptimizerConfig(name=name).hyperparameters == DEFAULTS[name]


# ---------------------------------------------------------------------------------------------- with a Learner ---

class Quadratic(Algorithm):
    """``loss = sum(scale * (w - target)^2)`` over two parameter groups, minimum 0 at ``w = target``."""

    def __init__(self, lr: float):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([3.0, -2.0, 1.0]))
        self.v = nn.Parameter(torch.tensor([[0.5, -1.5]]))
        self.lr = lr

    def param_groups(self) -> list[dict]:
        return [{"name": "w", "params": [self.w], "lr": self.lr}, {"name": "v", "params": [self.v], "lr": self.lr}]

    def loss(self) -> torch.Tensor:
        return ((self.w - torch.tensor([1.0, 0.5, -1.0])).pow(2) * torch.tensor([1.0, 3.0, 0.5])).sum() + (
            self.v - 1.0).pow(2).sum()


def step(learner: Learner, algorithm: Quadratic) -> float:
    with learner.loss_context():
        loss = algorithm.loss()
    learner.apply(LossInfo(loss=loss))
    return float(loss.detach())


@pytest.mark.parametrize("name, hp", CASES, ids=IDS)
def test_state_dict_round_trip_through_a_learner(name, hp):
    original = Quadratic(0.05)
    learner = Learner(original, OptimizerConfig(name=name, max_grad_norm=10.0, **hp))
    for _ in range(2):
        step(learner, original)
    buffer = io.BytesIO()
    torch.save(learner.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # what checkpoints allow

    twin = Quadratic(0.05)
    twin.load_state_dict(original.state_dict())
    restored = Learner(twin, OptimizerConfig(name=name, max_grad_norm=10.0, **hp))
    restored.load_state_dict(state)
    assert restored.num_updates == 2
    for p, q in ((original.w, twin.w), (original.v, twin.v)):
        saved = learner.optimizer.state[p]
        assert saved.keys() == restored.optimizer.state[q].keys()
        for key, value in saved.items():
            assert torch.equal(restored.optimizer.state[q][key], value), key
    step(learner, original)
    step(restored, twin)
    assert torch.equal(original.w, twin.w) and torch.equal(original.v, twin.v)


@pytest.mark.parametrize("name, hp, lr", [("adam", {}, 0.1), ("adamw", {}, 0.1), ("sgd", {}, 0.05),
                                          ("sgd", {"momentum": 0.9, "nesterov": True}, 0.02),
                                          ("rmsprop", {"alpha": 0.99, "eps": 1e-5}, 0.02),
                                          ("rmsprop", {"momentum": 0.5, "centered": True}, 0.01)])
def test_each_optimizer_minimizes_a_quadratic(name, hp, lr):
    algorithm = Quadratic(lr)
    learner = Learner(algorithm, OptimizerConfig(name=name, **hp))
    first = step(learner, algorithm)
    for _ in range(150):
        last = step(learner, algorithm)
    assert last < 0.01 * first, (first, last)


# ----------------------------------------------------------------------------------------------------- errors ---

@pytest.mark.parametrize("kwargs, message", [
    ({"nesterov": True}, "OptimizerConfig.nesterov=True does not apply to OptimizerConfig.name='adam' (nesterov is "
                         "a hyperparameter of 'sgd'); remove the binding or choose one of those optimizers"),
    ({"name": "sgd", "betas": (0.9, 0.99)}, "OptimizerConfig.betas=(0.9, 0.99) does not apply to OptimizerConfig."
                                            "name='sgd' (betas is a hyperparameter of 'adam', 'adamw'); remove"),
    ({"name": "sgd", "eps": 1e-5}, "OptimizerConfig.eps=1e-05 does not apply to OptimizerConfig.name='sgd' (eps is "
                                   "a hyperparameter of 'adam', 'adamw', 'rmsprop')"),
    ({"momentum": 0.9}, "OptimizerConfig.momentum=0.9 does not apply to OptimizerConfig.name='adam' (momentum is a "
                        "hyperparameter of 'sgd', 'rmsprop')"),
    ({"name": "adamw", "alpha": 0.99}, "OptimizerConfig.alpha=0.99 does not apply to OptimizerConfig.name='adamw'"),
    ({"name": "adamw", "centered": False}, "OptimizerConfig.centered=False does not apply to OptimizerConfig.name="
                                           "'adamw' (centered is a hyperparameter of 'rmsprop')"),
    ({"name": "rmsprop", "dampening": 0.1}, "OptimizerConfig.dampening=0.1 does not apply to OptimizerConfig.name="
                                            "'rmsprop' (dampening is a hyperparameter of 'sgd')"),
    ({"name": "sgd", "nesterov": True}, "OptimizerConfig.nesterov=True needs momentum > 0 and dampening = 0 "
                                        "(torch's rule), got momentum=0.0, dampening=0.0"),
    ({"name": "sgd", "nesterov": True, "momentum": 0.9, "dampening": 0.1},
     "OptimizerConfig.nesterov=True needs momentum > 0 and dampening = 0 (torch's rule), got momentum=0.9, "
     "dampening=0.1"),
    ({"name": "rmsporp"}, "OptimizerConfig.name='rmsporp' must be one of 'adam', 'adamw', 'sgd', 'rmsprop'; did "
                          "you mean 'rmsprop'?"),
    ({"name": "sgd", "momentum": -1}, "OptimizerConfig(name='sgd'): Invalid momentum value: -1"),
    ({"name": "adamw", "betas": (1.2, 0.9)}, "OptimizerConfig(name='adamw'): Invalid beta parameter at index 0: 1.2"),
    ({"betas": (0.9,)}, "OptimizerConfig.betas=(0.9,) must be a pair (beta1, beta2)"),
])
def test_one_line_errors(kwargs, message):
    with pytest.raises(ValueError) as info:
        OptimizerConfig(**kwargs)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_a_gin_bound_error_stays_one_line():
    gin.parse_config("OptimizerConfig.name = 'sgd'\nOptimizerConfig.betas = (0.9, 0.99)")
    with pytest.raises(ValueError) as info:
        OptimizerConfig()
    assert str(info.value).startswith("OptimizerConfig.betas=(0.9, 0.99) does not apply to OptimizerConfig.name='sgd'")
    assert "\n" not in str(info.value)


# -------------------------------------------------------------------------------------------------------- gin ---

def test_gin_binding_selects_the_optimizer():
    gin.parse_config("OptimizerConfig.name = 'rmsprop'\nOptimizerConfig.alpha = 0.9")
    config = OptimizerConfig()
    assert config.name == "rmsprop" and config.hyperparameters["alpha"] == 0.9
    assert type(config.build(groups(tiny_module()))) is torch.optim.RMSprop


def test_a_bad_name_in_a_conf_fails_when_it_is_loaded(tmp_path):
    conf = tmp_path / "x.gin"
    conf.write_text("OptimizerConfig.name = 'RMSprop'\n")
    with pytest.raises(Exception, match=r"x.gin:1: OptimizerConfig.name = 'RMSprop': expected one of 'adam', "
                                        r"'adamw', 'sgd', 'rmsprop'; did you mean 'rmsprop'\?"):
        load_conf(str(conf))


A2C_CONF = """
A2cAlgorithm.hidden_sizes = (64, 64)
A2cAlgorithm.activation = 'tanh'
A2cAlgorithm.lr = 7e-4
OptimizerConfig.name = 'rmsprop'
OptimizerConfig.alpha = 0.99
OptimizerConfig.eps = 1e-5
OptimizerConfig.max_grad_norm = 0.5
"""


def test_an_sb3_style_a2c_conf_with_rmsprop_builds_a_learner_that_steps(tmp_path):
    conf = tmp_path / "a2c.gin"
    conf.write_text(A2C_CONF)
    load_conf(str(conf))  # value checks included
    algorithm = A2cAlgorithm(gym.spaces.Box(-1.0, 1.0, shape=(4,)), gym.spaces.Discrete(2))
    learner = Learner(algorithm)  # OptimizerConfig() as gin binds it
    optimizer = learner.optimizer
    assert type(optimizer) is torch.optim.RMSprop
    assert {k: optimizer.defaults[k] for k in DEFAULTS["rmsprop"]} == {
        "alpha": 0.99, "eps": 1e-5, "momentum": 0.0, "centered": False, "weight_decay": 0.0}
    assert [g["lr"] for g in optimizer.param_groups] == [7e-4]
    before = [p.detach().clone() for p in learner.params]
    with learner.loss_context():
        loss = sum((p - 1.0).pow(2).sum() for p in algorithm.parameters())
    learner.apply(LossInfo(loss=loss))
    assert all(not torch.equal(a, b) for a, b in zip(before, learner.params))
    assert set(optimizer.state[learner.params[0]]) == {"step", "square_avg"}


def test_the_operative_config_of_a_run_rebuilds_the_same_optimizer(tmp_path):
    # resume and play rebuild from the operative config, which records every default (None: torch's)
    conf = tmp_path / "x.gin"
    conf.write_text("OptimizerConfig.name = 'sgd'\nOptimizerConfig.momentum = 0.9\nOptimizerConfig.nesterov = True\n")
    load_conf(str(conf))
    first = OptimizerConfig()
    operative = gin.operative_config_str()
    assert "OptimizerConfig.betas = None" in operative
    load_config_text(operative, "operative.gin")
    again = OptimizerConfig()
    assert (again.name, again.hyperparameters) == (first.name, first.hyperparameters)


def test_the_operative_config_of_an_older_adam_run_still_loads():
    load_config_text("OptimizerConfig.betas = (0.9, 0.999)\nOptimizerConfig.eps = 1e-08\nOptimizerConfig.fused = True\n"
                     "OptimizerConfig.max_grad_norm = 0.5\nOptimizerConfig.max_grad_value = None\n"
                     "OptimizerConfig.weight_decay = 0.0\n", "operative.gin")
    config = OptimizerConfig()
    assert config.name == "adam" and config.hyperparameters == DEFAULTS["adam"] and config.max_grad_norm == 0.5
