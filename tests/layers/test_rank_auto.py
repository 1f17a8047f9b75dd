"""The automatic layer on video, volume and signal models built from code (random init, small inputs).

For each family of issue 26, ``camkit.GradCAM(model)`` with no layer must pick the stage a
user would pick and give exactly the Grad-CAM written out here by hand at that stage
(forward hook, ``torch.autograd.grad``, weights = the gradient's mean over every spatial
axis, ReLU of the weighted channel sum, linear / trilinear upsampling, min-max per sample),
or ask for a layer. Token layouts are read by hand with the order the model's source uses,
so a misread order or grid fails here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torchvision.models.video as tvv
from torch import Tensor, nn

import camkit
from camkit.errors import InvalidInputError, LayerNotFoundError
from camkit.functional import infer_token_grid
from camkit.layers import ChannelsFirstVideo

try:  # MONAI's cases skip without it; the torchvision and Hugging Face cases still run
    import monai.networks.nets as monai_nets
except ImportError:  # pragma: no cover - MONAI is a test dependency
    monai_nets = None
needs_monai = pytest.mark.skipif(monai_nets is None, reason="MONAI is not installed")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}
Grid = Callable[[Tensor], Tensor]


def logits_of(output: Any) -> Tensor:
    return output if isinstance(output, Tensor) else output.logits


def top1(output: Any) -> Tensor:
    logits = logits_of(output)
    return logits.gather(1, logits.argmax(dim=1, keepdim=True))[:, 0]


def hand_gradcam(
    model: nn.Module, module: nn.Module, x: Tensor, to_grid: Grid, score: Callable[[Any], Tensor] = top1
) -> tuple[Tensor, Tensor]:
    """Grad-CAM at ``module``, by hand: (maps [B, *S] in [0, 1], raw maps [B, *grid])."""
    seen: list[Tensor] = []

    def keep(module: nn.Module, args: Any, output: Tensor) -> Tensor:
        seen.append(output)
        return output.clone()  # an in-place op after the layer (SegResNet's ReLU) changes the copy

    handle = module.register_forward_hook(keep)
    try:
        output = model(x)
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(score(output).sum(), seen[-1])
    acts, grads = to_grid(seen[-1].detach()), to_grid(grad)
    spatial = tuple(range(2, acts.dim()))
    raw = torch.relu((grads.mean(dim=spatial, keepdim=True) * acts).sum(dim=1))
    up = F.interpolate(raw[:, None], size=tuple(x.shape[2:]), mode=MODES[x.dim() - 2], align_corners=False)[:, 0]
    flat = up.flatten(1)
    low, high = flat.amin(dim=1, keepdim=True), flat.amax(dim=1, keepdim=True)
    return ((flat - low) / (high - low).clamp_min(1e-30)).view_as(up), raw


def channels_first(t: Tensor) -> Tensor:
    return t


def channels_last(t: Tensor) -> Tensor:
    return t.permute(0, t.dim() - 1, *range(1, t.dim() - 1))


def tokens(prefix: int, grid: tuple[int, ...], order: tuple[int, ...] = (0, 1, 2)) -> Grid:
    """Tokens after ``prefix`` that run over ``grid``'s axes in ``order`` (slowest first), to [B, D, *grid]."""

    def to_grid(t: Tensor) -> Tensor:
        laid = t[:, prefix:].reshape(t.shape[0], *(grid[a] for a in order), t.shape[2])
        return laid.permute(0, len(grid) + 1, *(1 + order.index(a) for a in range(len(grid))))

    return to_grid


def check_auto_matches_hand(
    model: nn.Module, x: Tensor, layer: str, grid: tuple[int, ...], to_grid: Grid, target: Any = None
) -> camkit.Explanation:
    model.eval()
    explanation = camkit.GradCAM(model).explain(x, target)
    assert explanation.layers == (layer,)
    score = top1 if target is None else target
    expected, raw = hand_gradcam(model, model.get_submodule(layer), x, to_grid, score)
    assert raw.shape == (x.shape[0], *grid)
    flat = raw.flatten(1)
    assert (flat.amax(dim=1) > flat.amin(dim=1)).all(), "the hand map is flat: the case tests nothing"
    assert explanation.raw.shape == raw.shape
    assert explanation.maps.shape == (x.shape[0], *x.shape[2:])
    torch.testing.assert_close(explanation.raw, raw, rtol=1e-4, atol=1e-5 * float(raw.abs().max()))
    torch.testing.assert_close(explanation.maps, expected, rtol=0, atol=1e-4)
    return explanation


def clip(batch: int, channels: int, *size: int, seed: int = 0) -> Tensor:
    return torch.randn(batch, channels, *size, generator=torch.Generator().manual_seed(seed))


# --- torchvision's video classifiers -------------------------------------------------------------

VIDEO_RESNETS = [("r3d_18", 16, (2, 2, 2)), ("mc3_18", 8, (8, 2, 2)), ("r2plus1d_18", 8, (1, 2, 2))]


@pytest.mark.heavy
@pytest.mark.parametrize(("name", "frames", "grid"), VIDEO_RESNETS, ids=[n for n, _, _ in VIDEO_RESNETS])
def test_torchvision_video_resnets_explain_layer4(name, frames, grid):
    # r3d_18 and r2plus1d_18 stride time by 8, mc3_18 keeps it (3-D convolutions in its stem only)
    torch.manual_seed(0)
    model = getattr(tvv, name)(num_classes=5)
    explanation = check_auto_matches_hand(model, clip(2, 3, frames, 32, 32), "layer4", grid, channels_first)
    assert explanation.frame_share.shape == (2, frames)


def test_torchvision_s3d_explains_its_features():
    torch.manual_seed(0)
    model = tvv.s3d(num_classes=5)
    # s3d's AvgPool3d((2, 7, 7)) needs a 16x224x224 clip; an adaptive pool keeps the family at a test's size
    # (the full-size model: test_torchvision_s3d_full_size, marked slow)
    model.avgpool = nn.AdaptiveAvgPool3d(1)
    check_auto_matches_hand(model, clip(2, 3, 16, 64, 64), "features", (2, 2, 2), channels_first)


@pytest.mark.heavy
def test_torchvision_swin3d_explains_its_last_stage_channel_last():
    torch.manual_seed(0)
    model = tvv.swin3d_t(num_classes=5)
    check_auto_matches_hand(model, clip(2, 3, 8, 64, 64), "features.6", (4, 2, 2), channels_last)


def _tiny_mvit(v2: bool) -> nn.Module:
    from torchvision.models.video.mvit import MSBlockConfig, MViT

    def block(heads: int, cin: int, cout: int, stride_q: list[int], stride_kv: list[int]) -> MSBlockConfig:
        return MSBlockConfig(heads, cin, cout, [3, 3, 3], [3, 3, 3], stride_q, stride_kv)

    torch.manual_seed(0)
    blocks = [block(1, 16, 16, [1, 1, 1], [1, 2, 2]), block(2, 16, 32, [1, 2, 2], [1, 1, 1]),
              block(2, 32, 32, [1, 1, 1], [1, 1, 1])]
    model = MViT(spatial_size=(32, 32), temporal_size=8, block_setting=blocks, residual_pool=v2,
                 residual_with_cls_embed=not v2, rel_pos_embed=v2, proj_after_attn=v2, num_classes=5)
    with torch.no_grad():  # torchvision initialises the head to small values; a livelier head for the test
        model.head[1].weight.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("v2", [False, True], ids=["mvit_v1", "mvit_v2"])
def test_torchvision_mvit_reads_its_class_token_and_its_time_stride(v2):
    # The last stage's 64 tokens of an 8x32x32 clip fit 4x4x4 and 1x8x8: the time stride of the
    # patch embedding (2) settles it. mvit_v1_b / mvit_v2_s at 16x224x224: test_torchvision_mvit_full_size.
    with pytest.raises(InvalidInputError, match="several grids"):
        infer_token_grid(1 + 64, (8, 32, 32), prefix=1)
    model = _tiny_mvit(v2)
    check_auto_matches_hand(model, clip(2, 3, 8, 32, 32), "blocks.2.norm1", (4, 4, 4), tokens(1, (4, 4, 4)))


# --- MONAI's 3-D networks --------------------------------------------------------------------------

MONAI_CLASSIFIERS = [
    ("densenet121", lambda: monai_nets.DenseNet121(spatial_dims=3, in_channels=1, out_channels=4), 64, "features"),
    ("resnet10", lambda: monai_nets.resnet10(spatial_dims=3, n_input_channels=1, num_classes=4), 32, "layer4"),
    ("seresnet50", lambda: monai_nets.SEResNet50(layers=(1, 1, 1, 1), spatial_dims=3, in_channels=1, num_classes=4),
     64, "layer4"),
    ("efficientnet_b0", lambda: monai_nets.EfficientNetBN("efficientnet-b0", spatial_dims=3, in_channels=1,
                                                          num_classes=4, pretrained=False), 64, "_swish"),
]


@pytest.mark.heavy
@pytest.mark.parametrize(("name", "build", "side", "layer"), MONAI_CLASSIFIERS, ids=[c[0] for c in MONAI_CLASSIFIERS])
@needs_monai
def test_monai_3d_classifiers_explain_their_last_map(name, build, side, layer):
    torch.manual_seed(0)
    check_auto_matches_hand(build(), clip(2, 1, side, side, side), layer, (2, 2, 2), channels_first)


def _segmentation_target() -> camkit.SegmentationTarget:
    mask = torch.zeros(32, 32, 32)
    mask[8:24, 8:24, 8:24] = 1.0
    return camkit.SegmentationTarget(1, mask=mask)


MONAI_SEGMENTERS = [
    ("unet", lambda: monai_nets.UNet(spatial_dims=3, in_channels=1, out_channels=3, channels=(8, 16, 32),
                                     strides=(2, 2), num_res_units=1), "model.1", (16, 16, 16)),
    ("segresnet", lambda: monai_nets.SegResNet(spatial_dims=3, in_channels=1, out_channels=3, init_filters=8),
     "conv_final.0", (32, 32, 32)),
]


@pytest.mark.parametrize(("name", "build", "layer", "grid"), MONAI_SEGMENTERS, ids=[c[0] for c in MONAI_SEGMENTERS])
@needs_monai
def test_monai_3d_segmenters_explain_their_last_features_before_the_output_conv(name, build, layer, grid):
    torch.manual_seed(0)
    model = build()
    assert camkit.default_layer(model) == layer
    x = clip(2, 1, 32, 32, 32)
    explanation = check_auto_matches_hand(model, x, layer, grid, channels_first, _segmentation_target())
    assert explanation.maps.shape == (2, 32, 32, 32)


@needs_monai
def test_monai_segresnet_relu_of_a_cube_is_read_channel_first():
    # [B, 8, 32, 32, 32] after a ReLU (no layout of its own) fits [B, C, D, H, W] and [B, D, H, W, C] by its
    # shape; SegResNet is a plain convolutional network (camkit.layers.layout.conv_ranks), so it is channel-first.
    model = monai_nets.SegResNet(spatial_dims=3, in_channels=1, out_channels=3, init_filters=8).eval()
    x = clip(1, 1, 32, 32, 32)
    explanation = camkit.GradCAM(model, "act_mod").explain(x, _segmentation_target())
    expected, raw = hand_gradcam(model, model.act_mod, x, channels_first, _segmentation_target())
    assert raw.shape == (1, 32, 32, 32)
    torch.testing.assert_close(explanation.raw, raw, rtol=1e-4, atol=1e-5 * float(raw.abs().max()))
    torch.testing.assert_close(explanation.maps, expected, rtol=0, atol=1e-4)


@needs_monai
def test_monai_rules_serve_every_rank():
    # one rule for every spatial_dims; a 2-D DenseNet keeps the default it had (timm's rule matched it by name)
    image = monai_nets.DenseNet121(spatial_dims=2, in_channels=1, out_channels=4)
    assert camkit.default_layer(image) == "features"
    rows = dict(camkit.layers.default_layer_table())
    assert rows["DenseNet (MONAI)"].startswith("features")
    assert rows["VideoResNet"] == "layer4"


# --- Hugging Face video transformers, frames first -------------------------------------------------

def _hf(config_class: str, model_class: str, **extra: Any) -> nn.Module:
    config = getattr(transformers, config_class)(image_size=32, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                                 num_attention_heads=2, intermediate_size=64, num_labels=5, **extra)
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config).eval()


def videomae() -> nn.Module:
    return _hf("VideoMAEConfig", "VideoMAEForVideoClassification", patch_size=8, num_frames=8, tubelet_size=2)


def timesformer() -> nn.Module:
    return _hf("TimesformerConfig", "TimesformerForVideoClassification", patch_size=8, num_frames=4)


def vivit() -> nn.Module:
    return _hf("VivitConfig", "VivitForVideoClassification", num_frames=8, tubelet_size=[2, 8, 8])


def test_videomae_tubelets_are_time_major_on_the_configured_grid():
    # 64 tubelet tokens of an 8x32x32 clip fit 4x4x4 and 1x8x8: the config's tubelet and patch sizes decide
    with pytest.raises(InvalidInputError, match="several grids"):
        infer_token_grid(64, (8, 32, 32), prefix=0)
    model = ChannelsFirstVideo(videomae())
    x = clip(2, 3, 8, 32, 32)
    check_auto_matches_hand(model, x, "model.videomae.encoder.layer.1.layernorm_before", (4, 4, 4),
                            tokens(0, (4, 4, 4)))


def test_timesformer_tokens_are_read_patch_major():
    # TimeSformer's hidden states run patch by patch, each patch's frames in a row (h, w, t):
    # the row-major (t, h, w) reading of the same tokens gives another map, which must not be camkit's
    model = ChannelsFirstVideo(timesformer())
    x = clip(2, 3, 4, 32, 32)
    layer = "model.timesformer.encoder.layer.1.temporal_dense"
    explanation = check_auto_matches_hand(model, x, layer, (4, 4, 4), tokens(0, (4, 4, 4), order=(1, 2, 0)))
    _, misread = hand_gradcam(model, model.get_submodule(layer), x, tokens(0, (4, 4, 4)), top1)
    assert (explanation.raw - misread).abs().amax() > 1e-3 * misread.abs().amax()


def test_timesformer_clip_batch_equals_its_clips_one_by_one():
    model = ChannelsFirstVideo(timesformer())
    x = clip(3, 3, 4, 32, 32, seed=3)
    together = camkit.GradCAM(model).explain(x).maps
    alone = torch.cat([camkit.GradCAM(model).explain(x[i : i + 1]).maps for i in range(3)])
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)


class ClipClassifier(nn.Module):
    """A user's classifier around a TimesformerModel backbone: takes [B, C, T, H, W], transposes itself."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = timesformer().timesformer
        torch.manual_seed(1)
        self.head = nn.Linear(32, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone(x.transpose(1, 2)).last_hidden_state[:, 0])


def test_a_recognised_backbone_inside_a_users_model_lends_its_token_order():
    # no family rule knows ClipClassifier: the generic rule picks the layer, the backbone's layout reads it
    model = ClipClassifier().eval()
    assert camkit.default_layer(model) is None
    layer = "backbone.encoder.layer.1.temporal_dense"
    check_auto_matches_hand(model, clip(2, 3, 4, 32, 32), layer, (4, 4, 4), tokens(0, (4, 4, 4), order=(1, 2, 0)))


def test_vivit_tubelets_after_the_class_token():
    model = ChannelsFirstVideo(vivit())
    check_auto_matches_hand(model, clip(2, 3, 8, 32, 32), "model.vivit.layers.1.layernorm_before", (4, 4, 4),
                            tokens(1, (4, 4, 4)))


@pytest.mark.parametrize("build", [videomae, timesformer, vivit], ids=["videomae", "timesformer", "vivit"])
def test_bare_frames_first_models_are_refused_with_the_wrapper_named(build):
    model = build()
    for layer in (None, camkit.layers.default_layer(ChannelsFirstVideo(model))[len("model."):]):
        with pytest.raises(InvalidInputError, match=r"ChannelsFirstVideo\(model\).*\[B, T, H, W\]"):
            camkit.GradCAM(model, layer).explain(clip(1, 3, 8, 32, 32))


def test_without_the_family_rules_ambiguous_video_tokens_are_passed_over(monkeypatch):
    # The generic rule alone cannot tell 4x4x4 tokens from 1x8x8 ones: it never reads them. VideoMAE's
    # tubelet Conv3d still gives an unambiguous [B, D, t, h, w] map; TimeSformer's Conv2d runs frame by
    # frame (batch B*T), so nothing qualifies and camkit asks for a layer.
    monkeypatch.setattr(camkit.layers.families, "family_rule", lambda model: None)
    model = ChannelsFirstVideo(videomae())
    assert camkit.default_layer(model) is None and camkit.layers.prefix_token_hint(model) is None
    check_auto_matches_hand(model, clip(2, 3, 8, 32, 32), "model.videomae.embeddings.patch_embeddings.projection",
                            (4, 4, 4), channels_first)
    with pytest.raises(LayerNotFoundError, match="Pass layer="):
        camkit.GradCAM(ChannelsFirstVideo(timesformer())).explain(clip(2, 3, 4, 32, 32))


def test_the_wrapper_transposes_time_and_channels_and_nothing_else():
    seen: list[Tensor] = []

    class FramesFirst(nn.Module):
        def forward(self, pixel_values: Tensor, scale: float = 1.0) -> Tensor:
            seen.append(pixel_values)
            return pixel_values.flatten(2).sum(dim=2) * scale

    x = clip(2, 3, 5, 4, 4)
    out = ChannelsFirstVideo(FramesFirst())(x, scale=2.0)
    assert torch.equal(seen[0], x.transpose(1, 2)) and seen[0].shape == (2, 5, 3, 4, 4)
    assert torch.allclose(out, 2.0 * x.transpose(1, 2).flatten(2).sum(dim=2))
    with pytest.raises(InvalidInputError, match=r"\[B, C, T, H, W\]"):
        ChannelsFirstVideo(FramesFirst())(torch.zeros(2, 3, 4, 4))


# --- signals, and refusals ------------------------------------------------------------------------

class SignalNet(nn.Module):
    """An ECG-style Conv1d classifier: two conv-ReLU stages (32 channels, no length fits 32), pooled."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(
            nn.Conv1d(2, 32, 5, padding=2), nn.ReLU(), nn.Conv1d(32, 32, 3, stride=2, padding=1), nn.ReLU()
        )
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(32, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.pool(self.features(x)).flatten(1))


def test_conv1d_signal_model_explains_its_last_relu_with_linear_upsampling():
    # "features" is the Sequential whose output is its last ReLU's (the last module to finish with it)
    explanation = check_auto_matches_hand(SignalNet(), clip(3, 2, 16), "features", (8,), channels_first)
    assert explanation.maps.shape == (3, 16)


class Collapsing(nn.Module):
    """Its only convolution strides the whole input away: no layer gives a map of more than one position."""

    def __init__(self, spatial_dims: int) -> None:
        super().__init__()
        conv = {1: nn.Conv1d, 3: nn.Conv3d}[spatial_dims]
        self.conv = conv(1, 4, 8, stride=8)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.conv(x).flatten(1))


@pytest.mark.parametrize(("spatial_dims", "size", "shown"), [(1, (8,), "8 input"), (3, (8, 8, 8), "8x8x8 input")])
def test_nothing_qualifies_is_a_loud_refusal_asking_for_a_layer(spatial_dims, size, shown):
    with pytest.raises(LayerNotFoundError, match=rf"{shown}: no layer's output is a spatial map.*Pass layer="):
        camkit.GradCAM(Collapsing(spatial_dims)).explain(clip(2, 1, *size))


# --- full-size models (slow) ----------------------------------------------------------------------

@pytest.mark.slow
def test_torchvision_s3d_full_size():
    torch.manual_seed(0)
    check_auto_matches_hand(tvv.s3d(num_classes=5), clip(1, 3, 16, 224, 224), "features", (2, 7, 7), channels_first)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mvit_v1_b", "mvit_v2_s"])
def test_torchvision_mvit_full_size(name):
    # 393 tokens: a class token and 8x7x7 patches, which inference alone cannot tell from 2x14x14
    torch.manual_seed(0)
    model = getattr(tvv, name)(num_classes=5)
    with torch.no_grad():
        model.head[1].weight.normal_(0, 0.5)
    check_auto_matches_hand(model, clip(1, 3, 16, 224, 224), "blocks.15.norm1", (8, 7, 7), tokens(1, (8, 7, 7)))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["swin3d_s", "swin3d_b"])
def test_torchvision_larger_swin3d(name):
    torch.manual_seed(0)
    model = getattr(tvv, name)(num_classes=5)
    check_auto_matches_hand(model, clip(1, 3, 8, 64, 64), "features.6", (4, 2, 2), channels_last)


@pytest.mark.slow
@needs_monai
def test_monai_densenet169_3d():
    torch.manual_seed(0)
    model = monai_nets.DenseNet169(spatial_dims=3, in_channels=1, out_channels=4)
    check_auto_matches_hand(model, clip(1, 1, 64, 64, 64), "features", (2, 2, 2), channels_first)
