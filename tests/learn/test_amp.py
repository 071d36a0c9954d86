"""The AMP policy: bf16 autocast on CPU, fp16 refused on CPU, fp16 with a gradient scaler on CUDA (skipped without a
GPU), scaler state round trip; and AMP bf16 training reaching the tiny env's threshold."""
import pytest
import torch

from alfish.learn.amp import AmpPolicy
from tests.integration.inprocess import eval_log, run_trainer_from_text
from tests.integration.test_learning import SAC_POINT_GOAL


def test_bf16_autocast_on_cpu_runs_matmuls_in_bf16_and_steps_without_a_scaler():
    policy = AmpPolicy(True)
    layer = torch.nn.Linear(4, 3)
    with policy.autocast():
        out = layer(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    assert not policy.scaler.is_enabled()  # bf16 has float32's exponent range: no loss scaling
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    before = layer.weight.detach().clone()
    policy.backward(out.float().pow(2).mean())
    policy.step(optimizer)
    assert not torch.equal(before, layer.weight)
    assert policy.summary() == {"loss_scale": 1.0, "skipped_steps": 0.0}


def test_disabled_policy_changes_nothing():
    policy = AmpPolicy(False)
    with policy.autocast():
        assert torch.nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.float32
    assert policy.summary() == {}


def test_fp16_on_cpu_and_unknown_dtypes_are_clear_errors():
    with pytest.raises(ValueError, match="AmpPolicy.dtype='float16' needs CUDA; on CPU use 'bfloat16'"):
        AmpPolicy(True, "cpu", "float16")
    with pytest.raises(ValueError, match=r"AmpPolicy.dtype='fp8' must be one of \['bfloat16', 'float16'\]"):
        AmpPolicy(True, "cpu", "fp8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fp16_on_cuda_scales_the_loss_skips_overflowing_steps_and_round_trips_its_state():
    policy = AmpPolicy(True, "cuda")
    assert policy.dtype == torch.float16 and policy.scaler.is_enabled()
    layer = torch.nn.Linear(4, 1).cuda()
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    with policy.autocast():
        loss = layer(torch.full((2, 4), 1e4, device="cuda")).float().pow(2).mean() * 1e30  # overflows in fp16 grads
    policy.backward(loss)
    policy.unscale(optimizer)
    before = layer.weight.detach().clone()
    policy.step(optimizer)
    assert torch.equal(before, layer.weight) and policy.skipped_steps == 1
    restored = AmpPolicy(True, "cuda")
    restored.load_state_dict(policy.state_dict())
    assert restored.scaler.get_scale() == policy.scaler.get_scale() and restored.skipped_steps == 1


# slow: a learning run (12 s in CI); bf16 autocast's loss and update are unit-tested above in the default run
@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.timeout(120)
def test_sac_with_bf16_autocast_reaches_the_point_goal_threshold(tmp_path):
    root = run_trainer_from_text(tmp_path, SAC_POINT_GOAL + "TrainerConfig.enable_amp = True\n")
    result = [r["average_return"] for r in eval_log(root)]
    # the same thresholds as the float32 SAC learning test (optimum -0.9; a random policy gets about -6)
    assert result[0] < -1.5 and max(result) >= -1.1, result
    assert sum(result[-3:]) / 3 >= -1.15, result
