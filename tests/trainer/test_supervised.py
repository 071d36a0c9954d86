"""TrainerConfig.ml_type='sl': supervised learning on the same loop, Learner, summaries and checkpoints."""
import pathlib

import gin
import numpy as np
import pytest
import torch

from alfish.algorithms.supervised import SupervisedBatch, SupervisedModel
from alfish.config import TrainerConfig, load_conf
from alfish.replay.supervised_data import SupervisedData
from alfish.trainer.build import build_trainer
from tests.integration.inprocess import CONFS, tb_scalars


def build(tmp_path: pathlib.Path, params=(), conf=CONFS / "sl_sine.gin", name="run"):
    load_conf(str(conf), list(params))
    try:
        return build_trainer(TrainerConfig(root_dir=str(tmp_path / name)))
    finally:
        gin.clear_config()


def test_the_sine_regression_reaches_the_noise_floor_on_held_out_pairs(tmp_path):
    trainer = build(tmp_path, ["TrainerConfig.num_iterations=1500"])
    assert trainer.run() == 0
    validation = tb_scalars(tmp_path / "run")["sl/validation_loss"]
    assert validation[0][1] > 0.2  # an untrained model is far from the curve
    assert validation[-1][1] < 0.02  # the noise variance is 0.01
    assert trainer.counters.env_steps == 0 and trainer.learner.num_updates == 1500


def test_classification_from_an_npz_with_integer_targets(tmp_path):
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(1000, 2)).astype(np.float32)
    targets = (inputs[:, 0] + inputs[:, 1] > 0).astype(np.int64)  # a linear boundary: two classes
    np.savez(tmp_path / "data.npz", inputs=inputs, targets=targets)
    trainer = build(tmp_path, ["SupervisedData.toy=None", f"SupervisedData.path='{tmp_path / 'data.npz'}'",
                               "TrainerConfig.num_iterations=300"])
    assert isinstance(trainer.algorithm, SupervisedModel) and trainer.algorithm.classify
    assert trainer.run() == 0
    scalars = tb_scalars(tmp_path / "run")
    assert scalars["loss/accuracy"][-1][1] > 0.95 and scalars["sl/validation_loss"][-1][1] < 0.2


def test_the_losses_by_hand():
    import gymnasium as gym

    model = SupervisedModel(gym.spaces.Box(-1, 1, (1,)), gym.spaces.Box(-1, 1, (2,)),
                            model_ctor=lambda i, o: torch.nn.Linear(i, o, bias=False))
    with torch.no_grad():
        model.model.weight.copy_(torch.tensor([[1.0], [2.0]]))
    batch = SupervisedBatch(torch.tensor([[1.0], [3.0]]), torch.tensor([[0.0, 0.0], [3.0, 3.0]]))
    loss = model.calc_loss(batch, model.train_step(batch).info).loss
    assert loss.tolist() == [1.0 + 4.0, 0.0 + 9.0]  # (x - 0)^2 + (2x - 0)^2; (3 - 3)^2 + (6 - 3)^2


@pytest.mark.parametrize("params, message", [
    (["TrainerConfig.evaluate=True"], "TrainerConfig.ml_type='sl' trains a model on SupervisedData with no env"),
    (["SupervisedData.path='/x.npz'"], "SupervisedData needs exactly one of path"),
    (["SupervisedModel.loss='cross_entropy'"], "SupervisedModel.loss='cross_entropy' does not fit targets"),
])
def test_supervised_settings_that_cannot_work_are_one_line_errors(tmp_path, params, message):
    with pytest.raises(Exception, match=message) as err:
        build(tmp_path, params)
    assert "\n" not in str(err.value).split(" In call to")[0]


def test_supervised_data_holds_out_a_fixed_fraction():
    data = SupervisedData(toy="sine", num_samples=100, validation_fraction=0.2, seed=3)
    assert len(data.train_index) == 80 and len(data.validation()[0]) == 20
    assert set(data.train_index.tolist()).isdisjoint(data.validation_index.tolist())
