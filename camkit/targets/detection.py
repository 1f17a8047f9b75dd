"""Detection targets: the score of one detection, for torchvision, ultralytics and DETR-style detectors.

:class:`DetectionTarget` reads three kinds of output, and scores sample ``b`` as follows:

=================================================  ===============================================================
output                                              score of sample ``b``
=================================================  ===============================================================
torchvision's list of per-image dicts               the reported score of the kept detection (of the label, when
(``boxes`` x1, y1, x2, y2; ``scores``; ``labels``)  given) with the best IoU with the reference box
raw candidates ``[B, 4 + K (+ extra), A]``, as      the class probability for the label of the candidate that best
ultralytics' detectors return them before NMS      overlaps the reference box (ties broken by that probability);
(boxes centre x, y, width, height in input pixels) without a label, the candidate's best class
DETR-style ``logits [B, Q, K + 1]`` and             the softmax probability (over the K + 1 columns) of the label,
``pred_boxes [B, Q, 4]`` (normalised centre, size)  for the query whose best real class (the "no object" column
                                                    left out, as Hugging Face's ``post_process_object_detection``
                                                    labels queries) is the label and whose box best overlaps;
                                                    without a label, the best-overlapping query's best real class
=================================================  ===============================================================

An image without a match (IoU below ``iou_threshold``, or nothing kept at all) raises
:class:`~camkit.errors.InvalidTargetError` naming the image, never a silent zero map.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from ..errors import InvalidTargetError, OutputSelectionError
from ..hooks import HookScope
from ..layers.families.ultralytics import is_ultralytics

__all__ = ["DetectionTarget", "box_iou", "candidates_of", "cxcywh_to_xyxy", "default_output", "per_sample"]


def per_sample(value: int | Sequence[int] | Tensor, batch: int, device: torch.device, name: str) -> Tensor:
    """``value`` as a LongTensor [B]: one int for every sample, or one per sample (checked)."""
    index = torch.as_tensor(value, device=device)
    if index.is_floating_point() or index.dtype == torch.bool:
        raise InvalidTargetError(f"{name} must be integers, got dtype {index.dtype}")
    if index.dim() == 0:
        return index.long().expand(batch)
    if index.dim() != 1 or index.shape[0] != batch:
        raise InvalidTargetError(f"{name} must be one int or {batch} ints (one per sample), got shape {list(index.shape)}")
    return index.long()


def box_iou(boxes: Tensor, reference: Tensor) -> Tensor:
    """IoU of boxes [..., N, 4] with reference boxes [..., 4], all ``(x1, y1, x2, y2)``: [..., N].

    Example:
        >>> import torch
        >>> from camkit.targets.tasks import box_iou
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
        >>> from camkit.targets.detection import cxcywh_to_xyxy
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
        >>> from camkit.targets.detection import candidates_of
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
        >>> from camkit.targets.detection import default_output
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


def _threshold_hint(model: nn.Module | None) -> str:
    """Which attribute of a torchvision detector decides what its post-processing keeps."""
    if model is None:
        return "the detector's score threshold (torchvision: box_score_thresh / score_thresh)"
    for path in ("roi_heads.score_thresh", "score_thresh"):
        owner: Any = model
        for part in path.split(".")[:-1]:
            owner = getattr(owner, part, None)
        value = getattr(owner, path.split(".")[-1], None)
        if isinstance(value, float):
            return f"model.{path} (now {value}; the box_score_thresh / score_thresh argument when building it)"
    return "the detector's score threshold"


class DetectionTarget:
    """The score of the detection that best matches a reference box (see the module's table for each output).

    Args:
        boxes: reference boxes ``(x1, y1, x2, y2)`` in the input's pixels: [4] for every
            image, [B, 4] one per image, or [B, N, 4]: N detections per image, scored as
            [B, N] (an explainer then gives N maps per image in one call).
        labels: the class of each reference (an int, B ints, or [B, N] with [B, N, 4] boxes);
            ``None``: any label (torchvision: any kept detection; ultralytics: the best
            candidate's best class; DETR: any query, with its best real class, whatever the
            "no object" probability, as Hugging Face's post-processing reports it).
        iou_threshold: the least IoU a match needs.
        num_classes: K of raw candidates, when neither the output nor the model says
            (ultralytics' outputs and models do).
        image_size: ``(H, W)`` of the input, to scale DETR's normalised boxes; inside an
            explainer it is read from the model's input.

    Limits: a torchvision detector's kept detections come from its post-processing
    (score threshold, NMS, top-k), which is not differentiable: the gradient is that of the
    kept detection's score. Raw candidates and DETR queries are scored before any
    post-processing. Boxes are matched as axis-aligned: rotated boxes (ultralytics' OBB
    models) are refused.

    Example:
        >>> import torch
        >>> from camkit import DetectionTarget
        >>> dets = [{"boxes": torch.tensor([[0.0, 0.0, 4.0, 4.0], [5.0, 5.0, 9.0, 9.0]]),
        ...          "scores": torch.tensor([0.9, 0.7]), "labels": torch.tensor([1, 2])}]
        >>> DetectionTarget(torch.tensor([5.0, 5.0, 9.0, 8.0]))(dets)
        tensor([0.7000])
        >>> candidates = torch.tensor([[[2.0, 7.0], [2.0, 7.0], [4.0, 4.0], [4.0, 4.0],  # cx, cy, w, h
        ...                             [0.9, 0.2], [0.1, 0.6]]])                        # K = 2 classes
        >>> DetectionTarget(torch.tensor([5.0, 5.0, 9.0, 9.0]), labels=1, num_classes=2)(candidates)
        tensor([0.6000])
    """

    takes_model_output: ClassVar[bool] = True

    def __init__(
        self,
        boxes: Tensor,
        labels: int | Sequence[int] | Tensor | None = None,
        *,
        iou_threshold: float = 0.5,
        num_classes: int | None = None,
        image_size: tuple[int, int] | None = None,
    ) -> None:
        if not isinstance(boxes, Tensor) or boxes.shape[-1:] != (4,) or boxes.dim() not in (1, 2, 3):
            got = list(boxes.shape) if isinstance(boxes, Tensor) else type(boxes).__name__
            raise InvalidTargetError(f"boxes must be a tensor [4], [B, 4] or [B, N, 4] (x1, y1, x2, y2), got {got}")
        if not boxes.is_floating_point():
            boxes = boxes.float()
        if bool(((boxes[..., 2:] - boxes[..., :2]) < 0).any()):
            raise InvalidTargetError(f"boxes must have x2 >= x1 and y2 >= y1 (x1, y1, x2, y2), got {boxes.tolist()}")
        if not 0.0 <= iou_threshold <= 1.0:
            raise InvalidTargetError(f"iou_threshold must be in [0, 1], got {iou_threshold}")
        self.boxes = boxes.detach()
        self.labels = labels
        self.iou_threshold = iou_threshold
        self.num_classes = num_classes
        self.image_size = image_size
        #: score 0 where no detection matches instead of raising (the rows of :meth:`for_rows`)
        self.absent_scores_zero = False
        self._local = threading.local()

    @classmethod
    def from_detections(cls, detections: Sequence[Mapping[str, Tensor]], **kwargs: Any) -> DetectionTarget:
        """A target for every detection of a result: boxes [B, N, 4] and labels [B, N], scored [B, N].

        Args:
            detections: one dict per image with ``"boxes"`` [N, 4] (x1, y1, x2, y2) and
                ``"labels"`` [N], as torchvision's detectors return (or
                :func:`camkit.explain.detect.detections_of` makes from other outputs);
                every image must have the same N (one image at a time otherwise).
            kwargs: passed to the constructor (``iou_threshold``...).

        Example:
            >>> import torch
            >>> from camkit import DetectionTarget
            >>> dets = [{"boxes": torch.tensor([[0.0, 0.0, 4.0, 4.0], [5.0, 5.0, 9.0, 9.0]]),
            ...          "scores": torch.tensor([0.9, 0.7]), "labels": torch.tensor([1, 2])}]
            >>> DetectionTarget.from_detections(dets)(dets)
            tensor([[0.9000, 0.7000]])
        """
        if not detections or not all(isinstance(d, Mapping) and {"boxes", "labels"} <= set(d) for d in detections):
            raise InvalidTargetError("from_detections needs one dict per image with 'boxes' [N, 4] and 'labels' [N]")
        counts = {int(d["boxes"].shape[0]) for d in detections}
        if len(counts) != 1 or 0 in counts:
            raise InvalidTargetError(
                f"from_detections needs the same number of detections (at least one) in every image, got "
                f"{[int(d['boxes'].shape[0]) for d in detections]}; explain the images one at a time, or keep "
                "the top N of each."
            )
        boxes = torch.stack([d["boxes"].detach().float() for d in detections])
        labels = torch.stack([d["labels"].detach().long() for d in detections])
        return cls(boxes, labels, **kwargs)

    def for_rows(self, index: Tensor) -> DetectionTarget:
        """The target for a batch of perturbed copies whose row ``i`` is image ``index[i]`` of the batch.

        Perturbation methods (Score-CAM, Ablation-CAM) score masked or ablated copies of the
        images: each row is matched again, by IoU to its image's reference box, on the model's
        new output (the detection may have moved or changed its score). A row where nothing
        matches any more scores 0 (the detection is gone) instead of raising. The copy shares
        this target's model binding.

        Args:
            index: [R] the image of each row (a LongTensor).

        Example:
            >>> import torch
            >>> from camkit import DetectionTarget
            >>> target = DetectionTarget(torch.tensor([[0.0, 0.0, 4.0, 4.0], [5.0, 5.0, 9.0, 9.0]]), labels=[1, 2])
            >>> dets = [{"boxes": torch.tensor([[5.0, 5.0, 9.0, 9.0]]), "scores": torch.tensor([0.7]),
            ...          "labels": torch.tensor([2])}] * 3
            >>> target.for_rows(torch.tensor([1, 1, 0]))(dets)  # rows of image 1 match; image 0's box is gone
            tensor([0.7000, 0.7000, 0.0000])
        """
        rows = copy.copy(self)  # shares the thread-local binding (model, input size)
        if self.boxes.dim() >= 2:
            rows.boxes = self.boxes.to(index.device)[index]
        if self.labels is not None:
            labels = torch.as_tensor(self.labels, device=index.device)
            if labels.dim() >= 1:
                rows.labels = labels[index]
        rows.absent_scores_zero = True
        return rows

    def picked(self) -> Tensor:
        """What the last call (in this thread) scored for each reference: [B, N] indices.

        On torchvision's detections, ``picked()[b, n]`` indexes image ``b``'s kept detections
        for reference ``n``; on raw candidates [B, 4 + K, A], it is the candidate (in ``[0, A)``).
        camkit uses it to rerun the box head for those detections' proposals alone, or a dense
        head's class branch at those candidates alone (:meth:`picked_labels` gives their class).

        Example:
            >>> import torch
            >>> from camkit import DetectionTarget
            >>> dets = [{"boxes": torch.tensor([[0.0, 0.0, 4.0, 4.0], [5.0, 5.0, 9.0, 9.0]]),
            ...          "scores": torch.tensor([0.9, 0.7]), "labels": torch.tensor([1, 2])}]
            >>> target = DetectionTarget(torch.tensor([5.0, 5.0, 9.0, 8.0]))
            >>> _ = target(dets)
            >>> target.picked()
            tensor([[1]])
        """
        picked = getattr(self._local, "picked", None)
        if picked is None:
            raise InvalidTargetError(
                "picked() reads the last call on torchvision's detections or raw candidates; none was made here"
            )
        return picked

    def picked_labels(self) -> Tensor:
        """The class each reference was scored for in the last call on raw candidates (this thread): [B, N].

        Example:
            >>> import torch
            >>> from camkit import DetectionTarget
            >>> candidates = torch.tensor([[[2.0, 7.0], [2.0, 7.0], [4.0, 4.0], [4.0, 4.0],  # cx, cy, w, h
            ...                             [0.9, 0.2], [0.1, 0.6]]])                        # K = 2 classes
            >>> target = DetectionTarget(torch.tensor([5.0, 5.0, 9.0, 9.0]), num_classes=2)
            >>> _ = target(candidates)
            >>> target.picked(), target.picked_labels()  # candidate 1, its best class 1
            (tensor([[1]]), tensor([[1]]))
        """
        labels = getattr(self._local, "picked_labels", None)
        if labels is None:
            raise InvalidTargetError("picked_labels() reads the last call on raw candidates; none was made here")
        return labels

    def __repr__(self) -> str:
        return f"DetectionTarget(boxes={list(self.boxes.shape)}, labels={self.labels!r}, iou_threshold={self.iou_threshold})"

    @contextmanager
    def bind_model(self, model: nn.Module) -> Iterator[DetectionTarget]:
        """Record the model and its input's spatial size during the forwards run inside the block."""
        local = self._local

        def record(module: nn.Module, args: Any, kwargs: Any) -> None:
            first = args[0] if args else kwargs.get("pixel_values", kwargs.get("x"))
            if isinstance(first, (list, tuple)) and first and isinstance(first[0], Tensor):
                first = first[0]  # torchvision detectors take a list of images
            if isinstance(first, Tensor) and first.dim() >= 3:
                local.size = tuple(int(s) for s in first.shape[-2:])

        previous = getattr(local, "model", None), getattr(local, "size", None)
        local.model = model
        try:
            with HookScope() as scope:
                scope.forward_pre(model, record, with_kwargs=True)
                yield self
        finally:
            local.model, local.size = previous

    # ------------------------------------------------------------------ scoring

    def _references(self, batch: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
        """References [B, N, 4] and wanted labels [B, N] (``None``: any)."""
        refs = self.boxes.to(device=device, dtype=dtype)
        if refs.dim() >= 2 and refs.shape[0] != batch:
            raise InvalidTargetError(f"boxes has {refs.shape[0]} rows but the batch has {batch} images")
        refs = refs.expand(batch, 4)[:, None] if refs.dim() == 1 else refs[:, None] if refs.dim() == 2 else refs
        if self.labels is None:
            return refs, None
        if self.boxes.dim() == 3:
            wanted = torch.as_tensor(self.labels, device=device).long()
            if wanted.shape != refs.shape[:2]:
                raise InvalidTargetError(f"labels must be [B, N] = {list(refs.shape[:2])} for [B, N, 4] boxes, got {list(wanted.shape)}")
        else:
            wanted = per_sample(self.labels, batch, device, "labels")[:, None]
        return refs, wanted

    def _shape(self, scores: Tensor) -> Tensor:
        return scores if self.boxes.dim() == 3 else scores[:, 0]

    def _matched(self, scores: Tensor, best_iou: Tensor, what: str) -> Tensor:
        """``scores`` [B, N] where a detection matches; unmatched: 0 (:meth:`for_rows`) or an error."""
        low = best_iou < self.iou_threshold
        if self.absent_scores_zero:
            return torch.where(low, torch.zeros_like(scores), scores)
        if bool(low.any()):  # one sync per batch
            images = sorted({int(i) for i in low.nonzero()[:, 0].tolist()})
            worst = [round(float(best_iou[i].min()), 3) for i in images]
            raise InvalidTargetError(
                f"no {what} matches the reference box in image(s) {images} (best IoU {worst} < "
                f"iou_threshold={self.iou_threshold}); lower iou_threshold or check the box and its label."
            )
        return scores

    def _check_labels(self, wanted: Tensor | None, classes: int) -> None:
        if wanted is not None and wanted.numel() and wanted.device.type == "cpu":
            low, high = int(wanted.min()), int(wanted.max())
            if low < 0 or high >= classes:
                raise InvalidTargetError(f"label {high if high >= classes else low} is out of range for {classes} classes")

    def _check_inside(self) -> None:
        """Refuse reference boxes that do not overlap the input image (when its size is known).

    A box that only crosses the border is kept: detectors' own boxes do (ultralytics' candidates).
    """
        size = self.image_size or getattr(self._local, "size", None)
        if size is None or self.boxes.device.type != "cpu":
            return
        height, width = size
        boxes = self.boxes.reshape(-1, 4)
        outside = (boxes[:, 2] <= 0) | (boxes[:, 3] <= 0) | (boxes[:, 0] >= width) | (boxes[:, 1] >= height)
        if bool(outside.any()):
            raise InvalidTargetError(
                f"reference box {boxes[outside][0].tolist()} lies outside the {height}x{width} input image; boxes "
                "are (x1, y1, x2, y2) in the pixels of the image given to the explainer."
            )

    def __call__(self, output: Any) -> Tensor:
        model = getattr(self._local, "model", None)
        self._check_inside()
        if isinstance(output, (list, tuple)) and output and all(
            isinstance(d, Mapping) and {"boxes", "scores"} <= set(d) for d in output
        ):
            return self._torchvision(output, model)
        candidates = candidates_of(output)
        if candidates is not None:
            return self._candidates(candidates, output, model)
        if _is_detr(output):
            return self._detr(output)
        raise OutputSelectionError(
            f"DetectionTarget needs torchvision's list of per-image dicts with 'boxes' and 'scores', raw candidates "
            f"[B, 4 + K, A] (ultralytics) or logits and pred_boxes (DETR), got {type(output).__name__}; do not pass "
            "output= for detection models."
        )

    def _torchvision(self, output: Sequence[Mapping[str, Tensor]], model: nn.Module | None) -> Tensor:
        batch = len(output)
        device = output[0]["scores"].device
        refs, wanted = self._references(batch, device, output[0]["boxes"].dtype)
        classes = _torchvision_classes(model)
        if classes is not None:
            self._check_labels(wanted, classes)
        empty = [b for b, det in enumerate(output) if det["scores"].shape[0] == 0]
        if empty and not self.absent_scores_zero:
            raise InvalidTargetError(
                f"the detector kept no detection in image(s) {empty}: lower {_threshold_hint(model)} so that its "
                "post-processing keeps the object you want to explain."
            )
        scores, best, picks = [], [], []
        for b, det in enumerate(output):
            if det["scores"].shape[0] == 0:  # nothing kept: the detection is gone (for_rows)
                best.append(refs.new_full(refs.shape[1:2], -1.0))
                picks.append(torch.zeros(refs.shape[1], dtype=torch.long, device=device))
                scores.append(det["scores"].new_zeros(refs.shape[1]))
                continue
            iou = box_iou(det["boxes"].detach(), refs[b])  # [N_refs, D]
            if wanted is not None:
                iou = torch.where(det["labels"][None] == wanted[b][:, None], iou, torch.full_like(iou, -1.0))
            j = iou.argmax(dim=1)
            picks.append(j)
            best.append(iou.gather(1, j[:, None])[:, 0])
            scores.append(det["scores"][j])
        self._local.picked, self._local.picked_labels = torch.stack(picks), None
        return self._shape(self._matched(torch.stack(scores), torch.stack(best), "kept detection (of that label)"))

    def _candidates(self, candidates: Tensor, output: Any, model: nn.Module | None) -> Tensor:
        if model is not None and type(model).__name__ == "OBBModel":
            raise InvalidTargetError(
                "DetectionTarget matches axis-aligned boxes; an OBB model's candidates are rotated boxes. Pass a "
                "callable target reading the candidate you want."
            )
        classes = self.num_classes or _class_count(output, model)
        if classes is None:
            raise InvalidTargetError(
                f"raw candidates {list(candidates.shape)} hold 4 box values, K class scores and maybe extras: pass "
                "num_classes=K to DetectionTarget."
            )
        if candidates.shape[1] < 4 + classes:
            raise InvalidTargetError(f"raw candidates {list(candidates.shape)} cannot hold 4 box values and {classes} classes")
        batch = candidates.shape[0]
        refs, wanted = self._references(batch, candidates.device, candidates.dtype)
        self._check_labels(wanted, classes)
        boxes = cxcywh_to_xyxy(candidates[:, :4].detach().transpose(1, 2))  # [B, A, 4]
        probs = candidates[:, 4 : 4 + classes]  # [B, K, A], attached
        iou = box_iou(boxes[:, None], refs)  # [B, N, A]
        if wanted is None:
            per_candidate = probs.detach().amax(dim=1)[:, None].expand_as(iou)  # each candidate's best class
        else:
            per_candidate = probs.detach().gather(1, wanted[:, :, None].expand(-1, -1, probs.shape[2]))  # [B, N, A]
        best = iou.amax(dim=2, keepdim=True)
        j = torch.where(iou == best, per_candidate, torch.full_like(per_candidate, -1.0)).argmax(dim=2)  # [B, N]
        picked = probs.gather(2, j[:, None, :].expand(-1, classes, -1))  # [B, K, N]
        label = picked.detach().argmax(dim=1) if wanted is None else wanted
        self._local.picked, self._local.picked_labels = j, label
        return self._shape(self._matched(picked.gather(1, label[:, None])[:, 0], best[..., 0], "candidate"))

    def _detr(self, output: Any) -> Tensor:
        get = output.get if isinstance(output, Mapping) else lambda key: getattr(output, key)
        logits, pred = cast(Tensor, get("logits")), cast(Tensor, get("pred_boxes"))
        size = self.image_size or getattr(self._local, "size", None)
        if size is None:
            raise InvalidTargetError(
                "DETR's pred_boxes are normalised to the image: pass image_size=(H, W) to DetectionTarget when "
                "calling it outside an explainer."
            )
        height, width = size
        batch, _, classes = logits.shape[0], logits.shape[1], logits.shape[2] - 1
        refs, wanted = self._references(batch, logits.device, pred.dtype)
        self._check_labels(wanted, classes)
        scale = pred.new_tensor([width, height, width, height])
        boxes = cxcywh_to_xyxy(pred.detach() * scale)  # [B, Q, 4]
        probs = logits.softmax(dim=-1)  # [B, Q, K + 1], attached
        # Each query's best real class, whatever the "no object" probability (as Hugging Face's
        # post_process_object_detection labels it): every detection it returns has a query here.
        predicted = probs.detach()[..., :classes].argmax(dim=-1)  # [B, Q]
        iou = box_iou(boxes[:, None], refs)  # [B, N, Q]
        if wanted is None:
            allowed = torch.ones_like(iou, dtype=torch.bool)
            label = predicted[:, None].expand_as(iou)
        else:
            allowed = predicted[:, None] == wanted[:, :, None]
            label = wanted[:, :, None].expand_as(iou)
        iou = torch.where(allowed, iou, torch.full_like(iou, -1.0))
        j = iou.argmax(dim=2)  # [B, N]
        chosen = label.gather(2, j[..., None])[..., 0]  # [B, N]
        self._local.picked, self._local.picked_labels = j, chosen
        query = probs.gather(1, j[..., None].expand(-1, -1, probs.shape[2]))  # [B, N, K + 1]
        score = query.gather(2, chosen[..., None])[..., 0]
        return self._shape(self._matched(score, iou.gather(2, j[..., None])[..., 0], "query whose best real class is that label"))
