"""``DevicePolicy.matmul_precision`` sets torch's float32 matmul precision when the trainer sets up its training
device ('high': TF32 on Ampere+ GPUs); a value torch does not know is refused in one line, at conf load and by the
policy itself; the default (None) leaves torch's process-wide setting as the user left it."""
import gin
import pytest
import torch

from alfish.config import ConfError, TrainerConfig, load_conf
from alfish.errors import OneLineValueError
from alfish.learn.device import DevicePolicy
from alfish.trainer.build import build_trainer

CONF = """
create_environment.env_name = 'CartPole-v1'
create_environment.num_parallel_environments = 1
TrainerConfig.algorithm_ctor = @A2cAlgorithm
A2cAlgorithm.hidden_sizes = (4,)
TrainerConfig.num_iterations = 1
TrainerConfig.evaluate = False
TrainerConfig.num_checkpoints = 0
DevicePolicy.device = 'cpu'
"""


@pytest.fixture(autouse=True)
def torch_precision():
    """torch's setting is process-wide: each test leaves it as it found it (and gin cleared)."""
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)
    gin.clear_config()


def build_from(tmp_path, extra: str = "") -> None:
    conf = tmp_path / "conf.gin"
    conf.write_text(CONF + extra)
    load_conf(str(conf), [])
    build_trainer(TrainerConfig(root_dir=str(tmp_path / "run"))).close()


@pytest.mark.parametrize("precision", ["high", "medium", "highest"])
def test_the_trainer_applies_the_confs_matmul_precision(tmp_path, precision):
    torch.set_float32_matmul_precision("medium" if precision == "highest" else "highest")
    build_from(tmp_path, f"DevicePolicy.matmul_precision = '{precision}'\n")
    assert torch.get_float32_matmul_precision() == precision


def test_the_default_is_full_float32_whatever_the_process_set_before(tmp_path):
    torch.set_float32_matmul_precision("medium")
    build_from(tmp_path)
    assert torch.get_float32_matmul_precision() == "highest"


def test_an_unknown_precision_is_a_one_line_error_and_changes_nothing(tmp_path):
    torch.set_float32_matmul_precision("medium")
    with pytest.raises(OneLineValueError, match=r"^DevicePolicy.matmul_precision='tf32' must be one of \['highest', "
                                                r"'high', 'medium'\] \('high': TF32 on Ampere\+ GPUs\)$"):
        DevicePolicy(device="cpu", matmul_precision="tf32")
    with pytest.raises(ConfError, match=r"conf.gin:\d+.*DevicePolicy.matmul_precision.*one of 'highest', 'high', "
                                        r"'medium'; did you mean 'high'\?"):
        build_from(tmp_path, "DevicePolicy.matmul_precision = 'hihg'\n")
    assert torch.get_float32_matmul_precision() == "medium"
