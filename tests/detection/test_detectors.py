"""Detectors and segmenters from code (torchvision, ultralytics, Hugging Face): Grad-CAM with a
detection or segmentation target equals a Grad-CAM written out here by hand, at the layer camkit
chose (one docs/layers.md names), with the documented score; EigenCAM runs without a target; a
batch equals its images one by one."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import box_area, box_convert, box_iou

import camkit

ROOT = Path(__file__).resolve().parents[2]
LAYERS_DOC = (ROOT / "docs" / "layers.md").read_text(encoding="utf-8")


# ---------------------------------------------------------------- Grad-CAM by hand


def _normalise(maps: Tensor) -> Tensor:
    low = maps.amin(dim=(1, 2), keepdim=True)
    span = maps.amax(dim=(1, 2), keepdim=True) - low
    return torch.where(span > 0, (maps - low) / span.clamp_min(1e-30), torch.zeros_like(maps))


def gradcam_by_hand(
    model: nn.Module,
    layers: Sequence[str],
    x: Tensor,
    score: Callable[[Any], Tensor],
    window: tuple[int, int, int, int] | None = None,
) -> tuple[Tensor, Tensor]:
    """Grad-CAM at ``layers`` (fused by averaging the normalised maps), ``(maps, scores)``."""
    seen: dict[str, list[Tensor]] = {name: [] for name in layers}
    handles = [
        model.get_submodule(name).register_forward_hook(lambda m, i, o, name=name: seen[name].append(o))
        for name in layers
    ]
    try:
        scores = score(model(x.clone().requires_grad_(True)))  # frozen backbones (DETR) still get a graph
    finally:
        for handle in handles:
            handle.remove()
    acts = [seen[name][-1] for name in layers]
    grads = torch.autograd.grad(scores.sum(), acts)
    maps = []
    for act, grad in zip(acts, grads):
        raw = torch.relu((grad.mean(dim=(2, 3), keepdim=True) * act).sum(dim=1)).detach()
        if window is not None:  # the layer saw the image resized to h x w, padded to ph x pw
            h, w, ph, pw = window
            raw = F.interpolate(raw[:, None], size=(ph, pw), mode="bilinear", align_corners=False)[:, 0, :h, :w]
        up = F.interpolate(raw[:, None], size=tuple(x.shape[-2:]), mode="bilinear", align_corners=False)[:, 0]
        maps.append(_normalise(up))
    fused = maps[0] if len(maps) == 1 else _normalise(torch.stack(maps).mean(dim=0))
    return fused, scores.detach()


def check_family(
    model: nn.Module,
    x: Tensor,
    target: Any,
    score: Callable[[Any], Tensor],
    layers: Sequence[str],
    *,
    window: tuple[int, int, int, int] | None = None,
    one_by_one: Callable[[int], Any] | None = None,
) -> camkit.Explanation:
    explanation = camkit.GradCAM(model).explain(x, target)
    assert explanation.layers == tuple(layers)
    expected, scores = gradcam_by_hand(model, layers, x, score, window)
    torch.testing.assert_close(explanation.scores, scores, atol=1e-5, rtol=1e-4)
    assert not explanation.flat.any()
    torch.testing.assert_close(explanation.maps, expected, atol=2e-4, rtol=0)
    if one_by_one is not None:  # a batch equals its images one by one
        for i in range(x.shape[0]):
            single = camkit.GradCAM(model).explain(x[i : i + 1], one_by_one(i))
            torch.testing.assert_close(single.maps[0], explanation.maps[i], atol=2e-4, rtol=0)
    eigen = camkit.EigenCAM(model).explain(x)  # no target: never asks the output to be a tensor
    assert eigen.layers == tuple(layers) and eigen.maps.shape == explanation.maps.shape
    assert torch.isfinite(eigen.maps).all() and not eigen.flat.all()
    return explanation


# ---------------------------------------------------------------- torchvision


def _retinanet_or_fcos(kind: str) -> nn.Module:
    from torchvision.models import resnet18
    from torchvision.models.detection import FCOS, RetinaNet
    from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7

    torch.manual_seed(0)
    backbone = _resnet_fpn_extractor(resnet18(), 5, returned_layers=[2, 3, 4], extra_blocks=LastLevelP6P7(256, 256))
    cls = RetinaNet if kind == "retinanet" else FCOS
    return cls(backbone, num_classes=3, min_size=64, max_size=96, score_thresh=0.0).eval()


def _faster_rcnn() -> nn.Module:
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    torch.manual_seed(0)
    return fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=96, box_score_thresh=0.0
    ).eval()


def _ssdlite() -> nn.Module:
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    torch.manual_seed(0)
    return ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=3, score_thresh=0.0).eval()


def _torchvision_score(refs: Tensor, labels: Tensor) -> Callable[[Any], Tensor]:
    def score(detections: list[dict[str, Tensor]]) -> Tensor:  # the kept detection of the label, best IoU
        out = []
        for b, det in enumerate(detections):
            iou = box_iou(det["boxes"].detach(), refs[b : b + 1])[:, 0]
            iou[det["labels"] != labels[b]] = -1.0
            out.append(det["scores"][iou.argmax()])
        return torch.stack(out)

    return score


TORCHVISION = {
    "faster_rcnn": (_faster_rcnn, "backbone.body.16", "backbone.body.<last>"),
    "retinanet": (lambda: _retinanet_or_fcos("retinanet"), "backbone.body.layer4", "backbone.body.<last>"),
    "fcos": (lambda: _retinanet_or_fcos("fcos"), "backbone.body.layer4", "backbone.body.<last>"),
    "ssdlite": (_ssdlite, "backbone.features.1", "backbone.features.<last> (SSDlite)"),
}


@pytest.mark.heavy
@pytest.mark.parametrize("name", list(TORCHVISION))
def test_torchvision_detectors(name: str, one_thread: None) -> None:
    build, layer, documented = TORCHVISION[name]
    model = build()
    assert documented in LAYERS_DOC
    x = torch.rand(2, 3, 48, 72, generator=torch.Generator().manual_seed(1))  # resized inside, then padded
    with torch.no_grad():
        detections = model(x)
    largest = [int(box_area(d["boxes"]).argmax()) for d in detections]  # random weights: some boxes are lines
    refs = torch.stack([d["boxes"][j] for d, j in zip(detections, largest)])
    labels = torch.stack([d["labels"][j] for d, j in zip(detections, largest)])
    window = camkit.GradCAM(model)._window(x)
    assert window is not None  # the transform resized the image: the maps are taken back to it
    check_family(
        model, x, camkit.DetectionTarget(refs, labels, iou_threshold=0.99), _torchvision_score(refs, labels),
        [layer], window=window,
        one_by_one=lambda i: camkit.DetectionTarget(refs[i], int(labels[i]), iou_threshold=0.99),
    )


@pytest.mark.heavy
def test_ssd_vgg_default_layer_is_documented() -> None:
    from torchvision.models.detection import ssd300_vgg16

    model = ssd300_vgg16(weights=None, weights_backbone=None, num_classes=3)
    assert camkit.default_layer(model) == "backbone.features"
    assert "backbone.features (SSD: VGG to conv4_3)" in LAYERS_DOC


@pytest.mark.parametrize("name", ["fcn", "deeplabv3", "lraspp"])
def test_torchvision_segmenters(name: str, one_thread: None) -> None:
    from torchvision.models import mobilenet_v3_small
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.segmentation import FCN, LRASPP, DeepLabV3
    from torchvision.models.segmentation.deeplabv3 import DeepLabHead
    from torchvision.models.segmentation.fcn import FCNHead

    torch.manual_seed(0)
    features = mobilenet_v3_small().features
    body = IntermediateLayerGetter(features, {"3": "low", "12": "high"})  # stride 8 and 32
    if name == "fcn":
        model: nn.Module = FCN(IntermediateLayerGetter(features, {"12": "out"}), FCNHead(576, 3))
    elif name == "deeplabv3":
        model = DeepLabV3(IntermediateLayerGetter(features, {"12": "out"}), DeepLabHead(576, 3))
    else:
        model = LRASPP(body, 24, 576, 3)
    model.eval()
    assert "| `FCN`, `DeepLabV3`, `LRASPP` |" in LAYERS_DOC and "`backbone.<last>`" in LAYERS_DOC
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    mask = torch.zeros(64, 64)
    mask[8:40, 16:56] = 1.0
    check_family(
        model, x, camkit.SegmentationTarget(2, mask=mask), lambda out: (out["out"][:, 2] * mask).sum(dim=(1, 2)),
        ["backbone.12"],
        one_by_one=lambda i: camkit.SegmentationTarget(2, mask=mask),
    )


# ---------------------------------------------------------------- ultralytics


@pytest.fixture(scope="module")
def yolo_env(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("ultralytics")
    before = {k: os.environ.get(k) for k in ("YOLO_OFFLINE", "YOLO_CONFIG_DIR")}
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ["YOLO_CONFIG_DIR"] = str(tmp_path_factory.mktemp("yolo_config"))
    from ultralytics import YOLO

    yield YOLO
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _yolo(yolo_env: Any, yaml: str) -> nn.Module:
    torch.manual_seed(0)
    return yolo_env(yaml).model.eval()


def _candidate_score(refs: Tensor, labels: Tensor) -> Callable[[Any], Tensor]:
    def score(output: Any) -> Tensor:  # the candidate overlapping best, ties by the label's probability
        while isinstance(output, (tuple, list)):
            output = output[0]
        out = []
        for b in range(output.shape[0]):
            boxes = box_convert(output[b, :4].T.detach(), "cxcywh", "xyxy")
            iou = box_iou(boxes, refs[b : b + 1])[:, 0]
            probs = output[b, 4 + labels[b]]
            tied = torch.where(iou == iou.max(), probs.detach(), torch.full_like(iou, -1.0))
            out.append(probs[tied.argmax()])
        return torch.stack(out)

    return score


@pytest.mark.heavy
@pytest.mark.parametrize(("yaml", "stages"), [("yolov8n.yaml", [15, 18, 21]), ("yolo11n.yaml", [16, 19, 22]),
                                              ("yolov8n-seg.yaml", [15, 18, 21]), ("yolov8n-pose.yaml", [15, 18, 21])])
def test_ultralytics_detectors(yaml: str, stages: list[int], yolo_env: Any) -> None:
    model = _yolo(yolo_env, yaml)
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        candidates = camkit.detection.candidates_of(model(x))
    boxes = box_convert(candidates[:, :4, [5, 40]].transpose(1, 2)[:, 0], "cxcywh", "xyxy")  # candidate 5, 40
    boxes = boxes.clamp(min=0)
    boxes[:, 2].clamp_(max=96)
    boxes[:, 3].clamp_(max=64)
    labels = torch.tensor([0, 0]) if "pose" in yaml else torch.tensor([2, 7])
    layers = [f"model.{i}" for i in stages]
    check_family(
        model, x, camkit.DetectionTarget(boxes, labels, iou_threshold=0.1), _candidate_score(boxes, labels), layers,
        one_by_one=lambda i: camkit.DetectionTarget(boxes[i], int(labels[i]), iou_threshold=0.1),
    )
    assert "model.<i> for each i the" in LAYERS_DOC


def test_ultralytics_classifier_and_obb(yolo_env: Any) -> None:
    model = _yolo(yolo_env, "yolov8n-cls.yaml")
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    # no output=: the classifier's (probabilities, logits) tuple is read as its probabilities
    check_family(model, x, [3, 5], lambda out: out[0][:, [3, 5]].diagonal(), ["model.8"], one_by_one=lambda i: [3, 5][i])
    obb = _yolo(yolo_env, "yolov8n-obb.yaml")
    eigen = camkit.EigenCAM(obb).explain(x)
    assert eigen.layers == ("model.15", "model.18", "model.21") and not eigen.flat.any()
    assert eigen.scores.isnan().all()  # no score was asked for, none was made up
    with pytest.raises(camkit.InvalidTargetError, match="rotated"):
        camkit.GradCAM(obb).explain(x, camkit.DetectionTarget(torch.tensor([0.0, 0.0, 30.0, 30.0]), 1))


# ---------------------------------------------------------------- Hugging Face


def _detr() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    backbone = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], out_features=["stage4"]
    )
    config = transformers.DetrConfig(
        use_pretrained_backbone=False, use_timm_backbone=False, backbone_config=backbone, d_model=16,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=16, decoder_ffn_dim=16, num_queries=12, num_labels=4,
    )
    model = transformers.DetrForObjectDetection(config).eval()
    with torch.no_grad():  # at random init every query predicts "no object": let some predict a class
        model.class_labels_classifier.bias[-1] = -5.0
    return model


def test_hf_detr() -> None:
    model = _detr()
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = model(x)
    predicted = out.logits.softmax(-1).argmax(-1)  # [B, Q]
    queries = [int((predicted[b] != 4).nonzero()[0]) for b in range(2)]
    labels = torch.stack([predicted[b, q] for b, q in enumerate(queries)])
    scale = torch.tensor([96.0, 64.0, 96.0, 64.0])
    refs = torch.stack([box_convert(out.pred_boxes[b, q] * scale, "cxcywh", "xyxy") for b, q in enumerate(queries)])

    def score(output: Any) -> Tensor:  # the query predicting the label whose box overlaps best; its softmax
        probs = output.logits.softmax(-1)
        picked = []
        for b in range(2):
            iou = box_iou(box_convert(output.pred_boxes[b].detach() * scale, "cxcywh", "xyxy"), refs[b : b + 1])[:, 0]
            iou[probs[b].detach().argmax(-1) != labels[b]] = -1.0
            picked.append(probs[b, iou.argmax(), labels[b]])
        return torch.stack(picked)

    layer = "model.backbone.model.encoder.stages.3"
    assert camkit.default_layer(model) == layer and "`model.backbone.model.encoder.stages.<last>`" in LAYERS_DOC
    check_family(
        model, x, camkit.DetectionTarget(refs, labels, iou_threshold=0.99), score, [layer],
        one_by_one=lambda i: camkit.DetectionTarget(refs[i], int(labels[i]), iou_threshold=0.99),
    )


def test_hf_segformer_mask_at_image_size() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3],
        strides=[4, 2], num_attention_heads=[1, 1], mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=3,
    )
    model = transformers.SegformerForSemanticSegmentation(config).eval()
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(6))
    mask = torch.zeros(64, 64)  # drawn on the image; the logits are 16 x 16
    mask[10:30, 20:50] = 1.0

    def score(output: Any) -> Tensor:  # the logits upsampled to the mask, summed over it
        up = F.interpolate(output.logits, size=(64, 64), mode="bilinear", align_corners=False)
        return (up[:, 1] * mask).sum(dim=(1, 2))

    assert "`decode_head.batch_norm`" in LAYERS_DOC
    check_family(model, x, camkit.SegmentationTarget(1, mask=mask), score, ["decode_head.batch_norm"],
                 one_by_one=lambda i: camkit.SegmentationTarget(1, mask=mask))


@pytest.mark.heavy
@pytest.mark.parametrize("method", ["eigencam", "fem", "kpcacam", "randomcam", "layeractivation"])
def test_target_free_methods_run_on_detector_outputs(method: str, yolo_env: Any) -> None:
    cls = camkit.get_method(method)
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(7))  # YOLO: sides multiples of 32
    for model in (_faster_rcnn(), _yolo(yolo_env, "yolov8n.yaml")):  # a list of dicts; a tuple of candidates
        several = method == "layeractivation" and isinstance(camkit.default_layer(model), list)
        explanation = (cls(model, "model.21") if several else cls(model)).explain(x)  # one layer per LayerActivation
        assert explanation.maps.shape[0] == 2 and explanation.maps.shape[-2:] == (64, 96)
        assert explanation.scores.isnan().all() and explanation.target is None  # no score was needed or invented
        assert torch.isfinite(explanation.maps).all()
