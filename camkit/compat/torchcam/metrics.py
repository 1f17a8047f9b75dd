"""torchcam 0.5.0's ``torchcam.metrics.ClassificationMetric`` on :func:`camkit.metrics.average_drop` and
:func:`camkit.metrics.increase_in_confidence`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._internal.state import eval_mode
from ...metrics import auc, average_drop, deletion_curve, increase_in_confidence, insertion_curve
from .methods.core import _CAM, OutputTarget, _batch_target, _resolve_targets, _target_scores

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
    """Deletion and insertion AUCs (Petsiuk et al. 2018) of an extractor's maps, on camkit's curves.

    Each ``update`` explains the batch, resizes the fused map to the input, ranks positions
    from the highest value (ties in row-major order) and follows the target's score with
    :func:`camkit.metrics.deletion_curve` and :func:`~camkit.metrics.insertion_curve` on
    torchcam's grid (``spacing="block"``: ``ceil(N / steps)`` positions a step); ``summary``
    returns ``{"deletion_auc": ..., "insertion_auc": ...}``, trapezoid areas over the fraction
    perturbed. Maps holding NaN are left out and counted in ``nan_count``.

    Args:
        cam_extractor: a ``torchcam.methods`` extractor (or anything with ``model``, ``__call__``,
            ``fuse_cams`` and ``_hooks_off``)
        logits_fn: applied to the model's output before scoring
        steps: the most perturbation steps
        baseline: what perturbed positions become: a tensor broadcastable to the input, a
            callable returning one, or ``None`` (zeros)
        batch_size: perturbed inputs per forward pass

    Raises:
        TypeError: if an argument has the wrong type
        ValueError: if ``steps`` or ``batch_size`` is not positive
    """

    def __init__(
        self,
        cam_extractor: Any,
        logits_fn: Callable[[Any], Any] | None = None,
        *,
        steps: int = 20,
        baseline: Tensor | Callable[[Tensor], Tensor] | None = None,
        batch_size: int = 32,
    ) -> None:
        for name, value in (("steps", steps), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an integer, got {value!r}")
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if baseline is not None and not isinstance(baseline, Tensor) and not callable(baseline):
            raise TypeError(f"baseline must be a tensor, a callable, or None, got {type(baseline).__name__}")
        self.cam_extractor = cam_extractor
        self.logits_fn = logits_fn
        self.steps = steps
        self.baseline = baseline
        self.batch_size = batch_size
        self.reset()

    def _get_baseline(self, x: Tensor) -> Tensor:
        if self.baseline is None:
            return torch.zeros_like(x)
        canvas = self.baseline if isinstance(self.baseline, Tensor) else self.baseline(x)
        if not isinstance(canvas, Tensor):
            raise TypeError(f"the baseline callable must return a tensor, got {type(canvas).__name__}")
        try:
            return torch.broadcast_to(canvas.to(x), x.shape)
        except RuntimeError as exc:
            raise ValueError(
                f"baseline of shape {tuple(canvas.shape)} must be broadcastable to the input shape {tuple(x.shape)}"
            ) from exc

    def _compute_curves(
        self,
        input_tensor: Tensor,
        baseline: Tensor,
        ranks: Tensor,
        target_indices: Tensor | None,
        original_scores: Tensor,
        targets: list[OutputTarget] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``(fractions [S], deletion [B, S], insertion [B, S])`` for positions ranked by ``ranks`` [B, N] (0 first)."""
        maps = (-ranks.to(torch.float64)).reshape(input_tensor.shape[0], *input_tensor.shape[2:])
        options: dict[str, Any] = {
            "steps": self.steps, "baseline": baseline, "chunk_size": self.batch_size, "output": self.logits_fn,
            "keep_mode": True, "spacing": "block",
        }  # fmt: skip
        runs: list[tuple[slice, Any]]
        if targets is None:
            runs = [(slice(None), cast(Tensor, target_indices))]
        else:  # a callable target scores every row alike: one run per sample
            runs = [(slice(i, i + 1), _rows(fn)) for i, fn in enumerate(targets)]
        deletion, insertion = [], []
        with self.cam_extractor._hooks_off():
            for rows, target in runs:
                fractions, removed = deletion_curve(self.cam_extractor.model, input_tensor[rows], maps[rows], target, **options)
                _, inserted = insertion_curve(self.cam_extractor.model, input_tensor[rows], maps[rows], target, **options)
                deletion.append(removed)
                insertion.append(inserted)
        dtype = original_scores.dtype
        return fractions.to(torch.float32), torch.cat(deletion).to(dtype), torch.cat(insertion).to(dtype)

    def update(
        self,
        input_tensor: Tensor,
        class_idx: int | list[int] | None = None,
        *,
        targets: OutputTarget | list[OutputTarget] | None = None,
    ) -> None:
        """Add a batch: explain it, then measure its deletion and insertion AUCs.

        Raises:
            ValueError: if both class indices and output targets are provided
        """
        if targets is not None and class_idx is not None:
            raise ValueError("provide either class_idx or targets, not both")
        extractor = self.cam_extractor
        with eval_mode(extractor.model):
            scores = extractor.model(input_tensor)
            scores = scores if self.logits_fn is None else self.logits_fn(scores)
            fns = _resolve_targets(targets, input_tensor.shape[0]) if targets is not None else None
            if fns is not None:
                cam, indices = extractor.fuse_cams(extractor(scores=scores, targets=fns)), None
            else:
                extractor_idx, indices = _resolve_class_idx(scores, class_idx)
                cam = extractor.fuse_cams(extractor(extractor_idx, scores))
            discard = torch.isnan(cam).reshape(input_tensor.shape[0], -1).any(dim=-1)
            skipped = int(discard.sum())
            if skipped == input_tensor.shape[0]:
                self.nan_count += skipped
                return
            keep = ~discard
            with torch.no_grad():
                baseline = self._get_baseline(input_tensor)[keep]
            size = tuple(input_tensor.shape[2:])
            mode = {1: "linear", 2: "bilinear", 3: "trilinear"}.get(len(size))
            if mode is None:
                raise ValueError("only 1D, 2D, and 3D spatial inputs are supported")
            maps = F.interpolate(cam[keep].unsqueeze(1), size, mode=mode, align_corners=False).squeeze(1)
            order = torch.argsort(maps.flatten(1), dim=1, descending=True, stable=True)
            ranks = torch.argsort(order, dim=1)
            if fns is not None:
                original = _target_scores(scores, fns)[keep].detach()
                kept_fns: list[OutputTarget] | None = [fn for fn, k in zip(fns, keep.tolist(), strict=True) if k]
                kept_idx = None
            else:
                kept_idx = cast(Tensor, indices)[keep]
                original = cast(Tensor, scores).gather(1, kept_idx[:, None])[:, 0].detach()
                kept_fns = None
            fractions, deletion, insertion = self._compute_curves(
                input_tensor[keep], baseline, ranks, kept_idx, original, kept_fns
            )
        self.deletion += float(auc(fractions, deletion).sum())
        self.insertion += float(auc(fractions, insertion).sum())
        self.total += int(keep.sum())
        self.nan_count += skipped

    def summary(self) -> dict[str, float]:
        """The mean deletion and insertion AUCs over the images seen.

        Raises:
            AssertionError: if the metric has not been updated with a valid map
        """
        if self.total == 0:
            raise AssertionError("you need to update the metric before getting the summary")
        return {"deletion_auc": self.deletion / self.total, "insertion_auc": self.insertion / self.total}

    def reset(self) -> None:
        """Reset the state of the metric."""
        self.deletion = 0.0
        self.insertion = 0.0
        self.total = 0
        self.nan_count = 0


def _rows(fn: OutputTarget) -> Callable[[Tensor], Tensor]:
    """camkit's callable target from a torchcam per-sample target: ``fn`` on each row of the output."""

    def score(output: Tensor) -> Tensor:
        return torch.stack([fn(row).reshape(()) for row in output.unbind(0)])

    return score
