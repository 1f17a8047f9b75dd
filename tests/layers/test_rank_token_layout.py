"""Token grids a model's configuration fixes (camkit.layers.token_layout), and the frames-first wrapper."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import camkit
from camkit.errors import InvalidInputError
from camkit.layers import ChannelsFirstVideo, TokenLayout, check_frames_order, default_layer, prefix_token_hint
from camkit.layers.families import token_layout
from camkit.layers.layout import grid_shape, layer_grid, token_prefix
from camkit.layers.token_layout import layout_grid, layout_to_grid

TIMESFORMER = TokenLayout(prefix=1, strides=(1, 8, 8), order=(1, 2, 0))


def test_fixed_strides_give_the_grid_and_the_prefix_is_what_is_left():
    videomae = TokenLayout(prefix=0, strides=(2, 16, 16))
    assert layout_grid(8 * 14 * 14, (16, 224, 224), videomae) == (0, (8, 14, 14))  # 2x28x28 is never tried
    assert layout_grid(1 + 4 * 4 * 4, (4, 32, 32), TIMESFORMER) == (1, (4, 4, 4))
    assert layout_grid(4 * 4 * 4, (4, 32, 32), TIMESFORMER) == (0, (4, 4, 4))  # a layer without the class token
    assert layout_grid(2 + 4 * 4 * 4, (4, 32, 32), TIMESFORMER) is None  # two extra tokens: not this layout
    assert layout_grid(8 * 14 * 14, (16, 224, 224), TokenLayout(prefix=0, strides=(2, 16))) is None  # other rank
    assert layout_grid(7 * 7, (224, 224), TokenLayout(prefix=0, strides=(32, 32))) == (0, (7, 7))


def test_free_axes_are_inferred_from_what_the_fixed_ones_leave():
    mvit = TokenLayout(prefix=1, strides=(2, None, None))
    assert layout_grid(1 + 8 * 56 * 56, (16, 224, 224), mvit) == (1, (8, 56, 56))
    assert layout_grid(1 + 8 * 7 * 7, (16, 224, 224), mvit) == (1, (8, 7, 7))
    # 15 frames: a padded patch embedding rounds up (8 slices), never a 7-slice misfit
    assert layout_grid(1 + 8 * 7 * 7, (15, 224, 224), mvit) == (1, (8, 7, 7))
    assert layout_grid(1 + 8 * 7 * 5, (16, 224, 160), mvit) == (1, (8, 7, 5))


def test_tokens_in_the_model_order_come_back_on_the_grid_exactly():
    grid = torch.randn(2, 3, 4, 2, 5)  # [B, D, t, h, w]
    patch_major = grid.permute(0, 3, 4, 2, 1).reshape(2, 2 * 5 * 4, 3)  # (h, w, t) order, like TimeSformer's
    cls = torch.randn(2, 1, 3)
    tokens = torch.cat([cls, patch_major], dim=1)
    assert torch.equal(layout_to_grid(tokens, 1, (4, 2, 5), (1, 2, 0)), grid)
    row_major = grid.flatten(2).transpose(1, 2)
    assert torch.equal(layout_to_grid(row_major, 0, (4, 2, 5), None), grid)
    assert not torch.equal(layout_to_grid(tokens, 1, (4, 2, 5), None), grid)  # the generic reading misreads them
    with pytest.raises(InvalidInputError, match="each of the grid's 3 axes once"):
        layout_to_grid(tokens, 1, (4, 2, 5), (0, 0, 1))


def test_layer_grid_and_grid_shape_follow_the_layout():
    grid = torch.randn(2, 6, 4, 4, 4)
    tokens = torch.cat([torch.randn(2, 1, 6), grid.permute(0, 3, 4, 2, 1).reshape(2, 64, 6)], dim=1)
    size = (4, 32, 32)
    assert torch.equal(layer_grid("norm", nn.LayerNorm(6), tokens, size, prefix_hint=TIMESFORMER), grid)
    assert grid_shape(nn.LayerNorm(6), tuple(tokens.shape), size, TIMESFORMER) == (4, 4, 4)
    assert token_prefix(65, size, TIMESFORMER) == 1 and token_prefix(64, size, TIMESFORMER) == 0
    # the same tokens without the model's layout: two grids fit, and camkit asks
    assert grid_shape(nn.LayerNorm(6), tuple(tokens.shape), size, 1) is None
    with pytest.raises(InvalidInputError, match="several grids"):
        layer_grid("norm", nn.LayerNorm(6), tokens, size, prefix_hint=1)
    # tokens of a non-row-major model that fit none of its grids: refused, never read row-major
    odd = torch.randn(2, 1 + 2 * 16, 6)
    assert grid_shape(nn.LayerNorm(6), tuple(odd.shape), size, TIMESFORMER) is None
    with pytest.raises(InvalidInputError, match="not in row-major order; pass reshape="):
        layer_grid("norm", nn.LayerNorm(6), odd, size, prefix_hint=TIMESFORMER)
    # a row-major layout that does not fit falls back to inference (a pooled stage)
    pooled = torch.randn(2, 1 + 2 * 2 * 2, 6)
    assert layer_grid("s", nn.LayerNorm(6), pooled, size, prefix_hint=TokenLayout(1, (1, 8, 8))).shape == (2, 6, 2, 2, 2)
    assert layer_grid("n", nn.LayerNorm(6), tokens, size, prefix_hint=TIMESFORMER, reshape=lambda t: grid).data_ptr() \
        == grid.data_ptr()  # reshape= still overrides everything


def _fake_videomae(config: object) -> nn.Module:
    """Shaped like transformers' VideoMAEForVideoClassification (names only)."""
    model = type("VideoMAEForVideoClassification", (nn.Module,), {})()
    model.config = config
    model.videomae = nn.Module()
    model.videomae.encoder = nn.Module()
    model.videomae.encoder.layer = nn.ModuleList(nn.Module() for _ in range(3))
    for block in model.videomae.encoder.layer:
        block.layernorm_before = nn.LayerNorm(4)
    return model


def test_the_wrapper_is_looked_through_for_defaults_layouts_and_prefixes():
    model = _fake_videomae(SimpleNamespace(tubelet_size=2, patch_size=16))
    wrapped = ChannelsFirstVideo(model)
    assert default_layer(model) == "videomae.encoder.layer.2.layernorm_before"
    assert default_layer(wrapped) == "model.videomae.encoder.layer.2.layernorm_before"
    assert default_layer(nn.DataParallel(wrapped)) == "model.videomae.encoder.layer.2.layernorm_before"
    assert prefix_token_hint(wrapped) == TokenLayout(prefix=0, strides=(2, 16, 16))
    assert token_layout(wrapped) == token_layout(model)
    # a config that does not say: no layout, and the prefix count of the family
    assert prefix_token_hint(ChannelsFirstVideo(_fake_videomae(SimpleNamespace()))) == 0
    assert default_layer(ChannelsFirstVideo(nn.Conv3d(3, 4, 1))) is None


def test_frames_first_families_are_refused_bare_and_pass_wrapped():
    model = _fake_videomae(SimpleNamespace(tubelet_size=2, patch_size=16))
    with pytest.raises(InvalidInputError, match=r"\(VideoMAE\) takes videos as pixel_values \[B, T, C, H, W\]"):
        check_frames_order(model)
    with pytest.raises(InvalidInputError, match="ChannelsFirstVideo"):
        camkit.layers.resolve_layers(model, "videomae.encoder.layer.0.layernorm_before")
    check_frames_order(ChannelsFirstVideo(model))
    check_frames_order(nn.Conv3d(3, 4, 1))  # not a frames-first family


def test_torchvision_tokens_keep_the_vit_count_and_give_mvit_its_time_stride():
    from torchvision.models import VisionTransformer
    from torchvision.models.video.mvit import MSBlockConfig, MViT

    vit = VisionTransformer(image_size=16, patch_size=8, num_layers=1, num_heads=1, hidden_dim=4, mlp_dim=8)
    assert prefix_token_hint(vit) == 1  # an int, as before: images keep their reading
    blocks = [MSBlockConfig(1, 8, 8, [3] * 3, [3] * 3, [1] * 3, [1] * 3)] * 2
    mvit = MViT(spatial_size=(16, 16), temporal_size=4, block_setting=blocks, residual_pool=True,
                residual_with_cls_embed=False, rel_pos_embed=True, proj_after_attn=True, patch_embed_stride=(1, 4, 4))
    assert prefix_token_hint(mvit) == TokenLayout(prefix=1, strides=(1, None, None))
