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
from torch.nn.utils.rnn import pad_sequence

from .._internal.checks import per_sample
from .._internal.syncs import to_device
from ..errors import InvalidTargetError, OutputSelectionError
from ..hooks import HookScope
from .outputs import (
    _class_count,
    _is_detr,
    _torchvision_classes,
    box_iou,
    candidates_of,
    cxcywh_to_xyxy,
    threshold_hint,
)

__all__ = ["DetectionTarget"]


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
                :func:`camkit.detection.detections_of` makes from other outputs);
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
                f"the detector kept no detection in image(s) {empty}: lower {threshold_hint(model)} so that its "
                "post-processing keeps the object you want to explain."
            )
        # Every image's detections padded to the longest list (the lengths are known on the host): one IoU
        # table [B, N, D] and one argmax for the batch; padded rows are never picked.
        counts = [int(det["scores"].shape[0]) for det in output]
        if max(counts) == 0:  # nothing kept anywhere
            best = refs.new_full(refs.shape[:2], -1.0)
            picks = torch.zeros(refs.shape[:2], dtype=torch.long, device=device)
            self._local.picked, self._local.picked_labels = picks, None
            scores = torch.stack([det["scores"].new_zeros(refs.shape[1]) for det in output])
            return self._shape(self._matched(scores, best, "kept detection (of that label)"))
        boxes = pad_sequence([det["boxes"].detach() for det in output], batch_first=True)  # [B, D, 4]
        kept = pad_sequence([det["scores"] for det in output], batch_first=True)  # [B, D], attached
        real = torch.arange(boxes.shape[1], device=device) < to_device(torch.tensor(counts), device)[:, None]
        allowed = real[:, None]
        if wanted is not None:
            labels = pad_sequence([det["labels"].detach() for det in output], batch_first=True)
            allowed = allowed & (labels[:, None] == wanted[:, :, None])
        iou = torch.where(allowed, box_iou(boxes[:, None], refs), -1.0)  # [B, N, D]
        j = iou.argmax(dim=2)  # [B, N]: the first best, as image by image
        self._local.picked, self._local.picked_labels = j, None
        scores = kept.gather(1, j)
        return self._shape(self._matched(scores, iou.gather(2, j[..., None])[..., 0], "kept detection (of that label)"))

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
