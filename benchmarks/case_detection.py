"""Case 28: Grad-CAM with a DetectionTarget on Faster R-CNN and YOLOv8n, against a no-grad forward and pytorch-grad-cam.

Times, side by side (interleaved) on one model and batch:

* a ``torch.no_grad()`` forward of the model (the goal's reference: camkit's Grad-CAM with a
  ``DetectionTarget`` within 1.3x of it);
* ``camkit.GradCAM(model).explain(x, DetectionTarget(boxes, labels))``: the default layer
  (Faster R-CNN: ``backbone.body.layer4``; YOLOv8n: the three neck stages, fused), the target
  being each image's top detection of the no-grad forward;
* the floor: the forward with a graph from the CAM layer on and none in the detector's heads,
  then the part of the head the score reads rerun with a graph for the picked detection alone
  (Faster R-CNN: the box head on its proposal; YOLO: the class branch of its level on the 5x5
  window around its position), and the gradient at the layers: written out by hand, knowing
  the detection beforehand (no matching, no maps). The goal: camkit within 1.3x of the
  no-grad forward, else within 1.1x of this floor;
* pytorch-grad-cam's tutorial route on the same images. Faster R-CNN: its
  ``EigenCAM(model, [model.backbone], reshape_transform=fasterrcnn_reshape_transform)`` with
  ``FasterRCNNBoxScoreTarget`` (the FPN levels resized to the coarsest and stacked), as its
  Faster R-CNN tutorial does (its ``GradCAM`` cannot run there: the backbone returns a dict,
  on which it records no gradient). YOLO: its tutorial explains YOLOv5 with ``EigenCAM`` on
  ``model.model[-2]`` (no gradient, no target); the same here on YOLOv8n's ``model.model[-2]``
  (stage 21), beside camkit's ``EigenCAM`` at that layer, whose maps are compared with it.

The routes compute different things (a gradient-free map of another layer), so only the YOLO
EigenCAM pair's maps (same method, same layer) are compared;
camkit's Grad-CAM maps are checked against a Grad-CAM written out by hand in
``tests/detection/test_detectors.py``.

Default: torchvision's ``fasterrcnn_resnet50_fpn`` (random weights, ``min_size=480``,
``max_size=640``, every box kept) on batch 2 of 3x480x640, and ultralytics' YOLOv8n (from its
yaml, the class head's bias at 0 so that scores are near 0.5) on batch 2 of 3x640x640.
``--smoke``: ``fasterrcnn_mobilenet_v3_large_320_fpn`` at 64x96 and YOLOv8n at 64x64, batch 1.
On CUDA the batches are the GPU goals': Faster R-CNN at batch 2 and 8 and YOLOv8n at batch 8, each
with its floor (so that "at most 1.3x a forward, or within 1.1x of the floor" can be judged from one
GPU run), and RetinaNet at batch 4 (goal against the forward; no hand-written floor).

Then torchvision's single-stage detectors, ``retinanet_resnet50_fpn`` (v1 and v2) and
``fcos_resnet50_fpn`` (random weights, every candidate kept, 480x640, batch 2; ``--smoke``:
RetinaNet v1 at 64x96, batch 1), each image's top detection: the no-grad forward, camkit's
Grad-CAM (only the class branch of the picked anchor's level rerun with a graph) and the same
with that narrowing switched off (the backward through the whole head), whose maps are compared
with the narrowed ones. Rows only: the goals are set for Faster R-CNN and YOLOv8n.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

import camkit

from ._harness import (
    Context,
    Goal,
    Row,
    Timing,
    describe_exception,
    goal_at_most,
    max_abs_diff,
    package_version,
    paired_ratio,
    rows_for_timings,
)

TITLE = "Grad-CAM on detectors"
ORDER = 28

FORWARD = "no-grad forward"
CAMKIT = "camkit GradCAM + DetectionTarget"
FLOOR = "floor: the backward the score needs, by hand"
PGC = "pytorch-grad-cam tutorial route"
CAMKIT_EIGEN = "camkit EigenCAM (same layer)"
WHOLE_HEAD = "camkit GradCAM + DetectionTarget, whole head's graph"
# torchvision's single-stage detectors: rows only (the goals are the issue's two models')
SINGLE_STAGE = ("retinanet_resnet50_fpn", "retinanet_resnet50_fpn_v2", "fcos_resnet50_fpn")
TIME_LIMIT = 1.3  # camkit's Grad-CAM within 1.3x of a no-grad forward
FLOOR_LIMIT = 1.1  # else within 1.1x of the floor
REPEATS = 3  # one Faster R-CNN round is about a minute on the shared 2-core machine (--repeats lowers it)


def _faster_rcnn(smoke: bool) -> nn.Module:
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn, fasterrcnn_resnet50_fpn

    torch.manual_seed(0)
    if smoke:
        return fasterrcnn_mobilenet_v3_large_320_fpn(
            weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=96, box_score_thresh=0.0
        ).eval()
    return fasterrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=91, min_size=480, max_size=640, box_score_thresh=0.0
    ).eval()


def _yolo() -> nn.Module:
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="camkit-bench-yolo-"))
    from ultralytics import YOLO

    torch.manual_seed(0)
    model = YOLO("yolov8n.yaml").model.eval()
    with torch.no_grad():  # the class head's prior (p ~ 1e-5) leaves almost no gradient: start at p = 0.5
        for branch in model.model[-1].cv3:
            branch[-1].bias.zero_()
    return model


def _input(batch: int, height: int, width: int, device: torch.device) -> Tensor:
    return torch.rand(batch, 3, height, width, generator=torch.Generator().manual_seed(0)).to(device)


def _top_detections(model: nn.Module, x: Tensor, yolo: bool) -> list[dict[str, Tensor]]:
    with torch.no_grad():
        out = model(x)
    if not yolo:
        return [{k: v[:1] for k, v in d.items() if k in ("boxes", "labels", "scores")} for d in out]
    from camkit.detection import detections_of

    found = detections_of(model, out, (int(x.shape[2]), int(x.shape[3])))
    return [{k: v[d["scores"].argmax()][None] for k, v in d.items()} for d in found]


def _pgc_faster_rcnn(model: nn.Module, x: Tensor, dets: list[dict[str, Tensor]]) -> tuple[Callable[[], Any], Callable[[], None]]:
    from pytorch_grad_cam import EigenCAM
    from pytorch_grad_cam.utils.model_targets import FasterRCNNBoxScoreTarget
    from pytorch_grad_cam.utils.reshape_transforms import fasterrcnn_reshape_transform

    own = copy.deepcopy(model)
    cam = EigenCAM(own, [own.backbone], reshape_transform=fasterrcnn_reshape_transform)
    targets = [FasterRCNNBoxScoreTarget(d["labels"].tolist(), d["boxes"].detach().cpu().numpy()) for d in dets]
    return (lambda: cam(input_tensor=x, targets=targets)), cam.activations_and_grads.release


def _pgc_yolo(model: nn.Module, x: Tensor) -> tuple[Callable[[], Any], Callable[[], None]]:
    from pytorch_grad_cam import EigenCAM

    own = copy.deepcopy(model)
    cam = EigenCAM(own, [own.model[-2]])
    targets = [lambda output: output] * x.shape[0]  # EigenCAM never scores; a list keeps it off its argmax
    return (lambda: cam(input_tensor=x, targets=targets)), cam.activations_and_grads.release


class _Scope:
    """Forward hooks that make a model's forward record a graph from the first CAM layer on, its head without one."""

    def __init__(self, model: nn.Module, layers: Sequence[str], heads: Sequence[nn.Module]) -> None:
        self.outputs: list[Tensor] = []
        self.inputs: dict[int, tuple[Any, ...]] = {}
        self.modes: list[bool] = []
        self.handles = [model.get_submodule(name).register_forward_hook(self._layer) for name in layers]
        for head in heads:
            self.handles.append(head.register_forward_pre_hook(self._off))
            self.handles.append(head.register_forward_hook(self._on))

    def _layer(self, module: nn.Module, args: Any, out: Tensor) -> Tensor:
        if not out.requires_grad:
            out = out.detach().requires_grad_(True)
            torch.set_grad_enabled(True)
        self.outputs.append(out)
        return out

    def _off(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        self.inputs[id(module)] = args
        self.modes.append(torch.is_grad_enabled())
        torch.set_grad_enabled(False)

    def _on(self, module: nn.Module, args: Any, out: Any) -> None:
        torch.set_grad_enabled(self.modes.pop())

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def _yolo_floor(model: nn.Module, x: Tensor, layers: Sequence[str], picked: Tensor, labels: Tensor) -> Callable[[], Any]:
    """The forward (a graph from the first layer on, none in the head), then the class branch of each
    picked candidate's level rerun on the 5x5 window around it, and the gradient at the layers."""
    head = model.model[-1]
    spots = []  # (image, level, top, left, row, col, label), found once: the floor knows its candidate
    with torch.no_grad():
        sizes = [(int(f.shape[-2]), int(f.shape[-1])) for f in _yolo_features(model, x)]
    for b, (a, label) in enumerate(zip(picked[:, 0].tolist(), labels[:, 0].tolist())):
        for level, (h, w) in enumerate(sizes):
            if a < h * w:
                row, col = divmod(a, w)
                top, left = min(max(row - 2, 0), max(h - 5, 0)), min(max(col - 2, 0), max(w - 5, 0))
                spots.append((b, level, top, left, row, col, label))
                break
            a -= h * w

    def floor() -> Any:
        before = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        scope = _Scope(model, layers, [head])
        try:
            model(x)
            features = scope.inputs[id(head)][0]
            with torch.enable_grad():
                score = sum(
                    head.cv3[level](features[level][b : b + 1, :, top : top + 5, left : left + 5])[
                        0, label, row - top, col - left].sigmoid()
                    for b, level, top, left, row, col, label in spots
                )
                return torch.autograd.grad(score, scope.outputs, allow_unused=True)
        finally:
            scope.close()
            torch.set_grad_enabled(before)

    return floor


def _yolo_features(model: nn.Module, x: Tensor) -> list[Tensor]:
    seen: list[Any] = []
    handle = model.model[-1].register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    try:
        model(x)
    finally:
        handle.remove()
    return list(seen[0])


def _rcnn_floor(model: nn.Module, x: Tensor, layers: Sequence[str], dets: list[dict[str, Tensor]]) -> Callable[[], Any]:
    """The forward (a graph from the layer on, none in the RPN and ROI heads), then the box head rerun
    on each detection's proposal alone, and the gradient at the layers."""
    from torchvision.ops import boxes as box_ops

    heads = model.roi_heads
    scope = _Scope(model, [], [model.rpn, heads])
    predicted: list[Any] = []
    handle = heads.box_predictor.register_forward_hook(lambda m, a, out: predicted.append(out))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
        scope.close()
    _, proposals, shapes = scope.inputs[id(heads)][:3]
    logits, regression = predicted[0]
    probs, decoded = logits.softmax(-1), heads.box_coder.decode(regression, proposals)
    chosen, start = [], 0  # each detection's proposal, found once: the floor knows its proposal
    for b, (mine, shape) in enumerate(zip(proposals, shapes)):
        label = int(dets[b]["labels"][0])
        boxes = box_ops.clip_boxes_to_image(decoded[start : start + mine.shape[0]], shape)[:, label]
        same = (probs[start : start + mine.shape[0], label] == dets[b]["scores"][0]) & (boxes == dets[b]["boxes"][0]).all(-1)
        chosen.append((int(same.int().argmax()), label))
        start += mine.shape[0]

    def floor() -> Any:
        before = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        scope = _Scope(model, layers, [model.rpn, heads])
        try:
            model(x)
            features, proposals, shapes = scope.inputs[id(heads)][:3]
            with torch.enable_grad():
                rois = [proposals[b][p : p + 1] for b, (p, _) in enumerate(chosen)]
                out, _ = heads.box_predictor(heads.box_head(heads.box_roi_pool(features, rois, shapes)))
                score = out.softmax(-1)[torch.arange(len(chosen)), [label for _, label in chosen]].sum()
                return torch.autograd.grad(score, scope.outputs, allow_unused=True)
        finally:
            scope.close()
            torch.set_grad_enabled(before)

    return floor


def _configs(ctx: Context) -> list[tuple[str, bool, int, int, int]]:
    """``(model, is_yolo, batch, height, width)``."""
    if ctx.smoke:
        return [("fasterrcnn_mobilenet_v3_large_320_fpn", False, 1, 64, 96), ("yolov8n", True, 1, 64, 64)]
    if ctx.device.type == "cuda":  # the GPU goals' batches
        return [("fasterrcnn_resnet50_fpn", False, 2, 480, 640), ("fasterrcnn_resnet50_fpn", False, 8, 480, 640),
                ("yolov8n", True, 8, 640, 640)]
    return [("fasterrcnn_resnet50_fpn", False, 2, 480, 640), ("yolov8n", True, 2, 640, 640)]


def _label(impl: str) -> str:
    version = package_version("grad-cam") if impl == PGC else None
    return f"{impl} {version}" if version else impl


def _one(ctx: Context, name: str, yolo: bool, batch: int, height: int, width: int) -> tuple[list[Row], list[Goal]]:
    where = f"{name} {height}x{width}"
    if yolo and importlib.util.find_spec("ultralytics") is None:
        return [Row(TITLE, CAMKIT, where, batch, ctx.device.type, note="ultralytics is not installed")], []
    model = (_yolo() if yolo else _faster_rcnn(ctx.smoke)).to(ctx.device)
    x = _input(batch, height, width, ctx.device)
    dets = _top_detections(model, x, yolo)
    target = camkit.DetectionTarget.from_detections(dets, iou_threshold=0.5)
    explainer = camkit.GradCAM(model)
    fns: dict[str, Callable[[], Any]] = {}

    def forward() -> Any:
        with torch.no_grad():
            return model(x)

    fns[FORWARD] = forward
    fns[CAMKIT] = lambda: explainer.explain(x, target)
    closers: list[Callable[[], None]] = []
    rows: list[Row] = []
    diffs: dict[str, float] = {}
    notes: dict[str, str] = {}
    ours = explainer.explain(x, target)
    ctx.log(f"    camkit layers {ours.layers}, scores {ours.scores.flatten().tolist()}, flat {ours.flat.tolist()}")
    if yolo:
        fns[FLOOR] = _yolo_floor(model, x, ours.layers, target.picked(), target.picked_labels())
    else:
        fns[FLOOR] = _rcnn_floor(model, x, ours.layers, dets)
    ctx.log(f"    floor gradients' abs sums {[0.0 if g is None else float(g.abs().sum()) for g in fns[FLOOR]()]}")
    notes[FLOOR] = ("the forward with a graph from the layer on, the head without; the class branch on the 5x5 "
                    "window of each picked candidate" if yolo else "the forward with a graph from the layer on, "
                    "the RPN and ROI heads without; the box head on each detection's proposal")
    if ctx.available("pytorch_grad_cam"):
        try:
            run, close = _pgc_yolo(model, x) if yolo else _pgc_faster_rcnn(model, x, dets)
            theirs = run()
            fns[PGC] = run
            closers.append(close)
            if yolo:
                eigen = camkit.EigenCAM(model, "model.21")
                fns[CAMKIT_EIGEN] = lambda: eigen.explain(x)
                mine = eigen.explain(x).maps
                # pytorch-grad-cam normalises at the layer's grid, then resizes with OpenCV: compared as returned
                diff = max_abs_diff(mine, torch.from_numpy(theirs))
                notes[_label(PGC)] = f"EigenCAM on model.model[-2]; max |diff| with camkit's EigenCAM there {diff:.3f}"
            else:
                notes[_label(PGC)] = "EigenCAM on model.backbone (FPN levels stacked), as its tutorial; maps not compared"
        except Exception as exc:  # an anchor that cannot run is reported, not fatal
            rows.append(Row(TITLE, _label(PGC), where, batch, ctx.device.type, note=describe_exception(exc)))
    try:
        fns[CAMKIT]()  # warm-up of every implementation: one call each
        timings: dict[str, Timing] = ctx.time({_label(k): v for k, v in fns.items()},
                                              repeats=ctx.repeats if ctx.smoke else min(ctx.repeats, REPEATS), warmup=1)
    finally:
        for close in closers:
            close()
    rows = rows_for_timings(TITLE, timings, reference=FORWARD, model=where, batch=batch, device=ctx.device,
                            camkit=CAMKIT, diffs=diffs, notes=notes) + rows
    ratio = paired_ratio(timings[CAMKIT], timings[FORWARD])
    setting = f"({where}, batch {batch}, layer {', '.join(ours.layers)})"
    goal = goal_at_most(TITLE, f"camkit GradCAM with a DetectionTarget within {TIME_LIMIT}x of a no-grad forward "
                        f"{setting}", ratio, TIME_LIMIT)
    floor = goal_at_most(TITLE, f"else: camkit within {FLOOR_LIMIT}x of the floor (the backward the score needs) "
                         f"{setting}", paired_ratio(timings[CAMKIT], timings[FLOOR]), FLOOR_LIMIT)
    return rows, [goal, floor]


@contextmanager
def _whole_head() -> Iterator[None]:
    """camkit's Grad-CAM with the single-stage narrowing off: the backward through the whole head."""
    from camkit.detection import narrow as _narrow

    keep = _narrow.single_stage
    _narrow.single_stage = lambda *args: None
    try:
        yield
    finally:
        _narrow.single_stage = keep


def _single_stage(ctx: Context, name: str, batch: int, height: int, width: int) -> list[Row | Goal]:
    """Rows for a torchvision single-stage detector: the forward, camkit narrowed, camkit with the whole head.

    On CUDA, RetinaNet (v1) also gets the goal against the forward (its hand-written floor is not measured here).
    """
    from torchvision.models import detection

    where = f"{name} {height}x{width}"
    torch.manual_seed(0)
    model = getattr(detection, name)(weights=None, weights_backbone=None, min_size=height, max_size=width,
                                     score_thresh=0.0).eval().to(ctx.device)
    x = _input(batch, height, width, ctx.device)
    target = camkit.DetectionTarget.from_detections(_top_detections(model, x, False), iou_threshold=0.5)
    explainer = camkit.GradCAM(model)

    def forward() -> Any:
        with torch.no_grad():
            return model(x)

    def whole() -> camkit.Explanation:
        with _whole_head():
            return explainer.explain(x, target)

    fns: dict[str, Callable[[], Any]] = {FORWARD: forward, CAMKIT: lambda: explainer.explain(x, target), WHOLE_HEAD: whole}
    diffs = {WHOLE_HEAD: max_abs_diff(fns[CAMKIT]().maps, whole().maps)}  # also the warm-up
    ctx.log(f"    max |narrowed - whole head| = {diffs[WHOLE_HEAD]:.2e}")
    timings = ctx.time(fns, repeats=ctx.repeats if ctx.smoke else min(ctx.repeats, REPEATS), warmup=0)
    rows: list[Row | Goal] = list(rows_for_timings(TITLE, timings, reference=FORWARD, model=where, batch=batch,
                                                   device=ctx.device, camkit=CAMKIT, diffs=diffs))
    if ctx.device.type == "cuda" and name == SINGLE_STAGE[0] and not ctx.smoke:
        rows.append(goal_at_most(TITLE, f"camkit GradCAM with a DetectionTarget within {TIME_LIMIT}x of a no-grad "
                                 f"forward ({where}, batch {batch})", paired_ratio(timings[CAMKIT], timings[FORWARD]),
                                 TIME_LIMIT, reason="no hand-written floor for RetinaNet in this case"))
    return rows


def run(ctx: Context) -> Sequence[Row | Goal]:
    """Time each configuration of this mode; one goal per model (none for the single-stage detectors)."""
    rows: list[Row | Goal] = []
    goals: list[Goal] = []
    for name, yolo, batch, height, width in _configs(ctx):
        ctx.log(f"  {TITLE}: {name}, batch {batch}, {height}x{width}")
        more_rows, more_goals = _one(ctx, name, yolo, batch, height, width)
        rows += more_rows
        goals += more_goals
    for name in SINGLE_STAGE[:1] if ctx.smoke else SINGLE_STAGE:
        batch, height, width = (1, 64, 96) if ctx.smoke else (2, 480, 640)
        if ctx.device.type == "cuda" and name == SINGLE_STAGE[0] and not ctx.smoke:
            batch = 4  # the GPU goal's batch
        ctx.log(f"  {TITLE}: {name}, batch {batch}, {height}x{width}")
        rows += _single_stage(ctx, name, batch, height, width)
    return [*rows, *goals]
