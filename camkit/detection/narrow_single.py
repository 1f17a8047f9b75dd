"""A detection's score with the backward graph of only what it depends on (torchvision's single-stage detectors).

RetinaNet, FCOS, SSD and SSDlite score every anchor (FCOS: every point) of every level of their
feature maps, and their post-processing keeps a few hundred of those candidates. A kept
detection's score reads one candidate: the sigmoid of one class logit (RetinaNet), the square
root of that times the sigmoid of the point's centerness (FCOS), or one class of the softmax
over an anchor's classes (SSD, SSDlite). A plain forward builds the graph of the class and box
branches at every position of every level, and the backward runs through all of it.

Here the head runs without autograd; its input features (attached to the backbone's graph), its
outputs, the anchors and the image sizes are kept. Each detection the target picks is traced
back to its candidate: the probabilities of every candidate are computed again exactly as the
post-processing computes them (the same operations on the same tensors, so the same bits), and
the candidate is the anchor whose probability for the detection's label equals the detection's
score and whose box (decoded, clipped, then rescaled to the input as the transform rescales it)
lies nearest to the detection's box: the same box, but for the rounding of the decoding's
exponential, which the post-processing computes on a subset of the anchors. Then only the class
branch of that candidate's level (and, for FCOS, the box tower with its centerness layer) is run
again, with a graph:

* on the window of the level's map that the position reads, where the branch is a chain of
  stride-1 "same" convolutions, batch norms and pointwise activations (RetinaNet with the
  original head, SSD's one convolution, SSDlite's depthwise and pointwise pair): see
  :func:`camkit.detection.narrow_dense.branch_at` (on a level so small that the windows would hold
  more positions than its maps, on the maps);
* on the level's whole map where a group norm takes its statistics over every position
  (RetinaNet v2 and FCOS): a window would change them.

The score is the same value and its gradient at any layer before the head is the same. On the
host, only the levels that hold a picked candidate are rerun, and the trace is checked in the
same read: should a detection have no candidate (a post-processing camkit does not know), the
whole head is run again with a graph and post-processed again, the full graph from the features
on. On a device nothing is read back: every level is rerun and each candidate's level selected
with ``torch.where``.

Used by :mod:`camkit.detection.narrow`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._internal.state import GradModes
from ..hooks import HookScope
from .narrow_dense import branch_at, by_level

__all__ = ["SingleStage", "narrowed_single_scores", "single_stage"]

Narrow = Callable[[Tensor], Tensor]

#: how far a traced box may lie from the kept one, relative to its largest coordinate (plus one):
#: the exponential of the box decoding may round differently on another subset of anchors
_CLOSE = 1e-5


@dataclass(frozen=True)
class SingleStage:
    """What rescoring a torchvision single-stage detector needs.

    Attributes:
        model: the detector (RetinaNet, FCOS or SSD, SSDlite included).
        score: ``"sigmoid"`` (RetinaNet), ``"centerness"`` (FCOS) or ``"softmax"`` (SSD).
        classes: the class branch, features [*, C, H, W] to logits [*, A * K, H, W]: one module
            for every level, or one per level.
        centerness: FCOS: its box tower and centerness layer, features to [*, A, H, W]; else ``None``.
        columns: K, the class logits per anchor.
    """

    model: nn.Module
    score: str
    classes: tuple[nn.Module, ...]
    centerness: tuple[nn.Module, ...] | None
    columns: int


def _unchanged(obj: object, base: type, *names: str) -> bool:
    """Whether ``obj`` is a ``base`` that keeps ``base``'s own methods ``names``."""
    return isinstance(obj, base) and all(getattr(type(obj), name) is getattr(base, name) for name in names)


def _torchvision_detector(model: nn.Module) -> bool:
    return any(kind.__module__.startswith("torchvision.models.detection") for kind in type(model).__mro__)


def single_stage(model: nn.Module, target: Any, layers: Sequence[str], output: Any) -> SingleStage | None:
    """The parts of a torchvision RetinaNet, FCOS, SSD or SSDlite whose class branch can be rerun, else ``None``.

    ``None`` also when an ``output=`` selector is set, the target does not report the detections
    it picked (or scores a vanished detection 0, as :meth:`~camkit.DetectionTarget.for_rows`
    rows do), the model or any module of its head is in training mode, a layer lies inside the
    head, or the detector's class replaces a method the rescoring relies on (its forward, its
    post-processing, its head's forwards) or its box coder is not torchvision's.
    """
    if output is not None or model.training or not callable(getattr(target, "picked", None)):
        return None
    if getattr(target, "absent_scores_zero", False) or not _torchvision_detector(model):
        return None
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Module) or any(module.training for module in head.modules()):
        return None
    if any(name.split(".")[0] == "head" for name in layers):
        return None  # a layer inside the head needs its whole graph
    from torchvision.models.detection import _utils as det_utils
    from torchvision.models.detection import fcos, retinanet, ssd, ssdlite

    methods = ("forward", "postprocess_detections")
    parts: Any = head  # its branches, typed loosely
    coder = type(getattr(model, "box_coder", None))
    if coder is not (det_utils.BoxLinearCoder if isinstance(model, fcos.FCOS) else det_utils.BoxCoder):
        return None  # the boxes are traced with torchvision's own decoding
    if _unchanged(model, retinanet.RetinaNet, *methods) and _unchanged(head, retinanet.RetinaNetHead, "forward"):
        cls = parts.classification_head
        if _unchanged(cls, retinanet.RetinaNetClassificationHead, "forward"):
            return SingleStage(model, "sigmoid", (nn.Sequential(cls.conv, cls.cls_logits),), None, int(cls.num_classes))
    if _unchanged(model, fcos.FCOS, *methods) and _unchanged(head, fcos.FCOSHead, "forward"):
        cls, reg = parts.classification_head, parts.regression_head
        if _unchanged(cls, fcos.FCOSClassificationHead, "forward") and _unchanged(reg, fcos.FCOSRegressionHead, "forward"):
            centerness = (nn.Sequential(reg.conv, reg.bbox_ctrness),)
            return SingleStage(
                model, "centerness", (nn.Sequential(cls.conv, cls.cls_logits),), centerness, int(cls.num_classes)
            )
    if _unchanged(model, ssd.SSD, *methods) and (
        _unchanged(head, ssd.SSDHead, "forward") or _unchanged(head, ssdlite.SSDLiteHead, "forward")
    ):
        cls = parts.classification_head
        if _unchanged(cls, ssd.SSDScoringHead, "forward", "_get_result_from_module_list"):
            return SingleStage(model, "softmax", tuple(cls.module_list), None, int(cls.num_columns))
    return None


@contextmanager
def narrowed_single_scores(stage: SingleStage, target: Any) -> Iterator[Narrow]:
    """Inside the block, the detector's head runs without autograd; yields ``narrow(scores)`` (see the module docstring)."""
    model = cast(Any, stage.model)
    seen: dict[str, Any] = {"again": False}
    modes = GradModes()

    def off(module: nn.Module, args: Any) -> None:
        if not seen["again"]:  # the fallback runs the head again, with a graph
            modes.enter(False)
            seen["features"] = list(args[0])  # [B, C, H_l, W_l] per level, attached to the backbone's graph

    def back(module: nn.Module, args: Any, out: Any) -> None:
        if not seen["again"]:
            modes.leave()
            seen["outputs"] = out

    def anchors(module: nn.Module, args: Any, out: Any) -> None:
        seen["anchors"] = out  # [A, 4] per image, every level

    def sizes(module: nn.Module, args: Any, out: Any) -> None:
        seen["original"] = [(int(image.shape[-2]), int(image.shape[-1])) for image in args[0]]
        seen["resized"] = [(int(h), int(w)) for h, w in out[0].image_sizes]

    def result(module: nn.Module, args: Any, out: Any) -> None:
        seen["result"] = out

    with modes, HookScope() as scope:
        scope.forward_pre(model.head, off)
        scope.forward(model.head, back)
        scope.forward(model.anchor_generator, anchors)
        scope.forward(model.transform, sizes)
        scope.forward(model, result)
        yield lambda scores: _rescore(stage, seen, target, scores)


def _levels(stage: SingleStage, seen: dict[str, Any]) -> list[tuple[int, int, int]] | None:
    """``(H, W, A)`` of every level as the head's outputs lay them out, else ``None`` (shapes that disagree)."""
    sizes = [(int(f.shape[-2]), int(f.shape[-1])) for f in seen["features"]]
    total = int(seen["outputs"]["cls_logits"].shape[1])
    if stage.score == "softmax":  # SSD: anchors per position differ from level to level
        anchors = [int(a) for a in cast(Any, stage.model).anchor_generator.num_anchors_per_location()]
        if len(anchors) != len(sizes) or len(stage.classes) != len(sizes):
            return None
    else:  # as RetinaNet's and FCOS's forwards split them: the same anchors at every position
        anchors = [total // max(1, sum(h * w for h, w in sizes))] * len(sizes)
    if sum(h * w * a for (h, w), a in zip(sizes, anchors)) != total:
        return None
    return [(h, w, a) for (h, w), a in zip(sizes, anchors)]


def _rescore(stage: SingleStage, seen: dict[str, Any], target: Any, scores: Tensor) -> Tensor:
    """The target's scores [B] or [B, N], recomputed with a graph from the picked candidates' branches alone."""
    levels = _levels(stage, seen)
    if levels is None:
        return _full(stage, seen, target)
    picked: Tensor = target.picked()  # [B, N]: each reference's kept detection
    batch, count = picked.shape
    with torch.no_grad():
        candidate, label, found = _trace(stage, seen, picked, [h * w * a for h, w, a in levels])
    image = torch.arange(batch, device=picked.device).repeat_interleave(count)  # [M], M = B * N
    candidate, label = candidate.reshape(-1), label.reshape(-1)
    features: list[Tensor] = seen["features"]
    rescored = by_level(
        candidate,
        [h * w * a for h, w, a in levels],
        lambda level, local: _level_score(stage, level, features[level], levels[level], image, local, label),
        check=found.reshape(-1),  # on the host: one read, the levels to rerun and the trace's check
    )
    if rescored is None:
        return _full(stage, seen, target)
    return rescored.view(batch, count) if scores.dim() == 2 else rescored.view(scores.shape)


def _trace(stage: SingleStage, seen: dict[str, Any], picked: Tensor, counts: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    """``(candidate, label, found)`` [B, N] each: the flat index in the head's outputs of each picked detection."""
    result: list[dict[str, Tensor]] = seen["result"]
    label = torch.stack([det["labels"][p] for det, p in zip(result, picked)])  # [B, N]
    kept = torch.stack([det["scores"][p] for det, p in zip(result, picked)])  # [B, N]
    box = torch.stack([det["boxes"][p] for det, p in zip(result, picked)])  # [B, N, 4], the input's pixels
    probs = _probabilities(stage, seen["outputs"], counts)  # [B, A, K]
    same = probs.gather(2, label[:, None, :].expand(-1, probs.shape[1], -1)).transpose(1, 2) == kept[..., None]
    boxes = _boxes(stage, seen)  # [B, A, 4]
    gap = (boxes[:, None] - box[:, :, None]).abs().amax(dim=-1)  # [B, N, A]
    nearest, candidate = torch.where(same, gap, torch.full_like(gap, math.inf)).min(dim=2)
    found = nearest <= _CLOSE * (1 + box.abs().amax(dim=-1))
    return candidate, label, found


def _probabilities(stage: SingleStage, outputs: dict[str, Tensor], counts: list[int]) -> Tensor:
    """Every candidate's class probabilities [B, A, K], computed as the post-processing computes them.

    RetinaNet and FCOS take them image by image and level by level, SSD for the whole batch at
    once: the same calls on tensors of the same shapes, so the same bits (a vectorised kernel
    rounds its tail elements differently).
    """
    logits = outputs["cls_logits"]
    if stage.score == "softmax":
        return F.softmax(logits, dim=-1)
    per_level = logits.split(counts, dim=1)
    centerness = outputs["bbox_ctrness"].split(counts, dim=1) if stage.score == "centerness" else None
    images = []
    for b in range(logits.shape[0]):
        if centerness is None:
            parts = [torch.sigmoid(level[b]) for level in per_level]
        else:
            parts = [torch.sqrt(torch.sigmoid(level[b]) * torch.sigmoid(c[b])) for level, c in zip(per_level, centerness)]
        images.append(torch.cat(parts))
    return torch.stack(images)


def _boxes(stage: SingleStage, seen: dict[str, Any]) -> Tensor:
    """Every candidate's box [B, A, 4] as the detections report it: decoded, clipped, rescaled to the input."""
    from torchvision.ops.boxes import clip_boxes_to_image

    coder: Any = cast(Any, stage.model).box_coder
    decode = coder.decode if stage.score == "centerness" else lambda codes, anchors: _decoded(coder, codes, anchors)
    out = []
    for codes, anchors, size, original in zip(
        seen["outputs"]["bbox_regression"], seen["anchors"], seen["resized"], seen["original"]
    ):
        clipped = clip_boxes_to_image(decode(codes, anchors), size)
        # as the transform's resize_boxes: float32 ratios of the sizes, one product per coordinate
        height, width = (float(np.float32(o) / np.float32(s)) for o, s in zip(original, size))
        x1, y1, x2, y2 = clipped.unbind(-1)
        out.append(torch.stack((x1 * width, y1 * height, x2 * width, y2 * height), dim=-1))
    return torch.stack(out)


def _decoded(coder: Any, codes: Tensor, anchors: Tensor) -> Tensor:
    """Boxes [A, 4] from offsets [A, 4]: torchvision's ``BoxCoder.decode_single``, op for op (so the same bits).

    Its ``torch.tensor(0.5, device=...)`` is a Python scalar here: a tensor made from a host
    value would be copied to the device, and the host would wait for that copy.
    """
    anchors = anchors.to(codes.dtype)
    widths, heights = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
    ctr_x, ctr_y = anchors[:, 0] + 0.5 * widths, anchors[:, 1] + 0.5 * heights
    wx, wy, ww, wh = coder.weights
    dx, dy = codes[:, 0::4] / wx, codes[:, 1::4] / wy
    dw = torch.clamp(codes[:, 2::4] / ww, max=coder.bbox_xform_clip)
    dh = torch.clamp(codes[:, 3::4] / wh, max=coder.bbox_xform_clip)
    pred_ctr_x, pred_ctr_y = dx * widths[:, None] + ctr_x[:, None], dy * heights[:, None] + ctr_y[:, None]
    half_w, half_h = 0.5 * (torch.exp(dw) * widths[:, None]), 0.5 * (torch.exp(dh) * heights[:, None])
    corners = (pred_ctr_x - half_w, pred_ctr_y - half_h, pred_ctr_x + half_w, pred_ctr_y + half_h)
    return torch.stack(corners, dim=2).flatten(1)


def _level_score(
    stage: SingleStage, level: int, feature: Tensor, shape: tuple[int, int, int], image: Tensor, local: Tensor,
    label: Tensor,
) -> Tensor:
    """The score [M] of the candidate at flat index ``local`` [M] of this level, from its branch rerun with a graph.

    Indices outside the level (candidates of another level) give a value to be discarded.
    """
    height, width, anchors = shape
    local = local.clamp(0, height * width * anchors - 1)
    anchor, position = local % anchors, local // anchors
    row, col = position // width, position % width
    each = torch.arange(local.shape[0], device=local.device)
    branch = stage.classes[level if len(stage.classes) > 1 else 0]
    logits = branch_at(branch, feature, image, row, col, cheapest=True).reshape(-1, anchors, stage.columns)  # [M, A, K]
    if stage.score == "softmax":
        return logits[each, anchor].softmax(dim=-1)[each, label]
    value = logits[each, anchor, label].sigmoid()
    if stage.centerness is not None:
        tower = stage.centerness[level if len(stage.centerness) > 1 else 0]
        value = torch.sqrt(value * branch_at(tower, feature, image, row, col, cheapest=True)[each, anchor].sigmoid())
    return value


def _full(stage: SingleStage, seen: dict[str, Any], target: Any) -> Tensor:
    """The target's scores from the whole head run again with a graph and post-processed again."""
    model = cast(Any, stage.model)
    anchors, resized = seen["anchors"], seen["resized"]
    seen["again"] = True
    try:
        with torch.enable_grad():
            outputs = model.head(seen["features"])
    finally:
        seen["again"] = False
    with torch.enable_grad():
        if stage.score == "softmax":
            detections = model.postprocess_detections(outputs, anchors, resized)
        else:  # split by level as RetinaNet's and FCOS's forwards split them
            positions = [int(f.shape[-2]) * int(f.shape[-1]) for f in seen["features"]]
            per_position = int(outputs["cls_logits"].shape[1]) // sum(positions)
            counts = [n * per_position for n in positions]
            split = {key: list(value.split(counts, dim=1)) for key, value in outputs.items()}
            detections = model.postprocess_detections(split, [list(a.split(counts)) for a in anchors], resized)
        detections = model.transform.postprocess(detections, resized, seen["original"])
        return cast(Tensor, target(detections))
