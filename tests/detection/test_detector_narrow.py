"""Grad-CAM on ultralytics detectors with a graph narrowed to the picked candidates: the class
branch of the candidate's level rerun on the window around it, exactly the full graph's maps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from test_detectors import (
    _candidate_score,
    _yolo,
    gradcam_by_hand,
    yolo_env,  # noqa: F401  (a fixture: the tests below take it by name)
)
from torch import Tensor, nn

import camkit
from camkit._internal import syncs as _syncs
from camkit._internal.syncs import record_syncs
from camkit.detection import cxcywh_to_xyxy
from camkit.detection import narrow_dense as _narrow_dense
from camkit.detection.narrow_dense import reach

# yolov8n and yolo11n on 64x96: levels of 8x12, 4x6 and 2x3 positions (A = 96 + 24 + 6 = 126)
PICKS = torch.tensor([[0, 99], [125, 95]])  # a corner of level 0, inside level 1, the last of level 2, a border


def _model(yolo: Any, yaml: str) -> nn.Module:
    model = _yolo(yolo, yaml)
    with torch.no_grad():  # the class head's prior (p ~ 1e-5) leaves almost no gradient: start at p = 0.5
        for branch in model.model[-1].cv3:
            branch[-1].bias.zero_()
    return model


def _references(model: nn.Module, x: Tensor, picks: Tensor) -> tuple[Tensor, Tensor]:
    """The boxes [B, N, 4] and best classes [B, N] of the candidates ``picks`` [B, N]."""
    with torch.no_grad():
        output = model(x)
    while isinstance(output, (tuple, list)):
        output = output[0]
    classes = model.model[-1].nc
    boxes = torch.stack([cxcywh_to_xyxy(output[b, :4, picks[b]].T) for b in range(x.shape[0])])
    labels = torch.stack([output[b, 4 : 4 + classes, picks[b]].argmax(dim=0) for b in range(x.shape[0])])
    return boxes, labels


def _grad_calls(model: nn.Module) -> tuple[list[tuple[int, ...]], Callable[[], None]]:
    """Input shapes of the class branches' calls made with autograd on; and the remover."""
    shapes: list[tuple[int, ...]] = []
    handles = [
        branch.register_forward_pre_hook(lambda m, a: shapes.append(tuple(a[0].shape)) if torch.is_grad_enabled() else None)
        for branch in model.model[-1].cv3
    ]
    return shapes, lambda: [h.remove() for h in handles]


_SLOW = pytest.mark.slow


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("yaml", "layer", "on_host"),
    [
        ("yolov8n.yaml", None, True),
        ("yolov8n.yaml", None, False),  # the device path: every level's window, selected with torch.where
        ("yolov8n.yaml", "model.9", True),  # in the backbone: the backward runs through the neck
        ("yolov8n.yaml", "model.21", True),  # feeds level 2 only: zero where the candidate lies on another level
        ("yolo11n.yaml", None, True),  # depthwise class branches
        pytest.param("yolov8n.yaml", "model.9", False, marks=_SLOW),
        pytest.param("yolov8n.yaml", "model.21", False, marks=_SLOW),
        pytest.param("yolo11n.yaml", None, False, marks=_SLOW),
        pytest.param("yolov8n-seg.yaml", None, True, marks=_SLOW),
        pytest.param("yolov8n-pose.yaml", None, False, marks=_SLOW),
    ],
)
def test_yolo_gradcam_narrowed_to_the_picked_candidates_equals_the_full_graph(
    yaml: str, layer: str | None, on_host: bool, yolo_env: Any, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: on_host)
    model = _model(yolo_env, yaml)
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(3))
    boxes, labels = _references(model, x, PICKS)
    shapes, remove = _grad_calls(model)
    try:
        explanation = camkit.GradCAM(model, layer).explain(x, camkit.DetectionTarget(boxes, labels, iou_threshold=0.99))
    finally:
        remove()
    # 2 x 2 windows of 5x5 rows and columns, fewer where the level is smaller (level 2: the whole 2x3 map)
    assert shapes == [(4, 64, 5, 5), (4, 128, 4, 5), (4, 256, 2, 3)]  # both paths: every level holds a pick here
    for n in range(PICKS.shape[1]):  # the full graph, written out by hand: the whole head, every level
        expected, scores = gradcam_by_hand(model, list(explanation.layers), x, _candidate_score(boxes[:, n], labels[:, n]))
        torch.testing.assert_close(explanation.scores[:, n], scores.detach(), atol=1e-6, rtol=0)
        torch.testing.assert_close(explanation.maps[:, n], expected, atol=1e-5, rtol=0)
    if layer == "model.21":  # image 0's first candidate lies on level 0, which layer 21 does not feed
        assert bool(explanation.flat[0, 0]) and not bool(explanation.flat[1, 0])


@pytest.mark.heavy
@pytest.mark.parametrize("on_host", [True, False], ids=["host", "device"])
def test_yolo_narrowed_reruns_only_the_levels_that_hold_a_candidate_on_the_host(
    on_host: bool, yolo_env: Any, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: on_host)
    model = _model(yolo_env, "yolov8n.yaml")
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(3))
    picks = torch.tensor([[17], [50]])  # both on level 0
    boxes, labels = _references(model, x, picks)
    shapes, remove = _grad_calls(model)
    try:
        explanation = camkit.GradCAM(model).explain(x, camkit.DetectionTarget(boxes[:, 0], labels[:, 0], iou_threshold=0.99))
    finally:
        remove()
    assert shapes == ([(2, 64, 5, 5)] if on_host else [(2, 64, 5, 5), (2, 128, 4, 5), (2, 256, 2, 3)])
    expected, _ = gradcam_by_hand(model, list(explanation.layers), x, _candidate_score(boxes[:, 0], labels[:, 0]))
    torch.testing.assert_close(explanation.maps, expected, atol=1e-5, rtol=0)


def test_yolo_branch_of_unknown_reach_is_rerun_on_the_whole_map(yolo_env: Any) -> None:  # noqa: F811
    model = _model(yolo_env, "yolov8n.yaml")
    head = model.model[-1]
    head.cv3[0] = nn.Sequential(head.cv3[0], nn.Dropout(0.5))  # eval: the identity, but not a layer camkit knows
    assert reach(head.cv3[0]) is None and reach(head.cv3[1]) == (2, 2)
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(3))
    boxes, labels = _references(model, x, torch.tensor([[5], [90]]))
    shapes, remove = _grad_calls(model)
    try:
        explanation = camkit.GradCAM(model).explain(x, camkit.DetectionTarget(boxes[:, 0], labels[:, 0], iou_threshold=0.99))
    finally:
        remove()
    assert shapes == [(2, 64, 8, 12)]
    expected, _ = gradcam_by_hand(model, list(explanation.layers), x, _candidate_score(boxes[:, 0], labels[:, 0]))
    torch.testing.assert_close(explanation.maps, expected, atol=1e-5, rtol=0)


def test_reach_of_branches() -> None:
    conv = nn.Conv2d(2, 2, 3, padding=2, dilation=2)
    assert reach(nn.Sequential(conv, nn.BatchNorm2d(2), nn.SiLU(), nn.Conv2d(2, 2, 1))) == (2, 2)
    assert reach(nn.Sequential(nn.Conv2d(2, 2, (3, 5), padding=(1, 2), groups=2))) == (1, 2)
    assert reach(nn.Conv2d(2, 2, 3, padding=0)) is None  # "valid": positions shift
    assert reach(nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect")) is None
    assert reach(nn.Conv2d(2, 2, 2, padding=1)) is None  # an even kernel
    assert reach(nn.Sequential(nn.Conv2d(2, 2, 1), nn.AdaptiveAvgPool2d(1))) is None

    class Silu(nn.SiLU):  # a subclass may mix positions
        pass

    assert reach(nn.Sequential(nn.Conv2d(2, 2, 1), Silu())) is None


def test_yolo_narrowing_stays_off_where_it_would_change_the_map(yolo_env: Any) -> None:  # noqa: F811
    model = _model(yolo_env, "yolov8n.yaml")
    target = camkit.DetectionTarget(torch.tensor([0.0, 0.0, 8.0, 8.0]))
    head = _narrow_dense.dense_head
    assert head(model, target, ["model.15"], None) is model.model[-1]
    assert head(model, target, ["model.22.cv3.0"], None) is None  # a layer inside the head
    assert head(model, target, ["model.15"], lambda out: out[0]) is None  # the user's own output selector
    assert head(model, lambda out: out[0][:, 4, 0], ["model.15"], None) is None  # a target that reports no pick
    model.train()
    assert head(model, target, ["model.15"], None) is None
    model.eval()
    assert head(nn.Sequential(nn.Conv2d(3, 3, 1)), target, ["0"], None) is None


def test_yolo_narrowed_leaves_no_trace_also_after_an_error(yolo_env: Any) -> None:  # noqa: F811
    model = _model(yolo_env, "yolov8n.yaml")
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(3))
    boxes, labels = _references(model, x, PICKS)
    model.model[-1].train()  # mixed flags, a frozen parameter, a gradient already there
    first = next(model.parameters())
    first.requires_grad_(False)
    last = model.model[-1].cv3[0][-1].bias
    last.grad = torch.ones_like(last)
    flags = [m.training for m in model.modules()]
    frozen = [p.requires_grad for p in model.parameters()]
    x_before = x.clone()
    explanation = camkit.GradCAM(model).explain(x, camkit.DetectionTarget(boxes, labels, iou_threshold=0.99))
    assert explanation.maps.shape == (2, 2, 64, 96) and not explanation.flat.any()
    far = torch.tensor([[[90.0, 60.0, 96.0, 64.0]] * 2] * 2)  # nothing overlaps it: the target raises mid-call
    with pytest.raises(camkit.errors.InvalidTargetError, match="no candidate matches"):
        camkit.GradCAM(model).explain(x, camkit.DetectionTarget(far, labels, iou_threshold=0.99))
    for _ in range(2):
        assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules()) == 0
        assert torch.is_grad_enabled() and torch.equal(x, x_before)
        assert [m.training for m in model.modules()] == flags and [p.requires_grad for p in model.parameters()] == frozen
        assert torch.equal(last.grad, torch.ones_like(last)) and all(
            p.grad is None for p in model.parameters() if p is not last
        )


@pytest.mark.heavy
def test_yolo_narrowed_rescoring_makes_no_host_sync_on_a_device(
    yolo_env: Any, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: False)
    model = _model(yolo_env, "yolov8n.yaml")
    x = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(3))
    boxes, labels = _references(model, x, PICKS)
    rescore, recorded = _narrow_dense._rescore, []

    def recording(*args: Any) -> Tensor:
        with record_syncs() as syncs:
            out = rescore(*args)
        recorded.extend(str(s) for s in syncs)
        return out

    monkeypatch.setattr(_narrow_dense, "_rescore", recording)
    camkit.GradCAM(model).explain(x, camkit.DetectionTarget(boxes, labels, iou_threshold=0.99))
    monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: True)
    camkit.GradCAM(model).explain(x, camkit.DetectionTarget(boxes, labels, iou_threshold=0.99))
    assert len(recorded) == 1 and "tolist" in recorded[0]  # on the host: the one read of the levels to rerun
