"""Targets beyond class logits: segmentation, similarity, regression, binary and detection scores.

Each helper is a small callable object ``target(output) -> Tensor[B]`` to pass as
``target=`` to any explainer. They compute batched scores on the output's device, keep the
autograd graph, and check shapes with errors that say what was expected.

==========================  ===============================================================
helper                      score of sample ``b``
==========================  ===============================================================
:class:`SegmentationTarget`  ``sum_hw mask[b] * logits[b, class]`` (over every spatial axis of
                             [B, K, T], [B, K, H, W] or [B, K, D, H, W]); the mask defaults to
                             the pixels predicted as that class (``argmax == class``)
:class:`SimilarityTarget`    ``cos(embedding[b], reference[b])``
:class:`RegressionTarget`    ``output[b, index]`` (``-output[b, index]`` with ``negate``)
:class:`BinaryTarget`        ``z[b]`` for the positive class, ``-z[b]`` for the negative one
:class:`DetectionTarget`     the score of the detection best matching a reference box (IoU)
==========================  ===============================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InvalidTargetError, OutputSelectionError

__all__ = ["BinaryTarget", "DetectionTarget", "RegressionTarget", "SegmentationTarget", "SimilarityTarget"]

#: Segmentation logits by their number of dimensions, and the spatial axes of their masks.
_LOGITS = {3: "[B, K, T]", 4: "[B, K, H, W]", 5: "[B, K, D, H, W]"}
_MASK_AXES = {1: "T", 2: "H, W", 3: "D, H, W"}
_KINDS = {1: "a signal", 2: "an image", 3: "a volume or video"}


def _tensor(output: Any, what: str) -> Tensor:
    if not isinstance(output, Tensor):
        raise OutputSelectionError(
            f"{what} needs a tensor output, got {type(output).__name__}; pass output= to the explainer "
            "to select it (a dict key, tuple index, attribute name or callable)."
        )
    return output


def _per_sample(value: int | Sequence[int] | Tensor, batch: int, device: torch.device, name: str) -> Tensor:
    index = torch.as_tensor(value, device=device)
    if index.is_floating_point() or index.dtype == torch.bool:
        raise InvalidTargetError(f"{name} must be integers, got dtype {index.dtype}")
    if index.dim() == 0:
        return index.long().expand(batch)
    if index.dim() != 1 or index.shape[0] != batch:
        raise InvalidTargetError(f"{name} must be one int or {batch} ints (one per sample), got shape {list(index.shape)}")
    return index.long()


class SegmentationTarget:
    """A class's logits summed over a mask: explain a segmentation.

    Args:
        category: the class index, one for all samples or one per sample.
        mask: one mask for all samples or one per sample, of the output's rank and size
            (bool or float weights): [T] or [B, T] for a signal's logits [B, K, T], [H, W]
            or [B, H, W] for an image's [B, K, H, W], [D, H, W] or [B, D, H, W] for a
            volume's or video's [B, K, D, H, W]. A mask of another rank (an image's
            [H, W] for a volume) raises :class:`~camkit.errors.InvalidTargetError`.
            ``None`` uses the positions each sample predicts as ``category`` (a sample
            with no such position scores 0 and gets a flat map).

    Accepts the output [B, K, *S], or a dict holding it under ``"out"`` as torchvision's
    FCN / DeepLabV3 return (MONAI's UNet and SegResNet return the tensor itself).

    Example:
        >>> import torch
        >>> from camkit import SegmentationTarget
        >>> logits = torch.tensor([[[[1.0, 3.0]], [[2.0, 0.0]]]])  # B=1, K=2, H=1, W=2
        >>> SegmentationTarget(1)(logits)                           # class 1 wins pixel 0 only
        tensor([2.])
        >>> SegmentationTarget(0, mask=torch.tensor([[1.0, 1.0]]))({"out": logits})
        tensor([4.])
        >>> volume = torch.zeros(1, 2, 2, 2, 2); volume[:, 1, 0] = 1.0  # class 1 wins the first slice
        >>> SegmentationTarget(1)(volume), SegmentationTarget(1, mask=torch.ones(2, 2, 2))(volume)
        (tensor([4.]), tensor([4.]))
    """

    takes_model_output: ClassVar[bool] = True

    def __init__(self, category: int | Sequence[int] | Tensor, mask: Tensor | None = None) -> None:
        self.category = category
        self.mask = mask

    def __repr__(self) -> str:
        return f"SegmentationTarget(category={self.category!r}, mask={'given' if self.mask is not None else 'predicted'})"

    def __call__(self, output: Any) -> Tensor:
        if isinstance(output, Mapping) and "out" in output:
            output = output["out"]
        logits = _tensor(output, "SegmentationTarget")
        if logits.dim() not in _LOGITS:
            raise InvalidTargetError(
                f"SegmentationTarget needs logits [B, K, *S]: [B, K, T], [B, K, H, W] or [B, K, D, H, W], "
                f"got shape {list(logits.shape)}"
            )
        batch, classes, *spatial = logits.shape
        n = len(spatial)
        category = _per_sample(self.category, batch, logits.device, "category")
        if category.device.type == "cpu" and category.numel() and not 0 <= int(category.min()) <= int(category.max()) < classes:
            raise InvalidTargetError(f"category {self.category} is out of range for {classes} classes")
        picked = logits.gather(1, category.view(batch, 1, *(1,) * n).expand(batch, 1, *spatial))[:, 0]
        if self.mask is None:
            weight = (logits.detach().argmax(dim=1) == category.view(batch, *(1,) * n)).to(picked.dtype)
        else:
            weight = self._weight(batch, spatial, logits.device).to(picked.dtype)
        return (picked * weight).sum(dim=tuple(range(-n, 0)))

    def _weight(self, batch: int, spatial: list[int], device: torch.device) -> Tensor:
        """The given mask, checked against the output's batch, rank and spatial size."""
        mask, n = self.mask, len(spatial)
        if not isinstance(mask, Tensor) or not (
            mask.dim() in (n, n + 1)
            and tuple(mask.shape[mask.dim() - n :]) == tuple(spatial)
            and (mask.dim() == n or mask.shape[0] == batch)
        ):
            got = f"shape {list(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
            axes = _MASK_AXES[n]
            raise InvalidTargetError(
                f"mask must be [{axes}] or [B, {axes}] = {[batch, *spatial]} (the output's size: logits "
                f"{_LOGITS[n + 2]} of {_KINDS[n]}), got {got}"
            )
        return mask.to(device=device)


class SimilarityTarget:
    """Cosine similarity of each embedding to a reference embedding.

    Args:
        reference: [D] (one reference for all samples) or [B, D]. Outputs [B, D, ...] are
            flattened to [B, D * ...] first, and the reference must match that size.

    Example:
        >>> import torch
        >>> from camkit import SimilarityTarget
        >>> SimilarityTarget(torch.tensor([1.0, 0.0]))(torch.tensor([[3.0, 4.0], [0.0, 2.0]]))
        tensor([0.6000, 0.0000])
    """

    def __init__(self, reference: Tensor) -> None:
        if not isinstance(reference, Tensor) or reference.dim() not in (1, 2):
            got = list(reference.shape) if isinstance(reference, Tensor) else type(reference).__name__
            raise InvalidTargetError(f"reference must be a tensor [D] or [B, D], got {got}")
        self.reference = reference.detach()

    def __repr__(self) -> str:
        return f"SimilarityTarget(reference={list(self.reference.shape)})"

    def __call__(self, output: Any) -> Tensor:
        embedding = _tensor(output, "SimilarityTarget").flatten(1)
        reference = self.reference.to(device=embedding.device, dtype=embedding.dtype)
        if reference.shape[-1] != embedding.shape[1] or (reference.dim() == 2 and reference.shape[0] != embedding.shape[0]):
            raise InvalidTargetError(
                f"reference has shape {list(reference.shape)} but the embeddings are {list(embedding.shape)}; "
                "give [D] or [B, D] with the same D."
            )
        return F.cosine_similarity(embedding, reference.expand_as(embedding), dim=1)


class RegressionTarget:
    """One unit of a regression output (or its negative: what lowers the prediction).

    Args:
        index: the unit: an int for [B, U] outputs, a tuple for [B, ...] outputs, ``None``
            for a [B] or [B, 1] output.
        negate: score ``-output`` instead, to see what pushes the value down.

    Example:
        >>> import torch
        >>> from camkit import RegressionTarget
        >>> out = torch.tensor([[0.5, 2.0], [1.5, -1.0]])
        >>> RegressionTarget(1)(out), RegressionTarget(0, negate=True)(out)
        (tensor([ 2., -1.]), tensor([-0.5000, -1.5000]))
    """

    def __init__(self, index: int | tuple[int, ...] | None = None, *, negate: bool = False) -> None:
        self.index = index
        self.negate = negate

    def __repr__(self) -> str:
        return f"RegressionTarget(index={self.index!r}, negate={self.negate})"

    def __call__(self, output: Any) -> Tensor:
        values = _tensor(output, "RegressionTarget")
        if self.index is None:
            if values.dim() == 2 and values.shape[1] == 1:
                values = values[:, 0]
            if values.dim() != 1:
                raise InvalidTargetError(
                    f"RegressionTarget() without index needs a [B] or [B, 1] output, got {list(values.shape)}; "
                    "pass index= the unit to explain."
                )
            picked = values
        else:
            index = (self.index,) if isinstance(self.index, int) else tuple(self.index)
            if values.dim() != 1 + len(index):
                raise InvalidTargetError(
                    f"index {self.index!r} needs an output with {1 + len(index)} dimensions, got {list(values.shape)}"
                )
            for i, size in zip(index, values.shape[1:]):
                if not -size <= i < size:
                    raise InvalidTargetError(f"index {self.index!r} is out of range for output {list(values.shape)}")
            key: tuple[slice | int, ...] = (slice(None), *index)
            picked = values[key]
        return -picked if self.negate else picked


class BinaryTarget:
    """A binary classifier with a single logit ``z``: ``z`` for the positive class, ``-z`` for the negative.

    ``-z`` is the negative class's log-odds, ``log(p(neg) / p(pos))`` with ``p(pos) = sigmoid(z)``.

    Args:
        positive: explain the positive class (True) or the negative class (False).

    Example:
        >>> import torch
        >>> from camkit import BinaryTarget
        >>> BinaryTarget()(torch.tensor([[2.0], [-1.0]])), BinaryTarget(positive=False)(torch.tensor([2.0, -1.0]))
        (tensor([ 2., -1.]), tensor([-2.,  1.]))
    """

    def __init__(self, positive: bool = True) -> None:
        self.positive = positive

    def __repr__(self) -> str:
        return f"BinaryTarget(positive={self.positive})"

    def __call__(self, output: Any) -> Tensor:
        logit = _tensor(output, "BinaryTarget")
        if logit.dim() == 2 and logit.shape[1] == 1:
            logit = logit[:, 0]
        if logit.dim() != 1:
            raise InvalidTargetError(
                f"BinaryTarget needs a single logit per sample ([B] or [B, 1]), got {list(logit.shape)}; "
                "for two or more logits use a class index as target."
            )
        return logit if self.positive else -logit


def box_iou(boxes: Tensor, reference: Tensor) -> Tensor:
    """IoU of boxes [N, 4] with one reference box [4], all ``(x1, y1, x2, y2)``: [N].

    Example:
        >>> import torch
        >>> from camkit.targets.tasks import box_iou
        >>> box_iou(torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0]]), torch.tensor([0.0, 0.0, 2.0, 2.0]))
        tensor([1.0000, 0.3333])
    """
    lt = torch.maximum(boxes[:, :2], reference[:2])
    rb = torch.minimum(boxes[:, 2:], reference[2:])
    inter = (rb - lt).clamp_min(0).prod(dim=1)
    area = (boxes[:, 2:] - boxes[:, :2]).clamp_min(0).prod(dim=1)
    ref_area = (reference[2:] - reference[:2]).clamp_min(0).prod()
    union = area + ref_area - inter
    return torch.where(union > 0, inter / torch.where(union > 0, union, torch.ones_like(union)), torch.zeros_like(union))


class DetectionTarget:
    """The score of the detection that best matches a reference box, for torchvision-style detectors.

    The output is a list with one dict per image holding ``"boxes"`` [N, 4] (x1, y1, x2,
    y2), ``"scores"`` [N] and ``"labels"`` [N], as torchvision's Faster R-CNN returns in eval
    mode. For each image the detection with the highest IoU to the reference box (among
    those with the given label, if any) is chosen, and its score is explained.

    Args:
        boxes: the reference box [4], or one per image [B, 4], in input pixel coordinates.
        labels: keep only detections of this label (an int or one per image); ``None``: any.
        iou_threshold: the least IoU a match needs. An image without a match raises
            :class:`InvalidTargetError` (never a silent zero map).

    Limits: the detections are chosen by the model's own post-processing (score threshold,
    NMS, top-k), which is not differentiable; the gradient is that of the kept detection's
    score, through the box head and RoI pooling to the backbone. Lower the model's
    ``box_score_thresh`` if the object you want is filtered out. Maps cover the image the
    backbone saw: use inputs whose size the detector's transform keeps (no resize, sides
    multiple of its ``size_divisible``), else the map includes its padding.

    Example:
        >>> import torch
        >>> from camkit import DetectionTarget
        >>> dets = [{"boxes": torch.tensor([[0.0, 0.0, 4.0, 4.0], [5.0, 5.0, 9.0, 9.0]]),
        ...          "scores": torch.tensor([0.9, 0.7]), "labels": torch.tensor([1, 2])}]
        >>> DetectionTarget(torch.tensor([5.0, 5.0, 9.0, 8.0]))(dets)
        tensor([0.7000])
    """

    takes_model_output: ClassVar[bool] = True

    def __init__(
        self,
        boxes: Tensor,
        labels: int | Sequence[int] | Tensor | None = None,
        *,
        iou_threshold: float = 0.5,
    ) -> None:
        if not isinstance(boxes, Tensor) or boxes.shape[-1:] != (4,) or boxes.dim() not in (1, 2):
            got = list(boxes.shape) if isinstance(boxes, Tensor) else type(boxes).__name__
            raise InvalidTargetError(f"boxes must be a tensor [4] or [B, 4] (x1, y1, x2, y2), got {got}")
        if not 0.0 <= iou_threshold <= 1.0:
            raise InvalidTargetError(f"iou_threshold must be in [0, 1], got {iou_threshold}")
        self.boxes = boxes.detach()
        self.labels = labels
        self.iou_threshold = iou_threshold

    def __repr__(self) -> str:
        return f"DetectionTarget(boxes={list(self.boxes.shape)}, labels={self.labels!r}, iou_threshold={self.iou_threshold})"

    def __call__(self, output: Any) -> Tensor:
        if not isinstance(output, (list, tuple)) or not all(
            isinstance(d, Mapping) and {"boxes", "scores"} <= set(d) for d in output
        ):
            raise OutputSelectionError(
                f"DetectionTarget needs a list of per-image dicts with 'boxes' and 'scores', got "
                f"{type(output).__name__}; do not pass output= for detection models."
            )
        batch = len(output)
        if batch == 0:
            raise InvalidTargetError("the detector returned an empty list")
        device = output[0]["scores"].device
        refs = self.boxes.to(device=device, dtype=output[0]["boxes"].dtype)
        if refs.dim() == 2 and refs.shape[0] != batch:
            raise InvalidTargetError(f"boxes has {refs.shape[0]} rows but the batch has {batch} images")
        refs = refs.expand(batch, 4) if refs.dim() == 1 else refs
        wanted = None if self.labels is None else _per_sample(self.labels, batch, device, "labels")
        scores, best = [], []
        for b, det in enumerate(output):
            iou = box_iou(det["boxes"].detach(), refs[b])
            if wanted is not None:
                iou = torch.where(det["labels"] == wanted[b], iou, torch.full_like(iou, -1.0))
            iou = torch.cat([iou, iou.new_full((1,), -1.0)])  # a sentinel: no detection at all
            j = iou.argmax()
            best.append(iou[j])
            padded = torch.cat([det["scores"], det["scores"].new_zeros(1)])
            scores.append(padded[j])
        best_iou = torch.stack(best)
        if bool((best_iou < self.iou_threshold).any()):  # one sync per batch
            missing = (best_iou < self.iou_threshold).nonzero().flatten().tolist()
            raise InvalidTargetError(
                f"no detection matches the reference box in image(s) {missing} (best IoU "
                f"{[round(float(best_iou[i]), 3) for i in missing]} < iou_threshold={self.iou_threshold}); "
                "lower iou_threshold, check labels, or lower the detector's box_score_thresh."
            )
        return torch.stack(scores)
