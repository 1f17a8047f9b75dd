"""Token and channel-last layouts: the pure reshape, grid inference, layout rules, and explainers on them."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torchvision.ops.misc import Permute

import camkit
import camkit.functional as CF
from camkit.layers import known_channels_last, prefix_token_hint

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tokens_to_grid_matches_hand_made_layout():
    # B=2, one class token, a 2 x 3 patch grid, D=2: token (i, j) of sample b, channel d holds 100b + 10i + j + 0.5d
    b, h, w, d = 2, 2, 3, 2
    tokens = torch.full((b, 1 + h * w, d), -999.0)
    for s in range(b):
        for i in range(h):
            for j in range(w):
                for c in range(d):
                    tokens[s, 1 + i * w + j, c] = 100 * s + 10 * i + j + 0.5 * c
    before = tokens.clone()
    grid = CF.tokens_to_grid(tokens, (20, 30))
    assert grid.shape == (2, 2, 2, 3)
    expected = torch.tensor(
        [[[[0.0, 1.0, 2.0], [10.0, 11.0, 12.0]], [[0.5, 1.5, 2.5], [10.5, 11.5, 12.5]]],
         [[[100.0, 101.0, 102.0], [110.0, 111.0, 112.0]], [[100.5, 101.5, 102.5], [110.5, 111.5, 112.5]]]]
    )
    assert torch.equal(grid, expected)
    assert torch.equal(tokens, before)
    assert torch.equal(CF.tokens_to_grid(tokens, grid=(2, 3)), expected)  # prefix = N - h*w


@pytest.mark.parametrize(
    ("count", "size", "expected"),
    [
        (197, (224, 224), (1, 14, 14)),  # class token
        (196, (224, 224), (0, 14, 14)),  # no prefix (e.g. pooled ViTs)
        (198, (224, 224), (2, 14, 14)),  # class + distillation token (DeiT)
        (1 + 4 + 256, (256, 256), (5, 16, 16)),  # class + 4 registers
        (1 + 4 + 12 * 18, (192, 288), (5, 12, 18)),  # registers, non-square
        (1 + 2 * 8, (16, 64), (1, 2, 8)),  # 1:4 input
        (1 + 7 * 5, (100, 70), (1, 7, 5)),  # sides not multiples of the patch (16): ceil grid 7 x 5
        (1 + 6 * 4, (100, 70), (1, 6, 4)),  # the same input, floor grid 6 x 4
        (1 + 4 + 4 * 9, (32, 72), (5, 4, 9)),  # exact 4 x 9 (stride 8) beats rounded 1 + 4 x 10 (stride 7)
    ],
)
def test_infer_token_grid(count, size, expected):
    assert CF.infer_token_grid(count, size) == expected


def test_infer_token_grid_with_known_prefix_and_failure():
    # 17 tokens on a square input: 1 + 4x4 is found first; a known prefix of 8 forces 3x3
    assert CF.infer_token_grid(17, (32, 32)) == (1, 4, 4)
    assert CF.infer_token_grid(17, (32, 32), prefix=8) == (8, 3, 3)
    # a non-divisible input with many prefix tokens is misread (documented); a known prefix fixes it
    assert CF.infer_token_grid(1 + 7 * 4, (100, 60)) == (14, 5, 3)
    assert CF.infer_token_grid(1 + 7 * 4, (100, 60), prefix=1) == (1, 7, 4)
    with pytest.raises(camkit.InvalidInputError, match="reshape="):
        CF.infer_token_grid(27, (32, 64), max_prefix=2)  # 27, 26, 25 tokens: no integer stride gives such a grid
    with pytest.raises(camkit.InvalidInputError, match="needs 9 tokens"):
        CF.tokens_to_grid(torch.zeros(1, 10, 2), grid=(3, 3), prefix=0)


def test_channels_last_rules():
    assert CF.guess_channels_last((1, 7, 7, 768), (224, 224)) is True
    assert CF.guess_channels_last((1, 512, 7, 7), (224, 224)) is False
    assert CF.guess_channels_last((1, 4, 6, 96), (64, 96)) is True  # non-square channel-last
    assert CF.guess_channels_last((1, 10, 2, 9), (64, 96)) is False  # neither fits: PyTorch convention
    with pytest.raises(camkit.InvalidInputError, match="reshape="):
        CF.guess_channels_last((1, 7, 7, 7), (224, 224))
    x = torch.arange(24.0).view(1, 2, 3, 4)
    assert torch.equal(CF.channels_last_to_grid(x)[0, :, 1, 2], x[0, 1, 2, :])


def test_known_layouts_by_module_type():
    from torchvision.models.convnext import LayerNorm2d

    assert known_channels_last(Permute([0, 2, 3, 1])) is True
    assert known_channels_last(Permute([0, 3, 1, 2])) is False
    assert known_channels_last(nn.LayerNorm(4)) is True
    assert known_channels_last(LayerNorm2d(4)) is False
    assert known_channels_last(nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU())) is False
    assert known_channels_last(nn.GELU()) is None


class TokenNet(nn.Module):
    """Patch conv -> class + register tokens -> a token-mixing block -> class token head."""

    def __init__(self, registers: int = 2, dim: int = 6, patch: int = 4, classes: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.prefix = nn.Parameter(torch.randn(1, 1 + registers, dim))
        self.norm = nn.LayerNorm(dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.prefix.expand(x.shape[0], -1, -1), tokens], dim=1)
        tokens = self.norm(tokens)  # [B, N, D]: the CAM layer
        weights = torch.softmax(tokens @ tokens[:, :1].transpose(1, 2), dim=1)  # attention of the class token
        return self.head(self.mix((weights * tokens).sum(dim=1)))


def _manual_gradcam_on_tokens(model: TokenNet, x: Tensor, target: int, prefix: int, grid: tuple[int, int]) -> Tensor:
    seen = {}

    def keep(module, args, out):
        out.retain_grad()
        seen["t"] = out

    handle = model.norm.register_forward_hook(keep)
    try:
        model(x)[:, target].sum().backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    t, g = seen["t"].detach(), seen["t"].grad
    acts = t[:, prefix:].reshape(x.shape[0], *grid, -1).permute(0, 3, 1, 2)
    grads = g[:, prefix:].reshape(x.shape[0], *grid, -1).permute(0, 3, 1, 2)
    weights = grads.mean(dim=(2, 3))
    return torch.relu((weights[:, :, None, None] * acts).sum(dim=1))


@pytest.mark.parametrize(("size", "grid"), [((16, 16), (4, 4)), ((8, 24), (2, 6)), ((20, 12), (5, 3))])
def test_gradcam_on_tokens_equals_hand_reshape(size, grid):
    model = TokenNet().eval()
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(3))
    explanation = camkit.GradCAM(model, "norm").explain(x, 1)
    expected = _manual_gradcam_on_tokens(model, x, 1, prefix=3, grid=grid)
    assert explanation.raw.shape == (2, *grid)
    torch.testing.assert_close(explanation.raw, expected, atol=1e-5, rtol=1e-4)
    assert explanation.maps.shape == (2, *size)


def test_model_prefix_hint_is_used():
    model = TokenNet(registers=7).eval()  # 8 prefix tokens: 8 + 3x3 = 17, which would read as 1 + 4x4
    x = torch.randn(1, 3, 12, 12)
    # without a hint the shape rule reads the fewest prefix tokens: 1 + 4x4
    assert camkit.GradCAM(model, "norm").explain(x, 0).raw.shape == (1, 4, 4)
    model.num_prefix_tokens = 8  # the timm convention
    assert prefix_token_hint(model) == 8
    raw = camkit.GradCAM(model, "norm").explain(x, 0).raw
    torch.testing.assert_close(raw, _manual_gradcam_on_tokens(model, x, 0, prefix=8, grid=(3, 3)), atol=1e-5, rtol=1e-4)


class ChannelLastNet(nn.Module):
    """conv -> NHWC -> LayerNorm (the CAM layer, channel-last) -> Linear -> back to NCHW -> pool -> head."""

    def __init__(self, channels: int = 5) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.to_last = Permute([0, 2, 3, 1])
        self.norm = nn.LayerNorm(channels)
        self.act = nn.GELU()
        self.fc = nn.Linear(channels, channels)
        self.to_first = Permute([0, 3, 1, 2])
        self.head = nn.Linear(channels, 4)

    def forward(self, x: Tensor) -> Tensor:
        y = self.to_first(self.fc(self.act(self.norm(self.to_last(self.conv(x))))))
        return self.head(y.mean(dim=(2, 3)))


def test_channel_last_layer_equals_channel_first_view():
    model = ChannelLastNet().eval()
    x = torch.randn(2, 3, 6, 10, generator=torch.Generator().manual_seed(2))
    # "act" (GELU) has no layout of its own: the shape rule finds [B, 6, 10, 5] channel-last
    for layer in ("norm", "act"):
        got = camkit.GradCAM(model, layer).explain(x, 2)
        # the same layer read through reshape= by hand must agree
        manual = camkit.GradCAM(model, layer, reshape=lambda t: t.permute(0, 3, 1, 2)).explain(x, 2)
        assert got.raw.shape == (2, 6, 10)
        torch.testing.assert_close(got.raw, manual.raw, atol=1e-6, rtol=0)
    # and it differs from reading the map as channel-first (a test that could fail)
    wrong = camkit.GradCAM(model, "act", reshape=lambda t: t).explain(x, 2)
    assert wrong.raw.shape == (2, 10, 5)


def test_ambiguous_layout_asks_for_reshape_and_reshape_overrides():
    model = ChannelLastNet(channels=8).eval()
    x = torch.randn(1, 3, 8, 8)  # GELU output [1, 8, 8, 8] fits both layouts
    with pytest.raises(camkit.InvalidInputError, match="reshape="):
        camkit.GradCAM(model, "act").explain(x, 0)
    out = camkit.GradCAM(model, "act", reshape=lambda t: t.permute(0, 3, 1, 2)).explain(x, 0)
    assert out.raw.shape == (1, 8, 8) and torch.isfinite(out.raw).all()
    with pytest.raises(camkit.InvalidInputError, match=r"reshape= must return a tensor \[B, C, h, w\]"):
        camkit.GradCAM(model, "act", reshape=lambda t: t.flatten(1)).explain(x, 0)
