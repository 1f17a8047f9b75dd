"""Randomly initialised torchvision models (no downloads): default layers, tokens, wrappers, multi-input, detection."""

from __future__ import annotations

import importlib

import pytest
import torch
import torchvision.models as tvm
from models import TinyNet, tiny_input
from torch import Tensor, nn
from torchvision.models import VisionTransformer

import camkit

pytestmark = pytest.mark.usefixtures("one_thread")


def _randomise_head(model: nn.Module) -> nn.Module:
    # torchvision zero-initialises ViT heads: every gradient would be zero
    with torch.no_grad():
        for p in model.heads.parameters():
            p.normal_(0, 0.5)
    return model


def small_vit() -> nn.Module:
    torch.manual_seed(0)
    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=5)
    return _randomise_head(vit)


class RegisterViT(VisionTransformer):
    """torchvision's ViT with 4 register tokens after the class token, on non-square inputs of a fixed grid."""

    def __init__(self, grid: tuple[int, int], patch: int = 8, registers: int = 4) -> None:
        side = int((grid[0] * grid[1]) ** 0.5)
        super().__init__(image_size=side * patch, patch_size=patch, num_layers=2, num_heads=2, hidden_dim=16,
                         mlp_dim=32, num_classes=5)
        self.registers = nn.Parameter(torch.randn(1, registers, 16))
        self.encoder.pos_embedding = nn.Parameter(torch.randn(1, 1 + registers + grid[0] * grid[1], 16) * 0.02)

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[0]
        tokens = self.conv_proj(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.class_token.expand(n, -1, -1), self.registers.expand(n, -1, -1), tokens], dim=1)
        return self.heads(self.encoder(tokens)[:, 0])


def register_vit() -> nn.Module:
    torch.manual_seed(1)
    return _randomise_head(RegisterViT(grid=(4, 9)))


# (name, builder, input size, expected default layer, expected raw map size)
CASES = [
    ("vit", small_vit, (32, 32), "encoder.layers.encoder_layer_1.ln_1", (4, 4)),
    ("vit_registers_nonsquare", register_vit, (32, 72), "encoder.layers.encoder_layer_1.ln_1", (4, 9)),
    ("swin_t", lambda: tvm.swin_t(num_classes=5), (64, 64), "features.7", (2, 2)),
    ("convnext_tiny", lambda: tvm.convnext_tiny(num_classes=5), (64, 64), "features.7", (2, 2)),
    ("efficientnet_b0", lambda: tvm.efficientnet_b0(num_classes=5), (64, 64), "features.8", (2, 2)),
    ("mobilenet_v3_small", lambda: tvm.mobilenet_v3_small(num_classes=5), (64, 64), "features.12", (2, 2)),
    ("densenet121", lambda: tvm.densenet121(num_classes=5), (64, 64), "features", (2, 2)),
]


@pytest.mark.heavy
@pytest.mark.parametrize(("name", "build", "size", "layer", "grid"), CASES, ids=[c[0] for c in CASES])
def test_classifier_gives_finite_maps_at_input_size(name, build, size, layer, grid):
    torch.manual_seed(0)
    model = build().eval()
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(5))
    for method in (camkit.GradCAM, camkit.LayerCAM):
        explanation = method(model).explain(x, torch.tensor([1, 3]))
        assert explanation.layers == (layer,)
        assert explanation.maps.shape == (2, *size)
        assert torch.isfinite(explanation.maps).all()
        assert explanation.raw.shape == (2, *grid)
        assert not explanation.flat.all(), f"{name}/{method.__name__}: every map is constant"


def test_generic_rule_and_default_layer_agree_on_vit():
    model = small_vit().eval()
    x = torch.randn(1, 3, 32, 32)
    # The generic rule skips the patch embedding (later layers qualify), the attention module,
    # and everything after the last attention (only the class token is read there: zero
    # gradient at every patch token), which leaves the last block's first norm.
    assert camkit.auto_layer(model, x)[0] == "encoder.layers.encoder_layer_1.ln_1"
    assert camkit.resolve_layers(model, None, x)[0][0] == "encoder.layers.encoder_layer_1.ln_1"
    with torch.device("meta"):  # structure only, no memory or init time
        assert camkit.default_layer(tvm.vgg11()) == "features.19"  # the last ReLU
        assert camkit.default_layer(tvm.resnet18()) == "layer4"
        assert camkit.default_layer(tvm.mobilenet_v2()) == "features.18"
    assert camkit.default_layer(TinyNet()) is None


def test_vit_batch_equals_one_by_one():
    model = register_vit().eval()
    x = torch.randn(3, 3, 32, 72, generator=torch.Generator().manual_seed(2))
    batched = camkit.GradCAM(model).explain(x, torch.tensor([0, 2, 4]))
    for i in range(3):
        single = camkit.GradCAM(model).explain(x[i : i + 1], torch.tensor([[0, 2, 4][i]]))
        torch.testing.assert_close(batched.maps[i], single.maps[0], atol=1e-5, rtol=0)


@pytest.mark.heavy
def test_fcn_segmentation_target():
    from torchvision.models.segmentation import fcn_resnet50

    torch.manual_seed(0)
    model = fcn_resnet50(weights=None, weights_backbone=None, num_classes=3).eval()
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(x)["out"]
    mask = torch.zeros(48, 48)
    mask[10:20, 5:30] = 1.0
    expected = logits[:, 2][:, 10:20, 5:30].sum(dim=(1, 2))
    for method in (camkit.GradCAM, camkit.GradCAMPlusPlus):
        raw_dict = method(model).explain(x, camkit.SegmentationTarget(2, mask=mask))  # the dict goes to the target
        selected = method(model, output="out").explain(x, camkit.SegmentationTarget(2, mask=mask))
        assert raw_dict.layers == ("backbone.layer4",)
        assert raw_dict.maps.shape == (2, 48, 48) and torch.isfinite(raw_dict.maps).all()
        torch.testing.assert_close(raw_dict.scores, expected, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(raw_dict.maps, selected.maps)
        assert not raw_dict.flat.any()
    predicted = camkit.GradCAM(model).explain(x, camkit.SegmentationTarget(1))
    in_class = (logits.argmax(dim=1) == 1).float()
    torch.testing.assert_close(predicted.scores, (logits[:, 1] * in_class).sum(dim=(1, 2)), atol=1e-4, rtol=1e-5)


def small_faster_rcnn() -> nn.Module:
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    torch.manual_seed(0)
    return fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=64, box_score_thresh=0.0
    ).eval()


def test_faster_rcnn_detection_target():
    model = small_faster_rcnn()
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        detections = model(x)  # a 4-D batch works: torchvision's transform iterates over it
    refs = torch.stack([d["boxes"][0] for d in detections])
    labels = torch.stack([d["labels"][0] for d in detections])
    target = camkit.DetectionTarget(refs, labels, iou_threshold=0.99)
    for method in (camkit.GradCAM, camkit.LayerCAM):
        explanation = method(model).explain(x, target)
        assert explanation.layers == ("backbone.body.16",)
        assert explanation.maps.shape == (2, 64, 64) and torch.isfinite(explanation.maps).all()
        assert not explanation.flat.all()
        # the explained score is the matched detection's own score (the first, top-scoring one)
        torch.testing.assert_close(explanation.scores, torch.stack([d["scores"][0] for d in detections]))
    one = camkit.GradCAM(model).explain(x[1:], camkit.DetectionTarget(refs[1:], labels[1:], iou_threshold=0.99))
    torch.testing.assert_close(camkit.GradCAM(model).explain(x, target).maps[1], one.maps[0], atol=1e-5, rtol=0)
    far = camkit.DetectionTarget(torch.tensor([200.0, 200.0, 210.0, 210.0]))
    with pytest.raises(camkit.InvalidTargetError, match="lies outside the 64x64 input image"):
        camkit.GradCAM(model).explain(x, far)
    nowhere = camkit.DetectionTarget(torch.tensor([0.0, 0.0, 1.0, 1.0]), iou_threshold=0.9)
    with pytest.raises(camkit.InvalidTargetError, match=r"no kept detection .* matches"):
        camkit.GradCAM(model).explain(x, nowhere)


@pytest.mark.parametrize("wrap", ["dataparallel", "compile"])
def test_wrapped_models_give_the_bare_maps(wrap, monkeypatch):
    # Bit for bit on the CPU: DataParallel would move the module to a GPU where one is present
    # (the CUDA tests of tests/methods/test_placement.py run the real move).
    monkeypatch.setattr(importlib.import_module("torch.nn.parallel.data_parallel"), "_get_available_device_type", lambda: None)
    model = TinyNet().eval()
    x = tiny_input()
    bare = camkit.GradCAM(model, "conv2").explain(x)
    if wrap == "dataparallel":
        wrapped, prefix = nn.DataParallel(model), "module."
    else:
        wrapped, prefix = torch.compile(model, backend="eager"), "_orig_mod."
    assert camkit.unwrap_model(wrapped) is model
    for layer in ("conv2", prefix + "conv2", model.conv2):
        explainer = camkit.GradCAM(wrapped, layer)
        assert explainer.model is model and explainer.wrapped_model is wrapped
        got = explainer.explain(x)
        assert got.layers == ("conv2",)
        torch.testing.assert_close(got.maps, bare.maps, atol=0, rtol=0)
    vit = small_vit().eval()
    xv = torch.randn(1, 3, 32, 32)
    wrapped_vit = nn.DataParallel(vit) if wrap == "dataparallel" else torch.compile(vit, backend="eager")
    torch.testing.assert_close(camkit.GradCAM(wrapped_vit).explain(xv).maps, camkit.GradCAM(vit).explain(xv).maps)


class MaskedNet(nn.Module):
    """Two inputs: an image and a per-pixel mask that gates the features; optional keyword ``scale``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, image: Tensor, mask: Tensor, scale: float = 1.0) -> Tensor:
        return self.fc((torch.relu(self.conv(image)) * mask).mean(dim=(2, 3))) * scale


class MaskFirstNet(MaskedNet):
    def forward(self, mask: Tensor, image: Tensor, scale: float = 1.0) -> Tensor:  # type: ignore[override]
        return super().forward(image, mask, scale)


class ImageListNet(MaskedNet):
    def forward(self, images: list[Tensor]) -> Tensor:  # type: ignore[override]
        return super().forward(torch.stack(images), torch.ones(1, 1, 1, 1))


def test_multi_input_and_keyword_models():
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(6))
    mask = torch.zeros(2, 1, 8, 8)
    mask[:, :, :, :4] = 1.0  # only the left half counts
    model = MaskedNet().eval()
    got = camkit.GradCAM(model, "conv").explain(x, 1, inputs=(x, mask), kwargs={"scale": 2.0})
    with torch.no_grad():
        expected_scores = model(x, mask, scale=2.0)[:, 1]
    torch.testing.assert_close(got.scores, expected_scores)
    # Grad-CAM by hand: d score / d conv = 2 * fc.w[1, c] * relu'(conv) * mask / 64
    conv = model.conv(x).detach()
    grads = 2.0 * model.fc.weight[1].detach().view(1, 4, 1, 1) * (conv > 0) * mask / 64
    expected = torch.relu((grads.mean(dim=(2, 3))[:, :, None, None] * conv).sum(dim=1))
    torch.testing.assert_close(got.raw, expected, atol=1e-6, rtol=1e-5)
    # the same through input_index=1 (x second) and through a keyword image
    swapped = camkit.GradCAM(MaskFirstNet().eval(), "conv", input_index=1).explain(
        x, 1, inputs=(mask, x), kwargs={"scale": 2.0}
    )
    torch.testing.assert_close(swapped.raw, got.raw)
    keyword = camkit.GradCAM(model, "conv", input_index="image").explain(x, 1, kwargs={"mask": mask, "scale": 2.0})
    torch.testing.assert_close(keyword.raw, got.raw)
    listed = camkit.GradCAM(ImageListNet().eval(), "conv").explain(x, 1, inputs=(list(x),))
    torch.testing.assert_close(listed.raw, camkit.GradCAM(model, "conv").explain(x, 1, inputs=(x, torch.ones(1, 1, 1, 1))).raw)
    # the layer is auto-detected through the same multi-input call
    assert camkit.GradCAM(model).explain(x, 1, inputs=(x, mask)).layers == ("conv",)
    with pytest.raises(camkit.InvalidInputError, match="pass input_index=1"):
        camkit.GradCAM(MaskFirstNet(), "conv").explain(x, 1, inputs=(mask, x))
    with pytest.raises(camkit.InvalidInputError, match="input_index=2 is out of range"):
        camkit.GradCAM(model, "conv", input_index=2).explain(x, 1, inputs=(x, mask))


def test_multi_input_call_state_and_hooks_are_cleared_after_errors():
    model = MaskedNet().eval()
    x = torch.randn(2, 3, 8, 8)
    explainer = camkit.GradCAM(model, "conv")
    with pytest.raises(RuntimeError):
        explainer.explain(x, 1, inputs=(x, torch.ones(3, 1, 8, 8)))  # the mask's batch does not broadcast
    assert explainer._call is None
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    # the next plain call is not affected by the failed one (MaskedNet needs its mask, so this raises TypeError)
    with pytest.raises(TypeError, match="mask"):
        explainer.explain(x, 1)
    vit = register_vit().eval()
    camkit.GradCAM(vit).explain(torch.randn(1, 3, 32, 72))
    assert all(not m._forward_hooks for m in vit.modules())


@pytest.mark.heavy
def test_explaining_a_model_that_is_not_torchvisions_does_not_import_torchvision():
    # Importing torchvision.models to check a type pulls in torch._dynamo (hundreds of MiB of
    # resident memory in every audit of a non-torchvision model).
    import subprocess
    import sys

    code = (
        "import sys, torch, camkit\n"
        "from torch import nn\n"
        "net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))\n"
        "camkit.GradCAM(net).explain(torch.rand(2, 3, 16, 16))\n"
        "print(sorted(m for m in ('torchvision', 'torch._dynamo') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
