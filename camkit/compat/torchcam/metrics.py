"""torchcam 0.5.0's ``torchcam.metrics.ClassificationMetric`` on :func:`camkit.metrics.average_drop` and
:func:`camkit.metrics.increase_in_confidence`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._internal.state import eval_mode
from ...metrics import average_drop, increase_in_confidence
from .methods.core import _CAM, OutputTarget, _batch_target, _resolve_targets
from .methods.gradient import CompatNotTranslatedError

__all__ = ["ClassificationMetric", "DeletionInsertionMetric"]


def _resolve_class_idx(scores: Tensor, class_idx: int | list[int] | None) -> tuple[int | list[int], Tensor]:
    batch_size, num_classes = scores.shape
    if class_idx is None:
        top = scores.argmax(dim=-1)
        return top.tolist(), top
    if isinstance(class_idx, int):
        if class_idx < 0 or class_idx >= num_classes:
            raise ValueError("class_idx is out of range")
        return class_idx, torch.full((batch_size,), class_idx, device=scores.device, dtype=torch.long)
    if not isinstance(class_idx, list) or any(not isinstance(i, int) or isinstance(i, bool) for i in class_idx):
        raise TypeError("class_idx must be an integer, a list of integers, or None")
    if len(class_idx) != batch_size:
        raise ValueError("per-sample class_idx must match the batch size")
    if any(i < 0 or i >= num_classes for i in class_idx):
        raise ValueError("class_idx is out of range")
    return class_idx, torch.tensor(class_idx, device=scores.device)


class ClassificationMetric:
    """Average Drop and Increase in Confidence (Chattopadhay et al. 2018) of an extractor's maps.

    Each ``update`` explains the batch (the maps of the extractor's layers fused and resized to
    the input), then scores the input masked by its map with camkit's metrics; ``summary``
    returns ``{"avg_drop": ..., "conf_increase": ...}`` over every image seen. Maps holding NaN
    are left out and counted in ``nan_count``.

    Args:
        cam_extractor: a ``torchcam.methods`` extractor
        logits_fn: applied to the model's output before scoring (``partial(torch.softmax, dim=-1)``)
    """

    def __init__(self, cam_extractor: _CAM, logits_fn: Callable[[Any], Any] | None = None) -> None:
        self.cam_extractor = cam_extractor
        self.logits_fn = logits_fn
        self.reset()

    def _scores(self, x: Tensor) -> Any:
        logits = self.cam_extractor.model(x)
        return logits if self.logits_fn is None else self.logits_fn(logits)

    def update(
        self,
        input_tensor: Tensor,
        class_idx: int | list[int] | None = None,
        *,
        targets: OutputTarget | list[OutputTarget] | None = None,
    ) -> None:
        """Add a batch: explain it, then measure the confidence its maps keep.

        Raises:
            ValueError: if both class indices and output targets are provided
        """
        if targets is not None and class_idx is not None:
            raise ValueError("provide either class_idx or targets, not both")
        extractor = self.cam_extractor
        model = extractor.model
        with eval_mode(model):
            scores = self._scores(input_tensor)
            if targets is not None:
                fns = _resolve_targets(targets, input_tensor.shape[0])
                cams = extractor(scores=scores, targets=fns)
                metric_target: Any = _batch_target(fns)
            else:
                extractor_idx, metric_target = _resolve_class_idx(scores, class_idx)
                cams = extractor(extractor_idx, scores)
            cam = extractor.fuse_cams(cams)
        discard = torch.isnan(cam).reshape(input_tensor.shape[0], -1).any(dim=-1)
        keep = ~discard
        self.nan_count += int(discard.sum())
        if not bool(keep.any()):
            return
        size = tuple(input_tensor.shape[2:])
        mode = {1: "linear", 2: "bilinear", 3: "trilinear"}.get(len(size))
        if mode is None:
            raise ValueError("only 1D, 2D, and 3D spatial inputs are supported")
        maps = F.interpolate(cam[keep].unsqueeze(1), size, mode=mode, align_corners=False).squeeze(1)
        x = input_tensor[keep].detach()
        if isinstance(metric_target, Tensor):
            metric_target = metric_target[keep]
        elif not bool(keep.all()):
            kept = [fn for fn, k in zip(_resolve_targets(targets, len(keep)), keep.tolist()) if k]  # type: ignore[arg-type]
            metric_target = _batch_target(kept)
        options: dict[str, Any] = {"softmax": False, "output": self.logits_fn}
        with extractor._hooks_off():
            drop = average_drop(model, x, maps, metric_target, **options)
            increase = increase_in_confidence(model, x, maps, metric_target, **options)
        self.drop += float(drop.sum())
        self.increase += float(increase.sum())
        self.total += int(maps.shape[0])

    def summary(self) -> dict[str, float]:
        """The average drop and the increase in confidence over the images seen.

        Raises:
            AssertionError: if the metric has not been updated
        """
        if self.total == 0:
            raise AssertionError("you need to update the metric before getting the summary")
        return {"avg_drop": self.drop / self.total, "conf_increase": self.increase / self.total}

    def reset(self) -> None:
        """Reset the state of the metric."""
        self.drop = 0.0
        self.increase = 0.0
        self.total = 0
        self.nan_count = 0


class DeletionInsertionMetric:
    """Not translated: torchcam 0.5.0's deletion/insertion metric has no counterpart here yet.

    Its perturbation grid (``ceil(N / steps)`` positions per step, then the rest) differs from
    :func:`camkit.metrics.deletion_curve`'s (``ceil(k N / steps)``), so its AUCs would differ;
    use camkit's :func:`~camkit.metrics.deletion_curve`, :func:`~camkit.metrics.insertion_curve`
    and :func:`~camkit.metrics.auc` natively. Constructing this class raises.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise CompatNotTranslatedError(
            "torchcam's DeletionInsertionMetric is not translated by camkit.compat.torchcam; use "
            "camkit.metrics.deletion_curve / insertion_curve / auc natively (see docs/migration/torchcam.md)"
        )
