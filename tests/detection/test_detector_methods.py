"""Every detection explainable: Hugging Face DETR detections from its own post-processing at any
threshold; Score-CAM, Ablation-CAM and FullGrad on torchvision and ultralytics detectors, each
map checked against the method written out here by hand, with the hygiene invariants."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_detectors import (
    _detr,
    _faster_rcnn,
    _normalise,
    _yolo,
    gradcam_by_hand,
    yolo_env,  # noqa: F401  (a fixture: the tests below take it by name)
)
from torch import Tensor, nn
from torchvision.ops import box_area, box_convert, box_iou

import camkit
from camkit._internal import syncs as _syncs
from camkit.layers.families.torchvision import transform_window


def _hf_detr() -> nn.Module:
    """A tiny DETR whose queries differ: some confident (> 0.9), some mostly "no object" with a real class > 0.1."""
    model = _detr()
    torch.manual_seed(0)
    with torch.no_grad():  # random init gives every query the same output; spread them
        for name, module in model.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) and ("decoder" in name or "query" in name):
                module.weight.normal_(0, 1.0)
        model.class_labels_classifier.weight.normal_(0, 2.0)
        model.bbox_predictor.layers[-1].weight.normal_(0, 2.0)
        model.class_labels_classifier.bias[-1] = 1.5
    return model


@pytest.mark.parametrize("threshold", [0.1, 0.9])
def test_hf_detr_every_post_processed_detection(threshold: float) -> None:
    transformers = pytest.importorskip("transformers")
    model = _hf_detr()
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = model(x)
    results = transformers.DetrImageProcessor().post_process_object_detection(
        out, threshold=threshold, target_sizes=[(64, 96)] * 2
    )
    probs = out.logits.softmax(-1)
    scale = torch.tensor([96.0, 64.0, 96.0, 64.0])
    layer = "model.backbone.model.encoder.stages.3"
    explained, beyond_no_object = 0, 0
    for b, found in enumerate(results):
        if not len(found["scores"]):
            continue
        explanation = camkit.GradCAM(model).explain(x[b : b + 1], camkit.DetectionTarget.from_detections([found]))
        torch.testing.assert_close(explanation.scores[0], found["scores"], atol=1e-6, rtol=1e-5)
        for j, (box, label) in enumerate(zip(found["boxes"], found["labels"])):
            # the documented match: among queries whose best real class is the label, the best IoU
            boxes = box_convert(out.pred_boxes[b] * scale, "cxcywh", "xyxy")
            iou = box_iou(boxes, box[None])[:, 0]
            iou[probs[b, :, :-1].argmax(-1) != label] = -1.0
            query = int(iou.argmax())
            beyond_no_object += int(probs[b, query].argmax()) == probs.shape[-1] - 1
            expected, scores = gradcam_by_hand(
                model, [layer], x[b : b + 1], lambda o, q=query, k=int(label): o.logits.softmax(-1)[:, q, k]
            )
            torch.testing.assert_close(scores[0], found["scores"][j], atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(explanation.maps[0, j], expected[0], atol=2e-4, rtol=0)
            explained += 1
    assert explained >= 3  # 0.1: 8 detections; 0.9: 3
    if threshold < 0.5:  # detections whose query says "no object" above all: refused before, explained now
        assert beyond_no_object >= 2


# ---------------------------------------------------------------- perturbation CAMs and FullGrad by hand


def _tv_detection_score(refs: Tensor, labels: Tensor, threshold: float) -> Callable[[Any, int], Tensor]:
    def score(detections: Any, b: int) -> Tensor:  # the kept detection of the label with the best IoU; 0 if none
        det = detections[0]
        if not len(det["scores"]):
            return torch.zeros(())
        iou = box_iou(det["boxes"], refs[b : b + 1])[:, 0]
        iou[det["labels"] != labels[b]] = -1.0
        return det["scores"][iou.argmax()] if iou.max() >= threshold else torch.zeros(())

    return score


def _yolo_detection_score(refs: Tensor, labels: Tensor, threshold: float) -> Callable[[Any, int], Tensor]:
    def score(output: Any, b: int) -> Tensor:  # the best-overlapping candidate (ties: the label's probability)
        while isinstance(output, (tuple, list)):
            output = output[0]
        iou = box_iou(box_convert(output[0, :4].T, "cxcywh", "xyxy"), refs[b : b + 1])[:, 0]
        probs = output[0, 4 + labels[b]]
        tied = torch.where(iou == iou.max(), probs, torch.full_like(iou, -1.0))
        return probs[tied.argmax()] if iou.max() >= threshold else torch.zeros(())

    return score


def _activations(model: nn.Module, layer: str, x: Tensor) -> Tensor:
    seen: list[Tensor] = []
    handle = model.get_submodule(layer).register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return seen[-1]


def _on_image(maps: Tensor, window: tuple[int, int, int, int] | None, size: tuple[int, int]) -> Tensor:
    """Maps [N, h, w] of a layer's grid at the input's size: through the detector's resize and pad when it has one."""
    maps = maps[:, None]
    if window is not None:
        h, w, ph, pw = window
        maps = F.interpolate(maps, size=(ph, pw), mode="bilinear", align_corners=False)[..., :h, :w]
    return F.interpolate(maps, size=size, mode="bilinear", align_corners=False)[:, 0]


def _weighted(weights: Tensor, acts: Tensor, window: tuple[int, int, int, int] | None, size: tuple[int, int]) -> Tensor:
    return _normalise(_on_image(torch.relu((weights[:, :, None, None] * acts).sum(dim=1)), window, size))


def scorecam_by_hand(model: nn.Module, layer: str, x: Tensor, score: Callable[[Any, int], Tensor], window: Any) -> Tensor:
    """w[b, c]: the detection's score on x[b] masked by channel c's min-max map on the image; relu(sum w A)."""
    acts = _activations(model, layer, x)
    size = tuple(x.shape[-2:])
    weights = torch.zeros(acts.shape[:2])
    for b in range(acts.shape[0]):
        masks = _normalise(_on_image(acts[b], window, size))
        for c in range(acts.shape[1]):
            with torch.no_grad():
                weights[b, c] = score(model(x[b : b + 1] * masks[c]), b)
    return _weighted(weights, acts, window, size)


def ablationcam_by_hand(model: nn.Module, layer: str, x: Tensor, score: Callable[[Any, int], Tensor], window: Any) -> Tensor:
    """w[b, c]: the detection's score minus its score with channel c of the layer zeroed; relu(sum w A)."""
    acts = _activations(model, layer, x)
    weights = torch.zeros(acts.shape[:2])
    drop = {"c": 0}

    def zero(module: nn.Module, args: Any, out: Tensor) -> Tensor:
        out = out.clone()
        out[:, drop["c"]] = 0
        return out

    for b in range(acts.shape[0]):
        with torch.no_grad():
            plain = score(model(x[b : b + 1]), b)
        handle = model.get_submodule(layer).register_forward_hook(zero)
        try:
            for c in range(acts.shape[1]):
                drop["c"] = c
                with torch.no_grad():
                    weights[b, c] = plain - score(model(x[b : b + 1]), b)
        finally:
            handle.remove()
    return _weighted(weights, acts, window, tuple(x.shape[-2:]))


def fullgrad_by_hand(model: nn.Module, x: Tensor, score: Callable[[Any, int], Tensor], window: Any) -> Tensor:
    """sum psi(x dS/dx) + sum over conv and batch-norm layers on the image's grid of psi(b dS/dz), psi at the layer's grid."""
    layers = {}
    for name, module in model.named_modules():
        if name.startswith("roi_heads."):
            continue
        if isinstance(module, nn.Conv2d) and module.bias is not None:
            layers[name] = module.bias.detach()
        elif isinstance(module, nn.BatchNorm2d):
            scale = module.weight.detach() / torch.sqrt(module.running_var + module.eps)
            layers[name] = module.bias.detach() - module.running_mean * scale
    outputs: dict[str, Tensor] = {}
    handles = [model.get_submodule(n).register_forward_hook(lambda m, i, o, n=n: outputs.__setitem__(n, o)) for n in layers]
    image = x.clone().requires_grad_(True)
    try:
        output = model(image)
    finally:
        for handle in handles:
            handle.remove()
    names = [n for n in layers if outputs[n].shape[0] == x.shape[0]]
    total = torch.stack([score(output if isinstance(output, Tensor) else _row(output, b), b) for b in range(x.shape[0])])
    grads = torch.autograd.grad(total.sum(), [image, *[outputs[n] for n in names]], allow_unused=True)

    def psi(term: Tensor) -> Tensor:  # per-channel |.| min-max, summed over channels
        flat = term.abs().flatten(2)
        low, high = flat.amin(dim=2, keepdim=True), flat.amax(dim=2, keepdim=True)
        normed = torch.where(high > low, (flat - low) / (high - low).clamp_min(1e-30), torch.zeros_like(flat))
        return normed.view_as(term).sum(dim=1)

    size = tuple(x.shape[-2:])
    result = psi(image.detach() * grads[0])
    for name, grad in zip(names, grads[1:]):
        if grad is not None:
            on_grid = psi(layers[name].view(1, -1, 1, 1) * grad)
            result = result + _on_image(on_grid, window, size)
    return _normalise(result.detach())


def _row(output: Any, b: int) -> Any:
    if isinstance(output, list):  # torchvision: one dict per image
        return [output[b]]
    first = output[0] if isinstance(output, (tuple, list)) else output
    return first[b : b + 1]


def _faster_rcnn_resnet18() -> nn.Module:
    """A small Faster R-CNN whose box scores respond to its features (the MobileNet one's vanish at random init)."""
    from torchvision.models import resnet18
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor

    torch.manual_seed(0)
    backbone = _resnet_fpn_extractor(resnet18(), 5, returned_layers=[1, 2, 3, 4])
    return FasterRCNN(backbone, num_classes=3, min_size=64, max_size=96, box_score_thresh=0.0).eval()


def _detector_case(name: str, yolo: Any) -> tuple[nn.Module, Tensor, Any, Callable[[Any, int], Tensor], Any, str]:
    """(model, x, target, hand score, window, small layer) for a tiny Faster R-CNN or YOLOv8n, the class head at p = 0.5."""
    if name == "faster_rcnn":
        model = _faster_rcnn_resnet18()
        x = torch.rand(2, 3, 48, 72, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            detections = model(x)
        largest = [int(box_area(d["boxes"]).argmax()) for d in detections]
        refs = torch.stack([d["boxes"][j] for d, j in zip(detections, largest)])
        labels = torch.stack([d["labels"][j] for d, j in zip(detections, largest)])
        window = transform_window(model, x)
        return model, x, camkit.DetectionTarget(refs, labels, iou_threshold=0.5), _tv_detection_score(refs, labels, 0.5), window, "backbone.body.layer1"
    model = _yolo(yolo, "yolov8n.yaml")
    with torch.no_grad():  # the class head's prior (p ~ 1e-5) leaves nothing to see: start at p = 0.5
        for branch in model.model[-1].cv3:
            branch[-1].bias.zero_()
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        candidates = camkit.detection.candidates_of(model(x))
    refs = box_convert(candidates[:, :4, [5, 40]].transpose(1, 2)[:, 0], "cxcywh", "xyxy")
    labels = torch.tensor([2, 7])
    return model, x, camkit.DetectionTarget(refs, labels, iou_threshold=0.5), _yolo_detection_score(refs, labels, 0.5), None, "model.1"


@pytest.mark.heavy
@pytest.mark.parametrize("family", [pytest.param("faster_rcnn", marks=pytest.mark.slow), "yolov8n"])
@pytest.mark.parametrize("method", ["scorecam", "ablationcam"])
def test_perturbation_cams_on_detectors_by_hand(method: str, family: str, yolo_env: Any, one_thread: None) -> None:  # noqa: F811
    model, x, target, score, window, layer = _detector_case(family, yolo_env)
    by_hand = scorecam_by_hand if method == "scorecam" else ablationcam_by_hand
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", camkit.CamkitWarning)  # Ablation-CAM: full forwards, no tail
        explanation = camkit.get_method(method)(model, layer, batch_size=16).explain(x, target)
    expected = by_hand(model, layer, x, score, window)
    assert not explanation.flat.all()  # random weights: an image whose ablations all raise the score is flat
    torch.testing.assert_close(explanation.scores, torch.stack([score(_row(model(x), b), b) for b in range(2)]).detach())
    torch.testing.assert_close(explanation.maps, expected, atol=2e-4, rtol=0)


@pytest.mark.parametrize("family", [pytest.param("faster_rcnn", marks=pytest.mark.slow), "yolov8n"])
def test_fullgrad_on_detectors_by_hand(family: str, yolo_env: Any, one_thread: None) -> None:  # noqa: F811
    model, x, target, score, window, _ = _detector_case(family, yolo_env)
    assert (window is not None) == (family == "faster_rcnn")  # the bias terms go back through the resize
    explanation = camkit.FullGrad(model).explain(x, target)
    expected = fullgrad_by_hand(model, x, score, window)
    assert not explanation.flat.any()
    torch.testing.assert_close(explanation.maps, expected, atol=2e-4, rtol=0)


# ---------------------------------------------------------------- the narrowed backward (R-CNN)


@pytest.mark.heavy
@pytest.mark.parametrize(
    "build", [_faster_rcnn, pytest.param(_faster_rcnn_resnet18, marks=pytest.mark.slow)], ids=["mobilenet", "resnet18"]
)
def test_rcnn_gradcam_narrowed_to_the_picked_proposals_equals_the_full_graph(build: Any, one_thread: None) -> None:
    model = build()
    x = torch.rand(2, 3, 48, 72, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        detections = model(x)
    top = [{k: v[[0, 3]] for k, v in d.items()} for d in detections]  # two detections per image
    rows: list[int] = []  # rows of each box-head call made with autograd on
    handle = model.roi_heads.box_head.register_forward_hook(
        lambda m, i, o: rows.append(int(i[0].shape[0])) if torch.is_grad_enabled() else None
    )
    try:
        explanation = camkit.GradCAM(model).explain(x, camkit.DetectionTarget.from_detections(top, iou_threshold=0.99))
    finally:
        handle.remove()
    assert rows == [4]  # the box head's graph holds the 2 x 2 picked proposals, not the ~1000 per image
    torch.testing.assert_close(explanation.scores, torch.stack([d["scores"] for d in top]), atol=1e-6, rtol=0)
    window = transform_window(model, x)
    refs, labels = torch.stack([d["boxes"] for d in top]), torch.stack([d["labels"] for d in top])
    for n in range(2):  # the full graph, written out by hand: every proposal through the box head
        expected, _ = gradcam_by_hand(model, list(explanation.layers), x, _tv_score(refs[:, n], labels[:, n]), window)
        torch.testing.assert_close(explanation.maps[:, n], expected, atol=1e-5, rtol=0)


@pytest.mark.heavy
@pytest.mark.parametrize("on_host", [True, False], ids=["host", "device"])
def test_rcnn_detection_not_traced_to_a_proposal_is_never_scored_from_another(
    on_host: bool, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    model = _faster_rcnn()
    x = torch.rand(2, 3, 48, 72, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        detections = model(x)
    top = [{k: v[[0, 3]] for k, v in d.items()} for d in detections]
    target = camkit.DetectionTarget.from_detections(top, iou_threshold=0.99)
    traced = camkit.GradCAM(model).explain(x, target)
    decode, calls = model.roi_heads.box_coder.decode, []

    def shifted(*args: Any, **kwargs: Any) -> Tensor:  # the trace's decode alone moves every box
        out = decode(*args, **kwargs)
        if sys._getframe(1).f_code.co_name != "_rescore":
            return out
        calls.append("trace")
        return out + 1e-3

    monkeypatch.setattr(model.roi_heads.box_coder, "decode", shifted)
    monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: on_host)
    rows: list[int] = []
    handle = model.roi_heads.box_head.register_forward_hook(
        lambda m, i, o: rows.append(int(i[0].shape[0])) if torch.is_grad_enabled() else None
    )
    try:
        untraced = camkit.GradCAM(model).explain(x, target)
    finally:
        handle.remove()
    if on_host:  # one read finds it: every proposal through the box head, the heads' own post-processing scores it
        assert calls == ["trace"] and len(rows) == 1 and rows[0] > 4
        torch.testing.assert_close(untraced.scores, traced.scores, atol=1e-6, rtol=0)
        torch.testing.assert_close(untraced.maps, traced.maps, atol=1e-5, rtol=0)
        assert not untraced.flat.any()
    else:  # no read on a device: NaN scores and flat maps, never the first proposal's
        assert calls == ["trace"] and rows == [4] and torch.isnan(untraced.scores).all() and untraced.flat.all()
        assert not untraced.maps.any()


def _tv_score(refs: Tensor, labels: Tensor) -> Callable[[Any], Tensor]:
    def score(detections: list[dict[str, Tensor]]) -> Tensor:
        out = []
        for b, det in enumerate(detections):
            iou = box_iou(det["boxes"].detach(), refs[b : b + 1])[:, 0]
            iou[det["labels"] != labels[b]] = -1.0
            out.append(det["scores"][iou.argmax()])
        return torch.stack(out)

    return score


# ---------------------------------------------------------------- hygiene


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


def _state(model: nn.Module) -> tuple[Any, ...]:
    return (
        [m.training for m in model.modules()],
        [p.requires_grad for p in model.parameters()],
        [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        {k: v.clone() for k, v in model.state_dict().items()},
    )


@pytest.mark.heavy
@pytest.mark.parametrize("family", [pytest.param("faster_rcnn", marks=pytest.mark.slow), "yolov8n"])
def test_detector_methods_leave_no_trace(family: str, yolo_env: Any, one_thread: None) -> None:  # noqa: F811
    model, x, target, _, _, layer = _detector_case(family, yolo_env)
    if family == "faster_rcnn":  # the cheaper MobileNet R-CNN: hygiene needs no meaningful score
        model, layer = _faster_rcnn(), "backbone.body.2"
        with torch.no_grad():
            detections = model(x)
        target = camkit.DetectionTarget(torch.stack([d["boxes"][0] for d in detections]),
                                        torch.stack([d["labels"][0] for d in detections]))
    model.train()  # mixed flags, a frozen parameter, a gradient already there
    first = next(p for p in model.parameters() if p.requires_grad)
    first.requires_grad_(False)
    last = list(model.parameters())[-1]
    last.grad = torch.ones_like(last)
    before, x_before, grad_mode = _state(model), x.clone(), torch.is_grad_enabled()
    explainers = [camkit.GradCAM(model), camkit.FullGrad(model),
                  camkit.ScoreCAM(model, layer, batch_size=32), camkit.AblationCAM(model, layer, batch_size=32)]
    for explainer in explainers:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", camkit.CamkitWarning)
            explanation = explainer.explain(x, target)
        assert explanation.maps.shape == (2, *x.shape[-2:]) and torch.isfinite(explanation.maps).all()
        assert _hooks(model) == 0 and torch.is_grad_enabled() == grad_mode
        assert torch.equal(x, x_before) and not x.requires_grad
        after = _state(model)
        assert after[0] == before[0] and after[1] == before[1]
        assert all((g0 is None and g1 is None) or torch.equal(g0, g1) for g0, g1 in zip(before[2], after[2]))
        assert all(torch.equal(before[3][k], after[3][k]) for k in before[3])
