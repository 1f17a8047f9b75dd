"""timm and Hugging Face transformers models as users bring them: the automatic layer gives the right map.

Every model is built from code with a small config (random init, CPU, no downloads, seeded).
For each, ``camkit.GradCAM(model)`` with no layer must equal a Grad-CAM computed here by
hand at the layer pytorch-grad-cam's documentation recommends (or, where it says nothing,
the last layer whose output is a spatial map of the input before pooling), with that
layer's reshape written out in the case. The hand computation follows camkit's
conventions (camkit/functional/cam.py, maps.py): weights are the spatial mean of the
gradient of the summed top-1 scores, the map is ``relu(sum_c w_c A_c)``, upsampled
bilinearly (``align_corners=False``) to the input size, then min-max normalised per map
(a constant map gives zeros).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import camkit
import camkit.layers.families

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 0.02

Reshape = Callable[[Tensor], Tensor]


def nchw(t: Tensor) -> Tensor:
    return t


def nhwc(t: Tensor) -> Tensor:
    return t.permute(0, 3, 1, 2)


def tokens(prefix: int, h: int, w: int) -> Reshape:
    def reshape(t: Tensor) -> Tensor:
        return t[:, prefix:].reshape(t.shape[0], h, w, t.shape[2]).permute(0, 3, 1, 2)

    return reshape


class Case(NamedTuple):
    id: str
    build: Callable[[], nn.Module]
    size: int | tuple[int, int]  # the input's side (square) or (H, W)
    ref: Callable[[Any], nn.Module]  # the recommended layer, written as a user would
    reshape: Reshape  # that layer's output to [B, C, h, w]
    layer: str  # the dotted name camkit's default must give
    grid: tuple[int, int]  # the raw map's size
    xfail: str | None = None
    seed: int = 0  # model init seed; a few random inits give an all-negative (flat) Grad-CAM
    calibrate: bool = False  # set BatchNorm statistics from a batch (see _calibrate)




def _timm(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
    return lambda: timm.create_model(name, pretrained=False, num_classes=5, **kwargs)


def _mixer() -> nn.Module:
    from timm.models.mlp_mixer import MlpMixer

    return MlpMixer(num_classes=5, img_size=64, patch_size=16, num_blocks=2, embed_dim=64)


def _efficientformer() -> nn.Module:
    from timm.models.efficientformer import EfficientFormer

    # the attention bias of the last stage is fixed at 7 x 7: 224 px inputs, so small widths
    return EfficientFormer(depths=(1, 1, 1, 2), embed_dims=(8, 16, 24, 32), num_vit=1, num_classes=5)


TIMM_CASES = [
    Case("timm-resnet18", _timm("resnet18"), 64, lambda m: m.layer4[-1], nchw, "layer4", (2, 2)),
    Case("timm-resnet10t", _timm("resnet10t"), 64, lambda m: m.layer4[-1], nchw, "layer4", (2, 2)),
    Case("timm-resnext", _timm("resnext50_32x4d", layers=(1, 1, 1, 1)), 64, lambda m: m.layer4[-1], nchw,
         "layer4", (2, 2)),
    Case("timm-efficientnet_b0", _timm("efficientnet_b0"), 64, lambda m: m.bn2, nchw, "bn2", (2, 2)),
    Case("timm-mobilenetv3_small_050", _timm("mobilenetv3_small_050"), 64, lambda m: m.blocks[-1], nchw,
         "blocks.5", (2, 2)),
    Case("timm-convnext_atto", _timm("convnext_atto", conv_mlp=False), 64, lambda m: m.stages[-1].blocks[-1], nchw,
         "stages.3.blocks.1", (2, 2)),
    Case("timm-regnetx_002", _timm("regnetx_002"), 64, lambda m: m.s4, nchw, "s4", (2, 2)),
    Case("timm-densenet121", _timm("densenet121", growth_rate=8, block_config=(1, 1, 1, 1)), 64,
         lambda m: m.features, nchw, "features", (2, 2)),
    Case("timm-vgg11", _timm("vgg11", mlp_ratio=1 / 64), 64, lambda m: m.features[19], nchw, "features.19", (4, 4)),
    Case("timm-inception_v3", _timm("inception_v3"), 128, lambda m: m.Mixed_7c, nchw, "Mixed_7c", (2, 2)),
    Case("timm-xception41", _timm("xception41"), 64, lambda m: m.act, nchw, "act", (2, 2)),
    Case("timm-legacy_xception", _timm("legacy_xception"), 64, lambda m: m.act4, nchw, "act4", (2, 2), seed=4),
    Case("timm-vit_tiny", _timm("vit_tiny_patch16_224", img_size=64), 64, lambda m: m.blocks[-1].norm1,
         tokens(1, 4, 4), "blocks.11.norm1", (4, 4)),
    Case("timm-vit_tiny-dynamic-nonsquare", _timm("vit_tiny_patch16_224", img_size=64, dynamic_img_size=True),
         (48, 80), lambda m: m.blocks[-1].norm1, tokens(1, 3, 5), "blocks.11.norm1", (3, 5)),
    Case("timm-deit_tiny_distilled", _timm("deit_tiny_distilled_patch16_224", img_size=64), 64,
         lambda m: m.blocks[-1].norm1, tokens(2, 4, 4), "blocks.11.norm1", (4, 4)),
    Case("timm-eva02_tiny", _timm("eva02_tiny_patch14_224", img_size=56), 56, lambda m: m.blocks[-1].norm1,
         tokens(1, 4, 4), "blocks.11.norm1", (4, 4)),
    Case("timm-beit", _timm("beit_base_patch16_224", img_size=64, depth=2, embed_dim=64, num_heads=2), 64,
         lambda m: m.blocks[-1].norm1, tokens(1, 4, 4), "blocks.1.norm1", (4, 4)),
    Case("timm-swin", _timm("swin_tiny_patch4_window7_224", img_size=64, window_size=4, embed_dim=24,
                            depths=(1, 1, 2, 1), num_heads=(1, 1, 2, 2)), 64,
         lambda m: m.layers[-1].blocks[-1].norm1, nhwc, "layers.3.blocks.0.norm1", (2, 2)),
    Case("timm-swinv2", _timm("swinv2_tiny_window8_256", img_size=64, window_size=4, embed_dim=24,
                              depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2)), 64,
         lambda m: m.layers[-1].blocks[-1], nhwc, "layers.3.blocks.0", (2, 2)),
    Case("timm-levit_conv_128s", _timm("levit_conv_128s", img_size=128), 128, lambda m: m.stages[-1], nchw,
         "stages.2", (2, 2), calibrate=True),
    Case("timm-levit_128s", _timm("levit_128s", img_size=128), 128, lambda m: m.stages[-1], tokens(0, 2, 2),
         "stages.2", (2, 2), calibrate=True),
    Case("timm-mixer", _mixer, 64, lambda m: m.blocks[-1], tokens(0, 4, 4), "blocks.1", (4, 4)),
    Case("timm-coatnet_nano", _timm("coatnet_nano_rw_224", img_size=64), 64, lambda m: m.stages[-1], nchw,
         "stages.3", (2, 2)),
    Case("timm-maxvit_nano", _timm("maxvit_nano_rw_256", img_size=128), 128, lambda m: m.stages[-1], nchw,
         "stages.3", (4, 4)),
    Case("timm-efficientformer", _efficientformer, 224, lambda m: m.stages[-1], tokens(0, 7, 7), "stages.3", (7, 7)),
    Case("timm-mobilevit_xxs", _timm("mobilevit_xxs", img_size=64), 64, lambda m: m.final_conv, nchw, "final_conv",
         (2, 2)),
]


def _hf(config_cls: str, model_cls: str, **config: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        cfg = getattr(transformers, config_cls)(num_labels=5, **config)
        return getattr(transformers, model_cls)(cfg)

    return build


_VIT = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64)


def _clip() -> nn.Module:
    vision = dict(_VIT, projection_dim=16)
    text = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, projection_dim=16)
    cfg = transformers.CLIPConfig(vision_config=vision, text_config=text, num_labels=5)
    return transformers.CLIPForImageClassification(cfg)


_DINO = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2)

HF_CASES = [
    Case("hf-vit", _hf("ViTConfig", "ViTForImageClassification", **_VIT), 32,
         lambda m: m.vit.layers[-1].layernorm_before, tokens(1, 4, 4), "vit.layers.1.layernorm_before",
         (4, 4)),
    Case("hf-deit", _hf("DeiTConfig", "DeiTForImageClassification", **_VIT), 32,
         lambda m: m.deit.layers[-1].layernorm_before, tokens(2, 4, 4),
         "deit.layers.1.layernorm_before", (4, 4)),
    Case("hf-deit-teacher", _hf("DeiTConfig", "DeiTForImageClassificationWithTeacher", **_VIT), 32,
         lambda m: m.deit.layers[-1].layernorm_before, tokens(2, 4, 4),
         "deit.layers.1.layernorm_before", (4, 4)),
    Case("hf-swin", _hf("SwinConfig", "SwinForImageClassification", image_size=64, patch_size=4, embed_dim=16,
                        depths=[1, 1, 2, 1], num_heads=[1, 1, 2, 2], window_size=2), 64,
         lambda m: m.swin.encoder.layers[-1].blocks[-1].layernorm_before, tokens(0, 2, 2),
         "swin.encoder.layers.3.blocks.0.layernorm_before", (2, 2)),
    Case("hf-convnext", _hf("ConvNextConfig", "ConvNextForImageClassification", hidden_sizes=[8, 16, 24, 32],
                            depths=[1, 1, 2, 1]), 64,
         lambda m: m.convnext.encoder.stages[-1].layers[-1], nchw, "convnext.encoder.stages.3", (2, 2)),
    Case("hf-resnet", _hf("ResNetConfig", "ResNetForImageClassification", embedding_size=8,
                          hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], layer_type="basic"), 64,
         lambda m: m.resnet.encoder.stages[-1].layers[-1], nchw, "resnet.encoder.stages.3", (2, 2)),
    Case("hf-clip", _clip, 32, lambda m: m.vision_model.encoder.layers[-1].layer_norm1, tokens(1, 4, 4),
         "vision_model.encoder.layers.1.layer_norm1", (4, 4)),
    Case("hf-dinov2", _hf("Dinov2Config", "Dinov2ForImageClassification", **_DINO), 32,
         lambda m: m.dinov2.encoder.layer[-1].norm1, tokens(1, 4, 4), "dinov2.encoder.layer.1.norm1", (4, 4)),
    Case("hf-dinov2-registers", _hf("Dinov2WithRegistersConfig", "Dinov2WithRegistersForImageClassification",
                                    num_register_tokens=4, **_DINO), 32,
         lambda m: m.dinov2_with_registers.encoder.layer[-1].norm1, tokens(5, 4, 4),
         "dinov2_with_registers.encoder.layer.1.norm1", (4, 4)),
]

CASES = TIMM_CASES + HF_CASES


def _unzero(model: nn.Module) -> nn.Module:
    # Zero-initialised weights (a training trick: MLP-Mixer's head, LeViT's and ResNets' last
    # BatchNorm scale in each residual branch) make every map flat or position-independent at
    # random init; a trained model has none. Such weights get random values.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and not p.any():
                p.uniform_(0.5, 1.5) if p.dim() == 1 else p.normal_(0.0, 0.05)
    return model


def _calibrate(model: nn.Module, size: tuple[int, int]) -> None:
    # LeViT at random init: its activations are ~1e-2 and shrink stage by stage, so attention
    # is uniform and every token of the last stage is the same (a position-independent map).
    # BatchNorm statistics taken from one random batch, as after training, keep them O(1).
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average: one batch sets the statistics
    model.train()
    with torch.no_grad():
        model(torch.randn(4, 3, *size, generator=torch.Generator().manual_seed(99)))


@functools.cache
def _model(case_id: str) -> nn.Module:
    case = next(c for c in CASES if c.id == case_id)
    torch.manual_seed(case.seed)
    model = _unzero(case.build())
    if case.calibrate:
        _calibrate(model, _hw(case))
    return model.eval()


@pytest.fixture(scope="module", autouse=True)
def _free_models() -> Any:
    """Models are built once per module (``_model`` caches them) and freed after it (~150M parameters)."""
    yield
    _model.cache_clear()


def _hw(case: Case) -> tuple[int, int]:
    return (case.size, case.size) if isinstance(case.size, int) else case.size


def _input(case: Case, batch: int) -> Tensor:
    return torch.randn(batch, 3, *_hw(case), generator=torch.Generator().manual_seed(batch))


def _logits(output: Any) -> Tensor:
    return output if isinstance(output, Tensor) else output.logits


def hand_gradcam(model: nn.Module, module: nn.Module, reshape: Reshape, x: Tensor) -> tuple[Tensor, Tensor]:
    """Grad-CAM of the top-1 class at ``module``, by hand: (normalised maps [B, H, W], raw maps [B, h, w])."""
    seen: list[Tensor] = []
    handle = module.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        logits = _logits(model(x))
    finally:
        handle.remove()
    scores = logits.gather(1, logits.argmax(dim=1, keepdim=True)).sum()
    (grad,) = torch.autograd.grad(scores, seen[-1])
    acts, grads = reshape(seen[-1].detach()), reshape(grad)
    raw = torch.relu((grads.mean(dim=(2, 3))[:, :, None, None] * acts).sum(dim=1))
    up = F.interpolate(raw[:, None], size=tuple(x.shape[-2:]), mode="bilinear", align_corners=False)[:, 0]
    low = up.amin(dim=(1, 2), keepdim=True)
    span = up.amax(dim=(1, 2), keepdim=True) - low
    maps = torch.where(span > 0, (up - low) / span.clamp_min(1e-30), torch.zeros_like(up))
    return maps, raw


def _params(cases: list[Case]) -> list[Any]:
    out = []
    for case in cases:
        for batch in (2, 3):
            marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
            out.append(pytest.param(case, batch, id=f"{case.id}-b{batch}", marks=marks))
    return out


@pytest.mark.heavy
@pytest.mark.parametrize(("case", "batch"), _params(CASES))
def test_default_layer_matches_hand_gradcam(case: Case, batch: int) -> None:
    model = _model(case.id)
    x = _input(case, batch)
    expected, raw = hand_gradcam(model, case.ref(model), case.reshape, x)
    assert raw.shape == (batch, *case.grid)
    assert (raw.amax(dim=(1, 2)) > raw.amin(dim=(1, 2))).all(), "the reference map is flat: the case tests nothing"
    explanation = camkit.GradCAM(model).explain(x)
    assert explanation.layers == (case.layer,)
    assert explanation.raw.shape == (batch, *case.grid)
    assert explanation.maps.shape == (batch, *_hw(case))
    diff = (explanation.maps - expected).abs().max().item()
    assert diff <= TOL, f"{case.id}: max |camkit - hand Grad-CAM at the recommended layer| = {diff:.4f}"


class Container(NamedTuple):
    case: str  # a Case id: the model and input
    layer: str  # an explicit container layer
    last_block: Callable[[Any], nn.Module]
    reshape: Reshape
    xfail: str | None = None


CONTAINERS = [
    Container("timm-resnet18", "layer4", lambda m: m.layer4[-1], nchw),
    Container("timm-convnext_atto", "stages.3", lambda m: m.stages[-1].blocks[-1], nchw),
    Container("timm-efficientnet_b0", "blocks.6", lambda m: m.blocks[-1][-1], nchw),
    Container("timm-regnetx_002", "s4", lambda m: list(m.s4.children())[-1], nchw),
    Container("timm-swin", "layers.3", lambda m: m.layers[-1].blocks[-1], nhwc),
    Container("timm-coatnet_nano", "stages.3", lambda m: m.stages[-1].blocks[-1], nchw),
    Container("timm-maxvit_nano", "stages.3", lambda m: m.stages[-1].blocks[-1], nchw),
    Container("hf-convnext", "convnext.encoder.stages.3", lambda m: m.convnext.encoder.stages[-1].layers[-1], nchw),
    Container("hf-resnet", "resnet.encoder.stages.3", lambda m: m.resnet.encoder.stages[-1].layers[-1], nchw),
]


def _container_params() -> list[Any]:
    out = []
    for item in CONTAINERS:
        for batch in (2, 3):
            marks = [pytest.mark.xfail(strict=True, reason=item.xfail)] if item.xfail else []
            out.append(pytest.param(item, batch, id=f"{item.case}-{item.layer}-b{batch}", marks=marks))
    return out


@pytest.mark.heavy
@pytest.mark.parametrize(("item", "batch"), _container_params())
def test_explicit_container_gives_its_last_block_map(item: Container, batch: int) -> None:
    case = next(c for c in CASES if c.id == item.case)
    model = _model(case.id)
    x = _input(case, batch)
    expected, raw = hand_gradcam(model, item.last_block(model), item.reshape, x)
    assert (raw.amax(dim=(1, 2)) > raw.amin(dim=(1, 2))).all(), "the reference map is flat: the case tests nothing"
    explanation = camkit.GradCAM(model, item.layer).explain(x)
    assert explanation.raw.shape == raw.shape
    diff = (explanation.maps - expected).abs().max().item()
    assert diff <= TOL, f"{item.case} {item.layer}: max |camkit - hand Grad-CAM at the last block| = {diff:.4f}"


# Where the generic rule alone (no family default) lands elsewhere than pytorch-grad-cam's
# recommendation, and why that layer is a CAM layer too: every one is a map of the input that the
# score reaches at every position. Models that pool all tokens (or positions) after the last block
# give their patch tokens a gradient at the final norm, unlike class-token ViTs; VGG's last spatial
# output is after its last max-pool. The family defaults give the recommended layers.
GENERIC: dict[str, tuple[str, Callable[[Any], nn.Module], Reshape]] = {
    "timm-vgg11": ("features", lambda m: m.features, nchw),
    "timm-eva02_tiny": ("blocks.11", lambda m: m.blocks[-1], tokens(1, 4, 4)),
    "timm-beit": ("blocks.1", lambda m: m.blocks[-1], tokens(1, 4, 4)),
    "timm-swin": ("norm", lambda m: m.norm, nhwc),
    "timm-swinv2": ("norm", lambda m: m.norm, nhwc),
    "timm-mixer": ("norm", lambda m: m.norm, tokens(0, 4, 4)),
    "timm-coatnet_nano": ("norm", lambda m: m.norm, nchw),
    "timm-maxvit_nano": ("norm", lambda m: m.norm, nchw),
    "timm-efficientformer": ("norm", lambda m: m.norm, tokens(0, 7, 7)),
    "hf-swin": ("swin.layernorm", lambda m: m.swin.layernorm, tokens(0, 2, 2)),
    "hf-clip": ("vision_model.encoder.layers.1", lambda m: m.vision_model.encoder.layers[-1], tokens(1, 4, 4)),
    "hf-dinov2": ("dinov2.layernorm", lambda m: m.dinov2.layernorm, tokens(1, 4, 4)),
    "hf-dinov2-registers": (
        "dinov2_with_registers.layernorm", lambda m: m.dinov2_with_registers.layernorm, tokens(5, 4, 4)
    ),
}


@pytest.mark.heavy
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_generic_rule_alone_gives_a_right_map_or_asks_for_a_layer(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(camkit.layers.families, "family_rule", lambda model: None)
    model = _model(case.id)
    assert camkit.default_layer(model) is None
    x = _input(case, 2)
    try:
        explanation = camkit.GradCAM(model).explain(x)
    except camkit.errors.CamkitError as error:
        assert "layer" in str(error), f"{case.id}: the generic rule failed without asking for a layer: {error}"
        return
    name, ref, reshape = GENERIC.get(case.id, (case.layer, case.ref, case.reshape))
    if case.id in GENERIC:
        assert explanation.layers == (name,)
    # else the rule may name the container whose output is that layer's (``blocks`` for ``blocks.5``)
    expected, _ = hand_gradcam(model, ref(model), reshape, x)
    assert explanation.raw.shape[0] == 2
    diff = (explanation.maps - expected).abs().max().item()
    assert diff <= TOL, f"{case.id}: at {name}, {diff:.4f} off the hand Grad-CAM of that layer"


@pytest.mark.parametrize(
    ("case_id", "prefix"),
    [("hf-vit", 1), ("hf-deit", 2), ("hf-deit-teacher", 2), ("hf-clip", 1), ("hf-dinov2", 1),
     ("hf-dinov2-registers", 5), ("timm-deit_tiny_distilled", 2), ("hf-swin", 0), ("hf-resnet", None)],
)
def test_prefix_tokens_from_the_model(case_id: str, prefix: int | None) -> None:
    assert camkit.layers.layout.prefix_token_hint(_model(case_id)) == prefix


def _patch_token_gradient(model: nn.Module, module: nn.Module, x: Tensor, prefix: int) -> Tensor:
    seen: list[Tensor] = []
    handle = module.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        logits = _logits(model(x))
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(logits[:, 0].sum(), seen[-1])
    return grad[:, prefix:].abs().amax()


@pytest.mark.parametrize(
    ("case_id", "final_norm", "prefix"),
    [("timm-vit_tiny", lambda m: m.norm, 1), ("hf-vit", lambda m: m.vit.layernorm, 1),
     ("hf-deit", lambda m: m.deit.layernorm, 2), ("timm-deit_tiny_distilled", lambda m: m.norm, 2)],
)
def test_class_token_vits_use_the_last_blocks_first_norm(case_id: str, final_norm: Any, prefix: int) -> None:
    # Why not the final norm: the head reads only the class (and distillation) token, so the
    # gradient at every patch token of the final norm is exactly zero; at the default it is not.
    case = next(c for c in CASES if c.id == case_id)
    model = _model(case_id)
    x = _input(case, 2)
    assert _patch_token_gradient(model, final_norm(model), x, prefix) == 0
    assert _patch_token_gradient(model, case.ref(model), x, prefix) > 0


def test_model_output_logits_are_scored_by_default() -> None:
    case = next(c for c in CASES if c.id == "hf-vit")
    model = _model(case.id)
    x = _input(case, 2)
    default = camkit.GradCAM(model).explain(x)
    named = camkit.GradCAM(model, output="logits").explain(x)
    torch.testing.assert_close(default.maps, named.maps)
    torch.testing.assert_close(default.scores, named.scores)
    with torch.no_grad():
        logits = model(x).logits
    torch.testing.assert_close(default.scores, logits.max(dim=1).values)


def test_model_output_without_logits_asks_for_output() -> None:
    base = _model("hf-vit").vit  # ViTModel: last_hidden_state and pooler_output, no logits
    x = _input(next(c for c in CASES if c.id == "hf-vit"), 2)
    with pytest.raises(camkit.errors.OutputSelectionError, match="pass output="):
        camkit.GradCAM(base).explain(x)
