"""EncodingNetwork: observations in their own shape and dtype in, float features out (shapes computed by hand)."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from alfish.networks.encoding import NATURE_CNN, EncodingNetwork, channels_last_layout, is_flat_space, is_image_space


def image(shape, dtype=np.uint8):
    return gym.spaces.Box(0, 255, shape=shape, dtype=dtype)


def test_nature_cnn_on_stacked_atari_frames_gives_3136_features():
    # 84 -> (84 - 8) / 4 + 1 = 20 -> (20 - 4) / 2 + 1 = 9 -> 9 - 3 + 1 = 7; 64 channels * 7 * 7 = 3136
    net = EncodingNetwork(image((4, 84, 84)), conv_layers="nature", fc_layers=(512,))
    out = net(torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8))
    assert net.encoder.output_size == 64 * 7 * 7 and out.shape == (3, 512) and out.dtype == torch.float32
    assert [tuple(c.weight.shape) for c in net.encoder.convs if isinstance(c, torch.nn.Conv2d)] == [
        (32, 4, 8, 8), (64, 32, 4, 4), (64, 64, 3, 3)]
    assert NATURE_CNN == ((32, 8, 4), (64, 4, 2), (64, 3, 1))


def test_impala_resnet_halves_the_image_three_times():
    # 64 -> 32 -> 16 -> 8 (max-pool 3, stride 2, padding 1); 32 channels * 8 * 8 = 2048
    net = EncodingNetwork(image((3, 64, 64)), conv_layers="impala")
    assert net(torch.zeros(2, 3, 64, 64, dtype=torch.uint8)).shape == (2, 32 * 8 * 8)
    residual = [m for m in net.modules() if type(m).__name__ == "ResidualBlock"]
    assert len(residual) == 6


@pytest.mark.parametrize("shape, channels_last", [((84, 84, 3), True), ((3, 84, 84), False), ((64, 64, 4), True),
                                                  ((4, 64, 64), False), ((3, 3, 3), False)])
def test_layout_is_inferred_from_the_shorter_end(shape, channels_last):
    assert channels_last_layout(shape) is channels_last


def test_hwc_and_chw_images_give_the_same_features_for_the_same_pixels():
    torch.manual_seed(0)
    chw = EncodingNetwork(image((3, 12, 12)), conv_layers=((4, 3, 1),))
    hwc = EncodingNetwork(image((12, 12, 3)), conv_layers=((4, 3, 1),))
    hwc.load_state_dict(chw.state_dict())
    pixels = torch.randint(0, 256, (5, 3, 12, 12), dtype=torch.uint8)
    torch.testing.assert_close(hwc(pixels.permute(0, 2, 3, 1)), chw(pixels))


def test_uint8_pixels_are_scaled_to_unit_range_inside_and_float_images_are_not_scaled_again():
    torch.manual_seed(0)
    as_bytes = EncodingNetwork(image((1, 6, 6)), conv_layers=((2, 3, 1),))
    as_floats = EncodingNetwork(image((1, 6, 6), np.float32), conv_layers=((2, 3, 1),))
    as_floats.load_state_dict(as_bytes.state_dict())
    pixels = torch.randint(0, 256, (4, 1, 6, 6), dtype=torch.uint8)
    torch.testing.assert_close(as_bytes(pixels), as_floats(pixels.float() / 255.0))


def test_a_grey_uint8_image_of_rank_2_gets_one_channel():
    net = EncodingNetwork(image((10, 10)), conv_layers=((3, 3, 1),))
    assert net(torch.zeros(2, 10, 10, dtype=torch.uint8)).shape == (2, 3 * 8 * 8)


def test_leading_batch_dims_are_kept():
    net = EncodingNetwork(image((1, 5, 7)), conv_layers=((2, 3, 1),), fc_layers=(6,))
    assert net(torch.zeros(4, 3, 1, 5, 7, dtype=torch.uint8)).shape == (4, 3, 6)


def test_dict_observations_get_one_encoder_per_key_concatenated_in_key_order():
    space = gym.spaces.Dict({"camera": image((8, 8, 3)), "joints": gym.spaces.Box(-1, 1, (5,), np.float32),
                             "goal": gym.spaces.Box(-1, 1, (2,), np.float32)})
    net = EncodingNetwork(space, conv_layers=((4, 3, 2),), key_fc_layers=(16,))
    # camera: (8 - 3) // 2 + 1 = 3 -> 4 * 3 * 3 = 36; joints and goal: an MLP of 16 each
    assert [k for k in net.encoders] == ["camera", "goal", "joints"]  # gymnasium sorts the keys
    assert net.output_size == 36 + 16 + 16
    obs = {"camera": torch.zeros(2, 8, 8, 3, dtype=torch.uint8), "joints": torch.randn(2, 5), "goal": torch.randn(2, 2)}
    out = net(obs)
    assert out.shape == (2, 68) and out.dtype == torch.float32
    # the features of 'goal' sit at [36, 52): changing the goal changes only those
    changed = net({**obs, "goal": obs["goal"] + 1.0})
    assert torch.equal(changed[:, :36], out[:, :36]) and torch.equal(changed[:, 52:], out[:, 52:])
    assert not torch.equal(changed[:, 36:52], out[:, 36:52])


def test_vector_dicts_without_key_layers_are_flattened_and_concatenated():
    space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,), np.float32), "b": gym.spaces.Box(-1, 1, (1, 3))})
    net = EncodingNetwork(space)
    obs = {"a": torch.tensor([[1.0, 2.0]]), "b": torch.tensor([[[3.0, 4.0, 5.0]]])}
    assert net(obs).tolist() == [[1.0, 2.0, 3.0, 4.0, 5.0]]


def test_layer_norm_and_dropout_follow_each_fc_layer():
    net = EncodingNetwork(gym.spaces.Box(-1, 1, (4,)), fc_layers=(8, 8), layer_norm=True, dropout=0.5)
    kinds = [type(m).__name__ for m in net.fc]
    assert kinds == ["Linear", "LayerNorm", "ReLU", "Dropout"] * 2
    x = torch.randn(64, 4)
    net.eval()
    assert torch.equal(net(x), net(x))  # dropout off in eval mode
    net.train()
    assert not torch.equal(net(x), net(x))


@pytest.mark.parametrize("kind, spec", [("lstm", ((7,), (7,))), ("gru", (7,))])
def test_recurrent_core_has_a_state_spec_and_steps_from_it(kind, spec):
    net = EncodingNetwork(gym.spaces.Box(-1, 1, (3,)), fc_layers=(5,), rnn=kind, rnn_size=7)
    assert net.recurrent and net.state_spec() == spec and net.output_size == 7
    out, state = net(torch.randn(4, 3))  # from zeros
    assert out.shape == (4, 7)
    out2, _ = net(torch.randn(4, 3), state)
    zeros = net.initial_state(4)
    out3, _ = net(torch.zeros(4, 3), zeros)
    out4, _ = net(torch.zeros(4, 3), state)
    assert not torch.equal(out3, out4)  # the state is read
    assert out2.shape == (4, 7)


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ValueError, match=r"do not fit a \(1, 5, 5\) \(C, H, W\) image"):
        EncodingNetwork(image((1, 5, 5)), conv_layers="nature")
    with pytest.raises(ValueError, match="'resnet' is not a preset; choose one of"):
        EncodingNetwork(image((1, 64, 64)), conv_layers="resnet")
    with pytest.raises(ValueError, match=r"rnn='rnn' is not one of \('lstm', 'gru'\)"):
        EncodingNetwork(gym.spaces.Box(-1, 1, (3,)), rnn="rnn")
    with pytest.raises(ValueError, match="cannot tell how to encode observation of shape"):
        EncodingNetwork(gym.spaces.Box(-1, 1, (2, 2, 2, 2)))


def test_space_kinds():
    assert is_image_space(image((84, 84))) and is_image_space(image((3, 8, 8), np.float32))
    assert not is_image_space(gym.spaces.Box(-1, 1, (4, 4)))  # a float matrix is not an image
    assert is_flat_space(gym.spaces.Box(-1, 1, (4,)))
    assert is_flat_space(gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (4,))}))
    assert not is_flat_space(gym.spaces.Dict({"a": image((1, 4, 4))}))


class JointsEncoder(torch.nn.Module):
    """A user's preprocessing of one key: sin and cos of each joint angle."""

    def __init__(self, space):
        super().__init__()
        self.output_size = 2 * space.shape[0]

    def forward(self, x):
        return torch.cat([x.sin(), x.cos()], -1)


def test_a_users_encoder_replaces_the_default_of_its_key():
    space = gym.spaces.Dict({"camera": image((1, 6, 6)), "joints": gym.spaces.Box(-3, 3, (3,), np.float32)})
    net = EncodingNetwork(space, conv_layers=((2, 3, 1),), key_encoder_ctors={"joints": JointsEncoder})
    assert isinstance(net.encoders["joints"], JointsEncoder) and net.output_size == 2 * 4 * 4 + 6
    joints = torch.tensor([[0.0, 1.0, 2.0]])
    out = net({"camera": torch.zeros(1, 1, 6, 6, dtype=torch.uint8), "joints": joints})
    torch.testing.assert_close(out[:, 32:], torch.cat([joints.sin(), joints.cos()], -1))
    with pytest.raises(ValueError, match=r"names \['wheels'\], which the observation does not have"):
        EncodingNetwork(space, conv_layers=((2, 3, 1),), key_encoder_ctors={"wheels": JointsEncoder})
    with pytest.raises(ValueError, match="needs a Dict observation"):
        EncodingNetwork(image((1, 6, 6)), conv_layers=((2, 3, 1),), key_encoder_ctors={"joints": JointsEncoder})


def test_channels_last_memory_gives_the_features_of_contiguous_memory():
    torch.manual_seed(0)
    fast = EncodingNetwork(image((4, 20, 20)), conv_layers=((8, 4, 2), (8, 3, 1)), memory_format="channels_last")
    plain = EncodingNetwork(image((4, 20, 20)), conv_layers=((8, 4, 2), (8, 3, 1)), memory_format="contiguous")
    plain.load_state_dict(fast.state_dict())
    conv = fast.encoder.convs[0]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert plain.encoder.convs[0].weight.is_contiguous()
    pixels = torch.randint(0, 256, (6, 4, 20, 20), dtype=torch.uint8)
    torch.testing.assert_close(fast(pixels), plain(pixels))
    floats = pixels.float()
    before = floats.clone()
    float_net = EncodingNetwork(image((4, 20, 20), np.float32), conv_layers=((8, 4, 2),))
    float_net(floats)
    assert torch.equal(floats, before)  # the caller's tensor is not scaled or changed in place
    with pytest.raises(ValueError, match="memory_format='nhwc' is not one of"):
        EncodingNetwork(image((4, 20, 20)), memory_format="nhwc")
