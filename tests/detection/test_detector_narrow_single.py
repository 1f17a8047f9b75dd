"""Grad-CAM on torchvision's single-stage detectors (RetinaNet v1 and v2, FCOS, SSD, SSDlite) with a
graph narrowed to the picked detections: the class branch of each one's level rerun on the window
around its anchor (on the whole level where a group norm spans it), exactly the full graph's maps."""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torchvision.ops import box_area, box_iou

import camkit
from camkit._internal import syncs as _syncs
from camkit._internal.syncs import record_syncs
from camkit.detection import narrow as _narrow
from camkit.detection import narrow_single as _narrow_single
from camkit.detection.narrow_dense import reach

CLASSES = 3  # RetinaNet v1: 2, so that keeping every candidate of its larger input stays cheap
# each family's default layer, named so that no dry run looks for it
LAYERS = {"ssd": "backbone.features", "ssdlite": "backbone.features.1"}
WINDOWED = {"retinanet": 5, "ssd": 1, "ssdlite": 1}  # the class branch's reach; the others hold group norms
# (image, level, row, col) of each reference, negative = from the end: corners, an inner position, borders
SPOTS = [[(0, 0, 0, 0), (0, 1, 3, 4), (0, 2, -1, 0)], [(1, 0, -1, -1), (1, 0, 7, 9), (1, 1, 0, -1)]]


def _build(name: str) -> tuple[nn.Module, Tensor]:
    """A randomly initialised detector that keeps every candidate (no threshold, no suppression), and an input."""
    from torchvision.models import detection

    torch.manual_seed(0)
    keep_all: dict[str, Any] = {"score_thresh": 0.0, "nms_thresh": 1.0, "detections_per_img": 100_000,
                                "topk_candidates": 100_000}
    classes = 2 if name == "retinanet" else CLASSES
    common: dict[str, Any] = {"weights": None, "weights_backbone": None, "num_classes": classes, **keep_all}
    generator = torch.Generator().manual_seed(1)
    if name == "ssd":  # resized to 300x300 inside
        return detection.ssd300_vgg16(**common).eval(), torch.rand(2, 3, 100, 100, generator=generator)
    if name == "ssdlite":  # resized to 320x320 inside
        model = detection.ssdlite320_mobilenet_v3_large(**common)
        x = torch.rand(2, 3, 160, 200, generator=generator)
        _calibrate(model, x)
        return model.eval(), x
    build = {"retinanet": detection.retinanet_resnet50_fpn, "retinanet_v2": detection.retinanet_resnet50_fpn_v2,
             "fcos": detection.fcos_resnet50_fpn}[name]
    # RetinaNet's six 11x11 windows hold fewer positions than the two maps of its level 0 from 128x192 on
    # (96x144 resized inside); the group-norm heads run on whole maps: 48x72 resized to 64x96 (level 0: 8x12)
    size, (height, width) = ((128, 192), (96, 144)) if name == "retinanet" else ((64, 96), (48, 72))
    model = build(min_size=size[0], max_size=size[1], **common).eval()
    # Random init scores every candidate ~0.01 alike: spread them over (0, 1), short of sigmoids that round to 0
    # (FCOS's full graph then has 0 * inf = nan gradients: the square root of a zero score)
    with torch.no_grad():
        model.head.classification_head.cls_logits.weight.mul_(10.0)
        model.head.classification_head.cls_logits.bias.zero_()
        if name == "fcos":  # boxes of a few strides instead of points
            model.head.regression_head.bbox_reg.bias.fill_(1.0)
    return model, torch.rand(2, 3, height, width, generator=generator)


def _calibrate(model: Any, x: Tensor) -> None:
    """Batch norms with the statistics of ``x`` (random init leaves SSDlite's features ~1e-14, every class ~1/3)."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # the plain average of what it sees
    model.train()
    with torch.no_grad():
        images, _ = model.transform(list(x))
        model.head(list(model.backbone(images.tensors).values()))


def _probability(name: str, out: dict[str, Tensor], b: int, j: int, k: int) -> Tensor:
    logits = out["cls_logits"][b, j]
    if name.startswith("ssd"):
        return logits.softmax(dim=-1)[k]
    p = logits[k].sigmoid()
    return (p * out["bbox_ctrness"][b, j, 0].sigmoid()).sqrt() if name == "fcos" else p


def _references(name: str, model: nn.Module, x: Tensor) -> tuple[Tensor, Tensor, list[tuple[int, int, int, int]]]:
    """Boxes [B, N, 4] and labels [B, N] of kept detections at SPOTS, and each level's (C, H, W, A)."""
    seen: dict[str, Any] = {}
    handle = model.head.register_forward_hook(lambda m, a, o: seen.update(features=[f.shape for f in a[0]], out=o))
    try:
        with torch.no_grad():
            detections = model(x)
    finally:
        handle.remove()
    out = seen["out"]
    positions = [s[-2] * s[-1] for s in seen["features"]]
    anchors = (list(model.anchor_generator.num_anchors_per_location()) if name.startswith("ssd")
               else [out["cls_logits"].shape[1] // sum(positions)] * len(positions))
    levels = [(s[1], s[2], s[3], a) for s, a in zip(seen["features"], anchors)]
    starts = [sum(p * a for p, a in zip(positions[:i], anchors[:i])) for i in range(len(positions))]
    boxes: list[list[Tensor]] = [[], []]
    labels: list[list[int]] = [[], []]
    for b, level, row, col in itertools.chain(*SPOTS):
        _, height, width, count = levels[level]
        row, col = row % height, col % width
        det = detections[b]
        classes = out["cls_logits"].shape[-1]
        for anchor, k in itertools.product(range(count), range(1 if name.startswith("ssd") else 0, classes)):
            p = _probability(name, out, b, starts[level] + (row * width + col) * count + anchor, k)
            gap = torch.where(det["labels"] == k, (det["scores"] - p).abs(), torch.full_like(det["scores"], math.inf))
            near = gap.topk(2, largest=False).values
            i = int(gap.argmin())
            box = det["boxes"][i]
            twins = box_iou(det["boxes"][det["labels"] == k], box[None])[:, 0] > 0.99
            if near[0] < 1e-6 < near[1] - near[0] and box_area(box[None])[0] > 0 and int(twins.sum()) == 1:
                boxes[b].append(box)
                labels[b].append(k)
                break
        else:
            raise AssertionError(f"no kept detection of its own at level {level}, ({row}, {col}) of image {b}")
    return torch.stack([torch.stack(r) for r in boxes]), torch.tensor(labels), levels


@functools.lru_cache(maxsize=1)
def _built(name: str) -> tuple[nn.Module, Tensor, Tensor, Tensor, list[tuple[int, int, int, int]]]:
    model, x = _build(name)
    return (model, x, *_references(name, model, x))


def _case(name: str) -> tuple[nn.Module, Tensor, Tensor, Tensor, list[tuple[int, int, int, int]]]:
    """A fresh copy of the detector, its input, the references' boxes and labels, and each level's (C, H, W, A)."""
    model, x, boxes, labels, levels = _built(name)
    return copy.deepcopy(model), x.clone(), boxes, labels, levels


def _branches(model: nn.Module, name: str) -> list[nn.Module]:
    """The modules whose input shows where the class branch ran (and FCOS's box tower, for the centerness)."""
    head: Any = model.head
    if name.startswith("ssd"):
        return list(head.classification_head.module_list)
    return [head.classification_head.conv] + ([head.regression_head.conv] if name == "fcos" else [])


def _with_grad(modules: list[nn.Module]) -> tuple[list[tuple[int, ...]], Callable[[], None]]:
    """Input shapes of the calls of ``modules`` made with autograd on; and the remover."""
    shapes: list[tuple[int, ...]] = []
    handles = [
        module.register_forward_pre_hook(lambda m, a: shapes.append(tuple(a[0].shape)) if torch.is_grad_enabled() else None)
        for module in modules
    ]
    return shapes, lambda: [h.remove() for h in handles]


def _expected(name: str, levels: list[tuple[int, int, int, int]], rerun: list[int]) -> list[tuple[int, ...]]:
    """The branch calls of the narrowed rescoring: six windows a level (one per reference), or both images'
    maps (a group norm's level, or one whose maps hold fewer positions than the windows)."""
    calls = []
    for level in rerun:
        channels, height, width, _ = levels[level]
        side = 2 * WINDOWED.get(name, max(height, width)) + 1
        window = (6, channels, min(side, height), min(side, width))
        if name in WINDOWED and 6 * window[2] * window[3] < 2 * height * width:
            calls.append(window)
        else:
            calls.extend([(2, channels, height, width)] * (2 if name == "fcos" else 1))
    return calls


def _gradcam(name: str, model: nn.Module) -> camkit.GradCAM:
    layer = LAYERS.get(name, "backbone.body.layer4")
    assert camkit.default_layer(model) == layer
    return camkit.GradCAM(model, layer)


def _full_graph(name: str, model: nn.Module, x: Tensor, target: Any, monkeypatch: pytest.MonkeyPatch) -> camkit.Explanation:
    with monkeypatch.context() as patch:
        patch.setattr(_narrow, "single_stage", lambda *args: None)
        return _gradcam(name, model).explain(x, target)


_HEAVY = pytest.mark.heavy


@pytest.mark.parametrize(
    ("name", "on_host"),
    [
        ("retinanet", True),
        pytest.param("retinanet", False, marks=_HEAVY),  # the device path: every level rerun, chosen by torch.where
        ("retinanet_v2", True),
        pytest.param("retinanet_v2", False, marks=_HEAVY),
        ("fcos", True),
        pytest.param("fcos", False, marks=_HEAVY),
        pytest.param("ssd", True, marks=_HEAVY),  # VGG16 at 300x300: seconds a forward on one core
        ("ssdlite", True),
        ("ssdlite", False),
    ],
)
def test_single_stage_gradcam_narrowed_to_the_picked_anchors_equals_the_full_graph(
    name: str, on_host: bool, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: on_host)
    model, x, boxes, labels, levels = _case(name)
    target = camkit.DetectionTarget(boxes, labels, iou_threshold=0.99)
    shapes, remove = _with_grad(_branches(model, name))
    box_calls, remove_box = _with_grad([model.head.regression_head])
    try:
        explanation = _gradcam(name, model).explain(x, target)
    finally:
        remove()
        remove_box()
    assert shapes == _expected(name, levels, [0, 1, 2] if on_host else list(range(len(levels))))
    assert box_calls == []  # the box branch never runs with a graph (FCOS's centerness tower is counted above)
    full = _full_graph(name, model, x, target, monkeypatch)
    assert not full.flat.all()
    torch.testing.assert_close(explanation.scores, full.scores, atol=1e-6, rtol=0)
    torch.testing.assert_close(explanation.maps, full.maps, atol=1e-5, rtol=0)


def test_a_detection_left_untraced_falls_back_to_the_whole_head(
    monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    model, x, boxes, labels, _ = _case("ssdlite")
    target = camkit.DetectionTarget(boxes[:, :2], labels[:, :2], iou_threshold=0.99)
    monkeypatch.setattr(_narrow_single, "_CLOSE", -1.0)  # no box is near enough: the trace fails its check
    heads: list[str] = []
    handles = [
        module.register_forward_pre_hook(lambda m, a, name=name: heads.append(name) if torch.is_grad_enabled() else None)
        for name, module in model.head.named_children()
    ]
    try:
        explanation = _gradcam("ssdlite", model).explain(x, target)
    finally:
        for handle in handles:
            handle.remove()
    assert sorted(heads) == ["classification_head", "regression_head"]  # the whole head, run again with a graph
    full = _full_graph("ssdlite", model, x, target, monkeypatch)
    torch.testing.assert_close(explanation.maps, full.maps, atol=1e-5, rtol=0)


def test_a_detection_left_untraced_on_a_device_scores_nan_with_a_flat_map(
    monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    model, x, boxes, labels, _ = _case("ssdlite")
    target = camkit.DetectionTarget(boxes[:, :2], labels[:, :2], iou_threshold=0.99)
    traced = _gradcam("ssdlite", model).explain(x, target)
    monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: False)  # nothing read back: the check is not waited for
    monkeypatch.setattr(_narrow_single, "_CLOSE", -1.0)  # no box is near enough: the trace fails its check
    explanation = _gradcam("ssdlite", model).explain(x, target)
    assert torch.isnan(explanation.scores).all() and explanation.flat.all() and not explanation.maps.any()
    assert torch.isfinite(traced.scores).all() and not traced.flat.all()


def test_single_stage_rescoring_makes_no_host_sync_on_a_device(monkeypatch: pytest.MonkeyPatch, one_thread: None) -> None:
    model, x, boxes, labels, _ = _case("ssdlite")
    rescore, recorded = _narrow_single._rescore, []

    def recording(*args: Any) -> Tensor:
        with record_syncs() as syncs:
            out = rescore(*args)
        recorded.append([str(s) for s in syncs])
        return out

    monkeypatch.setattr(_narrow_single, "_rescore", recording)
    for on_host in (False, True):
        monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor, on_host=on_host: on_host)
        _gradcam("ssdlite", model).explain(x, camkit.DetectionTarget(boxes, labels, iou_threshold=0.99))
    assert recorded[0] == [] and len(recorded[1]) == 1 and "tolist" in recorded[1][0]


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


def test_single_stage_narrowing_leaves_no_trace_also_after_an_error(
    monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    model, x, boxes, labels, _ = _case("ssdlite")
    first = next(model.parameters())
    first.requires_grad_(False)  # a frozen parameter and a gradient already there
    last = model.head.classification_head.module_list[0][1].bias
    last.grad = torch.ones_like(last)
    frozen = [p.requires_grad for p in model.parameters()]
    x_before = x.clone()
    explanation = _gradcam("ssdlite", model).explain(x, camkit.DetectionTarget(boxes, labels, iou_threshold=0.99))
    assert explanation.maps.shape == (2, 3, 160, 200)
    # label 0 is SSD's background, never kept: the target raises mid-call
    with pytest.raises(camkit.errors.InvalidTargetError, match="no kept detection"):
        _gradcam("ssdlite", model).explain(x, camkit.DetectionTarget(boxes, torch.zeros_like(labels), iou_threshold=0.99))

    def broken(*args: Any) -> Any:
        raise RuntimeError("trace failed")

    monkeypatch.setattr(_narrow_single, "_trace", broken)  # the rescoring raises after the head ran without autograd
    with pytest.raises(RuntimeError, match="trace failed"):
        _gradcam("ssdlite", model).explain(x, camkit.DetectionTarget(boxes, labels, iou_threshold=0.99))
    assert _hooks(model) == 0 and torch.is_grad_enabled() and torch.equal(x, x_before) and not x.requires_grad
    assert not any(m.training for m in model.modules()) and [p.requires_grad for p in model.parameters()] == frozen
    assert torch.equal(last.grad, torch.ones_like(last))
    assert all(p.grad is None for p in model.parameters() if p is not last)


def test_single_stage_narrowing_stays_off_where_it_would_change_the_map() -> None:
    from torchvision.models.detection import RetinaNet, ssdlite320_mobilenet_v3_large

    model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=CLASSES).eval()
    target = camkit.DetectionTarget(torch.tensor([0.0, 0.0, 8.0, 8.0]))
    stage = _narrow_single.single_stage
    found = stage(model, target, ["backbone.features.1"], None)
    assert found is not None and found.score == "softmax" and len(found.classes) == 6
    assert stage(model, target, ["head.classification_head.module_list.0"], None) is None  # a layer inside the head
    assert stage(model, target, ["backbone.features.1"], lambda out: out[0]["scores"]) is None  # an output selector
    assert stage(model, lambda out: out[0]["scores"][:1], ["backbone.features.1"], None) is None  # no picked()
    assert stage(model, target.for_rows(torch.tensor([0])), ["backbone.features.1"], None) is None  # zero if gone
    model.head.classification_head.module_list[2].train()  # a batch norm of the head on batch statistics
    assert stage(model, target, ["backbone.features.1"], None) is None
    model.eval()
    model.train()
    assert stage(model, target, ["backbone.features.1"], None) is None
    model.eval()

    class Cropped(RetinaNet):  # a post-processing of its own
        def postprocess_detections(self, *args: Any) -> Any:
            return super().postprocess_detections(*args)

    from torchvision.models import resnet18
    from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7

    backbone = _resnet_fpn_extractor(resnet18(), 5, returned_layers=[2, 3, 4], extra_blocks=LastLevelP6P7(256, 256))
    assert stage(RetinaNet(backbone, CLASSES).eval(), target, ["backbone.body.layer4"], None) is not None
    assert stage(Cropped(backbone, CLASSES).eval(), target, ["backbone.body.layer4"], None) is None
    assert stage(nn.Sequential(nn.Conv2d(3, 3, 1)).eval(), target, ["0"], None) is None


def test_reach_of_torchvision_branches() -> None:
    from functools import partial

    from torchvision.ops.misc import Conv2dNormActivation

    block = Conv2dNormActivation(4, 4, 3, groups=4, norm_layer=nn.BatchNorm2d, activation_layer=nn.ReLU6)
    assert reach(nn.Sequential(block, nn.Conv2d(4, 6, 1))) == (1, 1)  # SSDlite's depthwise and pointwise pair
    assert reach(nn.Sequential(*[Conv2dNormActivation(4, 4, norm_layer=None) for _ in range(4)], nn.Conv2d(4, 6, 3, padding=1))) == (5, 5)
    assert reach(nn.Sequential(Conv2dNormActivation(4, 4, norm_layer=partial(nn.GroupNorm, 2)))) is None

    class Shuffled(nn.Sequential):  # a container with a forward of its own may mix positions
        def forward(self, x: Tensor) -> Tensor:
            return super().forward(x).flip(-1)

    assert reach(Shuffled(nn.Conv2d(4, 4, 1))) is None


@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0, 1.0), (10.0, 10.0, 5.0, 5.0)], ids=["retinanet", "ssd"])
def test_boxes_are_decoded_as_torchvision_decodes_them(weights: tuple[float, ...]) -> None:
    from torchvision.models.detection._utils import BoxCoder

    generator = torch.Generator().manual_seed(0)
    codes = torch.randn(1000, 4, generator=generator) * 3  # some beyond the clamp of the exponential
    corner = torch.rand(1000, 2, generator=generator) * 300
    anchors = torch.cat([corner, corner + 1 + torch.rand(1000, 2, generator=generator) * 200], dim=1)
    coder = BoxCoder(weights)
    assert torch.equal(_narrow_single._decoded(coder, codes, anchors), coder.decode_single(codes, anchors))
