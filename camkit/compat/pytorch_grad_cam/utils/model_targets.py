"""pytorch-grad-cam's targets: callables that score one image's model output.

Each takes the output of one image (a row [num_classes], a segmentation map [K, H, W], or a
detector's dict) and returns what is differentiated. The CAM classes translate a list of them,
one per image, into one camkit target (class targets into class indices).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor

__all__ = [
    "BinaryClassifierOutputTarget",
    "ClassifierOutputReST",
    "ClassifierOutputSoftmaxTarget",
    "ClassifierOutputTarget",
    "FasterRCNNBoxScoreTarget",
    "FinerWeightedTarget",
    "RawScoresOutputTarget",
    "SemanticSegmentationTarget",
    "SoftmaxOutputTarget",
]


def _pick(output: Tensor, index: int) -> Tensor:
    return output[index] if output.dim() == 1 else output[:, index]


class ClassifierOutputTarget:
    """The logit of ``category``.

    Example:
        >>> import torch
        >>> from camkit.compat.pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
        >>> ClassifierOutputTarget(1)(torch.tensor([0.5, 2.0])).item()
        2.0
    """

    def __init__(self, category: int) -> None:
        self.category = category

    def __call__(self, model_output: Tensor) -> Tensor:
        return _pick(model_output, self.category)


class ClassifierOutputSoftmaxTarget(ClassifierOutputTarget):
    """The softmax probability of ``category``."""

    def __call__(self, model_output: Tensor) -> Tensor:
        return _pick(torch.softmax(model_output, dim=-1), self.category)


class ClassifierOutputReST(ClassifierOutputTarget):
    """The logit of ``category`` minus its cross-entropy loss (pre- and post-softmax together)."""

    def __call__(self, model_output: Tensor) -> Tensor:
        rows = model_output.unsqueeze(0) if model_output.dim() == 1 else model_output
        labels = torch.full((rows.shape[0],), self.category, device=rows.device, dtype=torch.long)
        score = rows[:, self.category] - F.cross_entropy(rows, labels, reduction="none")
        return score[0] if model_output.dim() == 1 else score


class BinaryClassifierOutputTarget:
    """A single-logit binary classifier's output, negated for ``category`` 0."""

    def __init__(self, category: int) -> None:
        self.category = category

    def __call__(self, model_output: Tensor) -> Tensor:
        return model_output if self.category == 1 else -model_output


class SoftmaxOutputTarget:
    """All softmax probabilities (their sum is differentiated)."""

    def __call__(self, model_output: Tensor) -> Tensor:
        return torch.softmax(model_output, dim=-1)


class RawScoresOutputTarget:
    """All raw outputs (their sum is differentiated)."""

    def __call__(self, model_output: Tensor) -> Tensor:
        return model_output


class SemanticSegmentationTarget:
    """The sum of class ``category``'s scores [K, H, W] over the pixels of ``mask`` [H, W]."""

    def __init__(self, category: int, mask: np.ndarray | Tensor) -> None:
        self.category = category
        self.mask = torch.as_tensor(mask)

    def __call__(self, model_output: Tensor) -> Tensor:
        return (model_output[self.category] * self.mask.to(model_output.device)).sum()


class FasterRCNNBoxScoreTarget:
    """For each reference box, IoU plus score of the best-overlapping detection of the same label.

    A detection counts when its IoU exceeds ``iou_threshold``; the result [1] is on the
    detections' device and dtype (0 when there are none).

    Example:
        >>> import torch
        >>> from camkit.compat.pytorch_grad_cam.utils.model_targets import FasterRCNNBoxScoreTarget
        >>> out = {"boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0]]), "labels": torch.tensor([1]),
        ...        "scores": torch.tensor([0.5])}
        >>> FasterRCNNBoxScoreTarget([1], [[0.0, 0.0, 10.0, 10.0]])(out).tolist()
        [1.5]
    """

    def __init__(self, labels: Sequence[int], bounding_boxes: Sequence[Any], iou_threshold: float = 0.5) -> None:
        self.labels = labels
        self.bounding_boxes = bounding_boxes
        self.iou_threshold = iou_threshold

    def __call__(self, model_outputs: dict[str, Tensor]) -> Tensor:
        boxes = model_outputs["boxes"]
        total = torch.zeros(1, device=boxes.device, dtype=boxes.dtype)
        if len(boxes) == 0:
            return total
        for box, label in zip(self.bounding_boxes, self.labels):
            reference = torch.as_tensor(np.asarray(box), device=boxes.device, dtype=boxes.dtype).reshape(1, 4)
            ious = torchvision.ops.box_iou(reference, boxes)[0]
            best = ious.argmax()
            match = (ious[best] > self.iou_threshold) & (model_outputs["labels"][best] == label)
            total = total + torch.where(match, ious[best] + model_outputs["scores"][best], total.new_zeros(()))
        return total


class FinerWeightedTarget:
    """Finer-CAM's target: ``sum_j p_j (y_main - alpha y_j) / sum_j p_j`` over the comparison classes ``j``.

    ``p`` is the softmax of the output. The original adds 1e-9 to the denominator, which turns
    the target into zero when every ``p_j`` underflows; here the ratio is computed as a softmax
    over the comparison classes' logits, which is the same number where it is defined.
    """

    def __init__(self, main_category: int, comparison_categories: Sequence[int], alpha: float) -> None:
        self.main_category = main_category
        self.comparison_categories = list(comparison_categories)
        self.alpha = alpha

    def __call__(self, model_output: Tensor) -> Tensor:
        rivals = torch.stack([_pick(model_output, j) for j in self.comparison_categories], dim=-1)
        weights = torch.softmax(rivals, dim=-1)
        main = _pick(model_output, self.main_category).unsqueeze(-1)
        return (weights * (main - self.alpha * rivals)).sum(dim=-1)
