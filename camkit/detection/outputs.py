"""Reading detectors and their outputs: boxes, raw candidates, which output to score, what a model detects.

* boxes: :func:`box_iou`, :func:`cxcywh_to_xyxy`;
* ultralytics' outputs: :func:`candidates_of` (the raw candidates before NMS) and
  :func:`default_output` (what an explainer scores of a model whose output is a tuple);
* what a model is and what it found: :func:`task_of` (``"detect"``, ``"segment"`` or ``None``)
  and :func:`detections_of` (any detector's output as torchvision-style detections per image);
* :func:`threshold_hint`: which threshold to lower when a detector keeps nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError, OutputSelectionError
from ..layers.families.ultralytics import is_ultralytics

__all__ = [
    "box_iou", "candidates_of", "cxcywh_to_xyxy", "default_output", "detections_of", "task_of", "threshold_hint",
]  # fmt: skip

_SEGMENTERS = {"FCN", "DeepLabV3", "LRASPP", "SegformerForSemanticSegmentation"}
_NMS_IOU = 0.7


def box_iou(boxes: Tensor, reference: Tensor) -> Tensor:
    """IoU of boxes [..., N, 4] with reference boxes [..., 4], all ``(x1, y1, x2, y2)``: [..., N].

    Example:
        >>> import torch
        >>> from camkit.detection import box_iou
        >>> box_iou(torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0]]), torch.tensor([0.0, 0.0, 2.0, 2.0]))
        tensor([1.0000, 0.3333])
    """
    reference = reference.unsqueeze(-2)
    lt = torch.maximum(boxes[..., :2], reference[..., :2])
    rb = torch.minimum(boxes[..., 2:], reference[..., 2:])
    inter = (rb - lt).clamp_min(0).prod(dim=-1)
    area = (boxes[..., 2:] - boxes[..., :2]).clamp_min(0).prod(dim=-1)
    ref_area = (reference[..., 2:] - reference[..., :2]).clamp_min(0).prod(dim=-1)
    union = area + ref_area - inter
    return torch.where(union > 0, inter / torch.where(union > 0, union, torch.ones_like(union)), torch.zeros_like(union))


def cxcywh_to_xyxy(boxes: Tensor) -> Tensor:
    """Boxes [..., 4] as centre x, y, width, height to corners x1, y1, x2, y2.

    Example:
        >>> import torch
        >>> from camkit.detection import cxcywh_to_xyxy
        >>> cxcywh_to_xyxy(torch.tensor([4.0, 3.0, 2.0, 4.0]))
        tensor([3., 1., 5., 5.])
    """
    centre, size = boxes[..., :2], boxes[..., 2:4]
    return torch.cat([centre - size / 2, centre + size / 2], dim=-1)


def candidates_of(output: Any) -> Tensor | None:
    """The raw candidates [B, 4 + K (+ extra), A] in an ultralytics detector's output, else ``None``.

    Ultralytics' detectors return ``(candidates, extras)`` in eval mode, its segmenter
    ``((candidates, protos), extras)``; the bare tensor is accepted too.

    Example:
        >>> import torch
        >>> from camkit.detection import candidates_of
        >>> candidates_of((torch.zeros(2, 7, 10), {"feats": []})).shape
        torch.Size([2, 7, 10])
    """
    while isinstance(output, (tuple, list)) and output and not isinstance(output[0], Mapping):
        output = output[0]
    if isinstance(output, Tensor) and output.dim() == 3 and output.shape[1] >= 5:
        return output
    return None


def _ultralytics_candidates(output: Any) -> Tensor:
    found = candidates_of(output)
    if found is None:
        raise OutputSelectionError("the ultralytics model did not return raw candidates [B, 4 + K, A]")
    return found


def _ultralytics_probabilities(output: Any) -> Tensor:
    # Classify returns (probabilities, logits) in eval mode and the logits alone in training mode
    return output[0] if isinstance(output, (tuple, list)) else output


def default_output(model: nn.Module) -> Any:
    """What to score of a model whose output is a tuple camkit knows, when no ``output=`` is given.

    Ultralytics' classifier: its probabilities (the first of ``(probabilities, logits)``);
    its detectors, segmenters and pose models: the raw candidates [B, 4 + K (+ extra), A]
    (:func:`candidates_of`). ``None`` for other models (their output is used as it is, or a
    Hugging Face output's ``logits``: :func:`camkit.targets.select_output`).

    Example:
        >>> from torch import nn
        >>> from camkit.detection import default_output
        >>> default_output(nn.Linear(2, 2)) is None
        True
    """
    kind = is_ultralytics(model)
    if kind is None:
        return None
    return _ultralytics_probabilities if kind == "ClassificationModel" else _ultralytics_candidates


def _class_count(output: Any, model: nn.Module | None) -> int | None:
    """K of an ultralytics output: from its extras' ``scores`` [B, K, A], else from the model's head."""
    if isinstance(output, (tuple, list)) and len(output) > 1 and isinstance(output[-1], Mapping):
        scores = output[-1].get("scores")
        if isinstance(scores, Tensor) and scores.dim() == 3:
            return int(scores.shape[1])
    inner = getattr(model, "model", None)
    count = getattr(inner[-1], "nc", None) if isinstance(inner, nn.Sequential) and len(inner) else None
    if isinstance(count, int):
        return count
    return None


def _is_detr(output: Any) -> bool:
    get = output.get if isinstance(output, Mapping) else lambda key: getattr(output, key, None)
    logits, boxes = get("logits"), get("pred_boxes")
    return isinstance(logits, Tensor) and isinstance(boxes, Tensor) and logits.dim() == 3 and boxes.dim() == 3


def _torchvision_classes(model: nn.Module | None) -> int | None:
    """The number of classes of a torchvision detector (background included), when its head says."""
    for path in (
        "roi_heads.box_predictor.cls_score.out_features",
        "head.classification_head.num_classes",
        "head.classification_head.num_columns",  # SSD, SSDlite
    ):
        value: Any = model
        for part in path.split("."):
            value = getattr(value, part, None)
        if isinstance(value, int):
            return value
    return None


def threshold_hint(model: nn.Module | None, option: str | None = None) -> str:
    """What to lower so that a detector keeps the object: its score threshold, named as the reader sets it.

    torchvision's detectors keep a detection only above their own threshold
    (``roi_heads.score_thresh`` of the R-CNNs, ``score_thresh`` of the single-stage ones).

    Args:
        model: the detector (``None``: not known).
        option: the command-line option that sets camkit's own threshold (``camkit explain``'s
            ``--score-threshold``), named first; ``None``: the model's threshold alone (Python).

    Example:
        >>> from torch import nn
        >>> from camkit.detection import threshold_hint
        >>> threshold_hint(nn.Linear(2, 2)), threshold_hint(nn.Linear(2, 2), "--score-threshold")
        ("the detector's score threshold", '--score-threshold')
    """
    found: tuple[str, float] | None = None
    for path in ("roi_heads.score_thresh", "score_thresh") if model is not None else ():
        owner: Any = model
        for part in path.split(".")[:-1]:
            owner = getattr(owner, part, None)
        value = getattr(owner, path.split(".")[-1], None)
        if isinstance(value, float):
            found = path, value
            break
    if option is not None:
        return f"{option}, or the model's {found[0]} (box_score_thresh / score_thresh when building it)" if found else option
    if model is None:
        return "the detector's score threshold (torchvision: box_score_thresh / score_thresh)"
    if found is not None:
        return f"model.{found[0]} (now {found[1]}; the box_score_thresh / score_thresh argument when building it)"
    return "the detector's score threshold"


def task_of(model: nn.Module) -> str | None:
    """``"detect"``, ``"segment"`` or ``None`` (a classifier, or a model camkit does not know).

    Example:
        >>> from torch import nn
        >>> from camkit.detection import task_of
        >>> task_of(nn.Linear(2, 2)) is None
        True
    """
    names = {cls.__name__ for cls in type(model).__mro__}
    if type(getattr(model, "transform", None)).__name__ == "GeneralizedRCNNTransform":
        return "detect"
    kind = is_ultralytics(model)
    if kind is not None:
        return None if kind == "ClassificationModel" else "detect"
    if names & {"DetrForObjectDetection"}:
        return "detect"
    if names & _SEGMENTERS:
        return "segment"
    return None


def detections_of(model: nn.Module, output: Any, size: tuple[int, int]) -> list[dict[str, Tensor]]:
    """A detector's output as torchvision-style detections per image (boxes x1, y1, x2, y2 in input pixels).

    torchvision's list is returned as it is; ultralytics' raw candidates go through class-wise
    NMS at IoU 0.7 (each candidate scored by its best class); DETR's queries are each labelled
    with their best real class and scored by its softmax probability, whatever the "no object"
    probability, as Hugging Face's ``post_process_object_detection`` does (a score threshold then
    keeps what that function keeps at the same threshold).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.detection import detections_of
        >>> dets = [{"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}]
        >>> detections_of(nn.Identity(), dets, (8, 8)) == dets  # torchvision's list, as it is
        True
    """
    if isinstance(output, (list, tuple)) and output and isinstance(output[0], dict) and "boxes" in output[0]:
        return list(output)
    candidates = candidates_of(output)
    if candidates is not None and is_ultralytics(model) is not None:
        from torchvision.ops import batched_nms

        layers = model.get_submodule("model")
        head = layers[-1] if isinstance(layers, nn.Sequential) else None
        count = getattr(head, "nc", None)
        classes = count if isinstance(count, int) else candidates.shape[1] - 4
        found = []
        for sample in candidates.detach():
            boxes = cxcywh_to_xyxy(sample[:4].T)
            scores, labels = sample[4 : 4 + classes].max(dim=0)
            keep = batched_nms(boxes, scores, labels, _NMS_IOU)
            found.append({"boxes": boxes[keep], "scores": scores[keep], "labels": labels[keep]})
        return found
    logits, pred = getattr(output, "logits", None), getattr(output, "pred_boxes", None)
    if isinstance(logits, Tensor) and isinstance(pred, Tensor):
        height, width = size
        probs = logits.detach().softmax(dim=-1)
        found = []
        for p, b in zip(probs, pred.detach()):
            scores, labels = p[:, :-1].max(dim=-1)
            boxes = cxcywh_to_xyxy(b * b.new_tensor([width, height, width, height]))
            found.append({"boxes": boxes, "scores": scores, "labels": labels})
        return found
    raise InvalidInputError(f"{type(model).__name__} returned {type(output).__name__}, not detections camkit can read")
