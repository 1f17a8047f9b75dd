"""Grids for any rank: which layer outputs lie on a signal's, an image's or a volume's input, and how."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import camkit
from camkit.functional import channels_last_to_grid, grid_fits, guess_channels_last, infer_token_grid, tokens_to_grid
from camkit.layers.layout import grid_shape, layer_grid


def test_grid_fits_by_rank():
    # An image: both sides share one stride, rounded the same way.
    assert grid_fits((7, 7), (224, 224)) and not grid_fits((7, 14), (224, 224))
    # A clip: time has its own stride (r3d_18's layer4 on 16x112x112 is 2x7x7).
    assert grid_fits((2, 7, 7), (16, 112, 112)) and grid_fits((16, 56, 56), (16, 112, 112))
    assert not grid_fits((2, 7, 14), (16, 112, 112))
    assert not grid_fits((17, 7, 7), (16, 112, 112))  # more frames than the input has
    # A signal: 100 / s rounded; 98 (an unpadded kernel of 3) is no stride of 100.
    assert grid_fits((50,), (100,)) and grid_fits((34,), (100,)) and not grid_fits((98,), (100,))
    assert not grid_fits((7, 7), (16, 112, 112))  # the wrong number of axes


def test_token_grid_of_a_video_needs_a_prefix_or_an_unambiguous_count():
    # 1 + 3 * 7 * 7 tokens on a 6x112x112 clip: 3x7x7 is the only grid with 1 prefix token.
    assert infer_token_grid(1 + 3 * 7 * 7, (6, 112, 112), prefix=1) == (1, 3, 7, 7)
    with pytest.raises(camkit.InvalidInputError, match=r"fit several grids.*1x14x14, 4x7x7"):
        infer_token_grid(1 + 4 * 7 * 7, (8, 112, 112), prefix=1)  # 196 = 4 x 7 x 7 = 1 x 14 x 14
    # 392 tokens of a 16x112x112 clip: 8x7x7 and 2x14x14 both fit exactly: refused, with the fix.
    with pytest.raises(camkit.InvalidInputError, match=r"fit several grids.*2x14x14, 8x7x7.*grid=\(d, h, w\)"):
        infer_token_grid(8 * 7 * 7, (16, 112, 112), prefix=0)
    # 1-D tokens: 1 class token and 16 tokens of a 64-sample signal (stride 4).
    assert infer_token_grid(17, (64,), prefix=1) == (1, 16)
    # 2-D unchanged.
    assert infer_token_grid(197, (224, 224)) == (1, 14, 14)


def test_tokens_to_grid_reads_time_major_row_major_tokens():
    d, h, w, dim = 2, 3, 4, 5
    tokens = torch.arange(1 + d * h * w, dtype=torch.float32).view(1, -1, 1).expand(2, -1, dim)
    grid = tokens_to_grid(tokens, grid=(d, h, w), prefix=1)
    assert grid.shape == (2, dim, d, h, w)
    # token 1 + (t * h + i) * w + j sits at [t, i, j]
    t, i, j = 1, 2, 3
    assert grid[0, 0, t, i, j] == 1 + (t * h + i) * w + j
    assert tokens_to_grid(tokens[:, :, :], (8, 12, 16), prefix=1).shape == (2, dim, d, h, w)


def test_channels_last_and_first_by_rank():
    x = torch.randn(2, 3, 4, 5, 6)
    assert torch.equal(channels_last_to_grid(x)[:, 2, 1, 3, 4], x[:, 1, 3, 4, 2])
    assert torch.equal(channels_last_to_grid(torch.arange(6.0).view(1, 3, 2))[0], torch.tensor([[0.0, 2, 4], [1, 3, 5]]))
    # Swin3D-style [B, T, H, W, C] on a 16x112x112 clip: channel-last.
    assert guess_channels_last((2, 8, 28, 28, 96), (16, 112, 112))
    assert not guess_channels_last((2, 512, 2, 7, 7), (16, 112, 112))
    with pytest.raises(camkit.InvalidInputError, match=r"fits both \[B, C, D, H, W\] and \[B, D, H, W, C\].*permute\(0, 4, 1, 2, 3\)"):
        guess_channels_last((2, 8, 8, 8, 8), (8, 8, 8))
    with pytest.raises(camkit.InvalidInputError, match="expected a 5-D shape"):
        guess_channels_last((2, 8, 8, 8), (8, 8, 8))


def test_grid_shape_and_layer_grid_by_rank():
    conv3 = nn.Conv3d(3, 8, 1)
    assert grid_shape(conv3, (2, 8, 2, 7, 7), (16, 112, 112)) == (2, 7, 7)
    assert grid_shape(nn.Conv2d(3, 8, 1), (2, 8, 7, 7), (16, 112, 112)) is None  # a 2-D map of a clip
    assert grid_shape(nn.Conv1d(3, 8, 3), (2, 8, 32), (64,)) == (32,)
    assert grid_shape(nn.Linear(8, 8), (2, 32, 8), (64,)) == (32,)  # channel-last [B, t, C]
    assert grid_shape(nn.LayerNorm(8), (2, 17, 8), (64,), 1) == (16,)  # a class token and 16 tokens
    t = torch.randn(2, 1 + 16, 8)
    grid = layer_grid("norm", nn.LayerNorm(8), t, (64,), prefix_hint=1)
    assert torch.equal(grid, t[:, 1:].transpose(1, 2))
    clip = torch.randn(2, 4, 7, 7, 96)
    assert torch.equal(layer_grid("stage", nn.LayerNorm(96), clip, (8, 112, 112)), clip.permute(0, 4, 1, 2, 3))
    with pytest.raises(camkit.InvalidInputError, match=r"a volume or video \[B, C, D, H, W\]; CAMs need \[B, C, d, h, w\]"):
        layer_grid("flat", nn.Conv2d(3, 8, 1), torch.randn(2, 8, 7, 7), (16, 112, 112))
    with pytest.raises(camkit.InvalidInputError, match=r"1x1x1 output on this 4x8x8 input"):
        layer_grid("pool", nn.AdaptiveAvgPool3d(1), torch.randn(2, 8, 1, 1, 1), (4, 8, 8))
    with pytest.raises(camkit.InvalidInputError, match=r"reshape= must return a tensor \[B, C, t\]"):
        layer_grid("x", nn.Conv1d(3, 8, 1), torch.randn(2, 8, 16), (16,), reshape=lambda t: t[..., None])


def test_auto_layer_on_a_signal_and_a_volume():
    # 40 channels do not fit 64 samples as a length: the ReLU's layout is read from its shape.
    signal = nn.Sequential(nn.Conv1d(2, 24, 3, padding=1), nn.ReLU(), nn.Conv1d(24, 40, 3, stride=2, padding=1),
                           nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(40, 3)).eval()
    assert camkit.auto_layer(signal, torch.rand(1, 2, 64))[0] == "3"
    # 6 channels fit 32 samples (32 / 5 rounded up): the ReLU could be [B, t, C] by its shape, and its
    # type does not say; the model is a plain convolutional network, so it is channel-first.
    small = nn.Sequential(nn.Conv1d(2, 4, 3, padding=1), nn.ReLU(), nn.Conv1d(4, 6, 3, stride=2, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(6, 3)).eval()
    assert camkit.auto_layer(small, torch.rand(1, 2, 32))[0] == "3"
    x = torch.rand(2, 2, 32)
    e = camkit.GradCAM(small, "3").explain(x)
    acts = small[:4](x).detach()
    score = lambda a: small[4:](a).gather(1, e.target[:, None]).sum()  # noqa: E731
    a = acts.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(score(a), a)
    torch.testing.assert_close(e.raw, (grad.mean(dim=2, keepdim=True) * acts).sum(dim=1).clamp_min(0))
    # The same ReLU in a network that also works on channel-last maps: its type and shape do not
    # decide, and it asks.
    mixed = nn.Sequential(*small[:4], nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.LayerNorm(6), nn.Linear(6, 3)).eval()
    with pytest.raises(camkit.InvalidInputError, match=r"fits both \[B, C, t\] and \[B, t, C\].*ReLU"):
        camkit.GradCAM(mixed, "3").explain(torch.rand(1, 2, 32))
    volume = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv3d(4, 6, 3, stride=2, padding=1),
                           nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(6, 3)).eval()
    assert camkit.auto_layer(volume, torch.rand(1, 1, 8, 8, 8))[0] == "3"
    pooled = nn.Sequential(nn.Conv3d(1, 4, 3, stride=8), nn.Flatten(), nn.Linear(4, 3)).eval()
    with pytest.raises(camkit.LayerNotFoundError, match="no CAM layer found automatically in Sequential for this 8x8x8"):
        camkit.auto_layer(pooled, torch.rand(1, 1, 8, 8, 8))


def test_a_signal_layers_type_decides_before_its_shape():
    # [B, 4, 30] from an unpadded strided Conv1d on 64 samples: 30 is no stride of 64 but 4 is
    # (64 / 16); the Conv1d is channel-first whatever its shape suggests.
    net = nn.Sequential(nn.Conv1d(1, 4, 5, stride=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(4, 2))
    assert grid_shape(net[0], (2, 4, 30), (64,)) == (30,)
    e = camkit.GradCAM(net, "0").explain(torch.rand(2, 1, 64))
    assert e.raw.shape == (2, 30) and e.maps.shape == (2, 64)
    # The ReLU after it is channel-first in a plain convolutional network.
    relu = camkit.GradCAM(net, "1").explain(torch.rand(2, 1, 64))
    assert relu.raw.shape == (2, 30)
    # A LayerNorm is channel-last even where its length would fit.
    assert grid_shape(nn.LayerNorm(8), (2, 16, 8), (64,)) == (16,)


def test_a_volume_layers_type_decides_before_its_shape():
    # [B, 4, 32, 32, 30] on an 8x64x64 input: only the channel-last reading (4 slices of 32x32 and
    # 30 channels) fits by shape, but a Conv3d is channel-first.
    assert grid_shape(nn.Conv3d(1, 4, 1), (2, 4, 32, 32, 30), (8, 64, 64)) == (32, 32, 30)
    # A module whose type does not say: the shape decides, unless the model is a plain conv network.
    assert grid_shape(nn.ReLU(), (2, 4, 32, 32, 30), (8, 64, 64)) == (4, 32, 32)
    assert grid_shape(nn.ReLU(), (2, 4, 32, 32, 30), (8, 64, 64), conv_model=True) == (32, 32, 30)
    # Images keep their rule: the shape first, the type only when both readings fit.
    assert grid_shape(nn.Conv2d(1, 4, 1), (2, 14, 14, 30), (224, 224)) == (14, 14)
