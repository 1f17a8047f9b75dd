"""A detection's score with the backward graph of only what it depends on.

The kept detection of a two-stage detector (torchvision's Faster/Mask/Keypoint R-CNN) is scored
from one proposal: its features pooled from the feature pyramid, the box head, the class
softmax. A plain forward builds the box head's graph for every proposal (about a thousand per
image) and the backward runs through all of it, and through every level of the pyramid, for a
score that reads one row. Here the region proposal network and the ROI heads run without
autograd; the ROI heads' inputs are kept, each detection the target picks is traced back to its
proposal (the one whose class probability and decoded box are the detection's, bit for bit),
and the pooling, box head and softmax are run again for those proposals alone, with a graph.
The score is the same value; its gradient at any layer before the ROI heads is the same. A
detection that cannot be traced (no proposal gives it bit for bit) is never scored from a wrong
proposal: on the host the box head runs for every proposal with a graph and the heads' own
post-processing scores the picked detections (the whole heads' graph, one read decides); on a
device, where that read would wait for it, such a detection scores NaN and its map is flat.

Ultralytics' dense heads get the same treatment, one candidate's window at a time
(:mod:`camkit.detection.narrow_dense`), and so do torchvision's single-stage detectors, RetinaNet,
FCOS, SSD and SSDlite: their head runs without autograd, each picked detection is traced back to
its anchor, and the class branch of that anchor's level is rerun on the window around it (or on
the level's whole map where a group norm spans it) (:mod:`camkit.detection.narrow_single`).

The explainers' base class calls :func:`narrowed_scores` (as ``camkit.detection.narrowed_scores``);
the wing's one entry to the narrowing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, cast

import torch
from torch import Tensor, nn

from .._internal import syncs as _syncs
from .._internal.state import GradModes
from ..hooks import HookScope
from .narrow_dense import dense_head, narrowed_dense_scores
from .narrow_single import narrowed_single_scores, single_stage

__all__ = ["narrowed_scores"]

Narrow = Callable[[Tensor], Tensor]


def _rcnn_parts(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """``(rpn, roi_heads)`` of a torchvision two-stage detector, else ``None``."""
    rpn, heads = getattr(model, "rpn", None), getattr(model, "roi_heads", None)
    if not isinstance(rpn, nn.Module) or not isinstance(heads, nn.Module):
        return None
    wanted = ("box_roi_pool", "box_head", "box_predictor", "box_coder", "postprocess_detections")
    if not all(hasattr(heads, name) for name in wanted):
        return None
    return rpn, heads


def _applies(model: nn.Module, target: Any, layers: Sequence[str], output: Any) -> tuple[nn.Module, nn.Module] | None:
    if output is not None or not callable(getattr(target, "picked", None)) or model.training:
        return None
    parts = _rcnn_parts(model)
    if parts is None or any(name.split(".")[0] in ("rpn", "roi_heads") for name in layers):
        return None  # a layer inside the heads needs their whole graph
    return parts


def narrowed_scores(
    model: nn.Module, target: Any, layers: Sequence[str], output: Any
) -> AbstractContextManager[tuple[Narrow, bool]]:
    """Inside the block, a detector's heads run without autograd; yields ``(narrow, unreached_zero)``.

    ``narrow`` takes the target's scores (computed from the detached output) and returns the
    same scores carrying the graph of the picked proposals (R-CNN) or candidates (ultralytics,
    torchvision's single-stage detectors) alone. ``unreached_zero``: a layer the narrowed graph
    does not reach has a zero gradient (it feeds only the parts of the head the score does not
    read), not an error. For any other model, target or layer choice nothing changes: ``narrow``
    returns the scores as they are.
    """
    if not callable(getattr(target, "picked", None)) and not callable(getattr(target, "picked_labels", None)):
        return nullcontext((_unchanged, False))  # not a target that names detections: nothing to narrow
    return _narrowed(model, target, layers, output)


def _unchanged(scores: Tensor) -> Tensor:
    return scores


@contextmanager
def _narrowed(model: nn.Module, target: Any, layers: Sequence[str], output: Any) -> Iterator[tuple[Narrow, bool]]:
    parts = _applies(model, target, layers, output)
    if parts is None:
        stage = single_stage(model, target, layers, output)
        if stage is not None:
            with narrowed_single_scores(stage, target) as narrow:
                yield narrow, True
            return
        head = dense_head(model, target, layers, output)
        if head is None:
            yield _unchanged, False
        else:
            with narrowed_dense_scores(head, target) as narrow:
                yield narrow, True
        return
    rpn, heads = parts
    seen: dict[str, Any] = {}
    modes = GradModes()

    def off(module: nn.Module, args: Any, kwargs: Any) -> None:
        modes.enter(False)
        if module is heads:
            seen["inputs"] = (args, kwargs)

    def back(module: nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        modes.leave()
        if module is heads:
            seen["result"] = [dict(found) for found in out[0]]  # the transform then rescales the boxes in place

    def predicted(module: nn.Module, args: Any, out: Any) -> None:
        seen["predicted"] = out

    with modes, HookScope() as scope:
        for module in (rpn, heads):
            scope.forward_pre(module, off, with_kwargs=True)
            scope.forward(module, back, with_kwargs=True)
        scope.forward(cast(nn.Module, heads.box_predictor), predicted)
        yield (lambda scores: _rescore(heads, seen, target, scores)), False


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs[name]


def _rescore(heads: Any, seen: dict[str, Any], target: Any, scores: Tensor) -> Tensor:
    """The target's scores [B] or [B, N], recomputed with a graph from the picked proposals alone."""
    from torchvision.ops import boxes as box_ops

    args, kwargs = seen["inputs"]
    features = _argument(args, kwargs, 0, "features")
    proposals: list[Tensor] = _argument(args, kwargs, 1, "proposals")
    image_shapes: list[tuple[int, int]] = _argument(args, kwargs, 2, "image_shapes")
    result: list[dict[str, Tensor]] = seen["result"]
    class_logits, box_regression = seen["predicted"]
    picked: Tensor = target.picked()  # [B, N]: each reference's kept detection
    with torch.no_grad():
        probs = class_logits.softmax(dim=-1)
        decoded = heads.box_coder.decode(box_regression, proposals)  # [P, K, 4], as the heads decode them
        rois, labels, traced = [], [], []
        start = 0
        for b, (image_proposals, shape) in enumerate(zip(proposals, image_shapes)):
            stop = start + image_proposals.shape[0]
            boxes = box_ops.clip_boxes_to_image(decoded[start:stop], shape)  # [P_b, K, 4]
            label = result[b]["labels"][picked[b]]  # [N]
            kept_box, kept_score = result[b]["boxes"][picked[b]], result[b]["scores"][picked[b]]
            same_score = probs[start:stop][:, label].T == kept_score[:, None]  # [N, P_b]
            same_box = (boxes[:, label] == kept_box[None]).all(dim=-1).T  # [N, P_b]
            same = same_score & same_box
            proposal = same.int().argmax(dim=1)  # [N]: the first proposal that gave it
            rois.append(image_proposals[proposal])
            labels.append(label)
            traced.append(same.any(dim=1))
            start = stop
    found = torch.cat(traced)  # [B * N]: each detection traced to a proposal
    on_host = _syncs.reads_are_free(found)
    if on_host and not bool(found.all()):
        return _whole_box_head(heads, features, proposals, image_shapes, picked, scores)
    with torch.enable_grad():
        pooled = heads.box_roi_pool(features, rois, image_shapes)
        logits, _ = heads.box_predictor(heads.box_head(pooled))
        rescored = logits.softmax(dim=-1).gather(1, torch.cat(labels)[:, None])[:, 0]
        if not on_host:  # a detection not traced scores NaN, with no gradient (its map flat), not another's score
            rescored = torch.where(found, rescored, torch.full_like(rescored, math.nan))
    return rescored.view(scores.shape[0], -1) if scores.dim() == 2 else rescored.view(scores.shape)


def _whole_box_head(
    heads: Any, features: Any, proposals: list[Tensor], image_shapes: list[tuple[int, int]], picked: Tensor, scores: Tensor
) -> Tensor:
    """The picked detections' scores [B] or [B, N] through the box head of every proposal, kept by the heads' own post-processing."""
    with torch.enable_grad():
        pooled = heads.box_roi_pool(features, proposals, image_shapes)
        class_logits, box_regression = heads.box_predictor(heads.box_head(pooled))
        _, kept, _ = heads.postprocess_detections(class_logits, box_regression, proposals, image_shapes)
    rescored = torch.stack([image_scores[p] for image_scores, p in zip(kept, picked)])  # [B, N]
    return rescored if scores.dim() == 2 else rescored.view(scores.shape)
