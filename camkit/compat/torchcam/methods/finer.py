"""torchcam 0.5.0's FinerCAM on the compat gradient extractors."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ._gradient_base import GradCAM, GradCAMpp, LayerCAM, _GradCAM, _Wrapper
from .core import OutputTarget

__all__ = ["FinerCAM"]


class FinerCAM(_Wrapper):
    """Finer-CAM as torchcam 0.5.0 defines it: a base extractor's map of ``y_c - gamma mean_t(y_{d_t})``.

    The contrastive score (the target's score minus ``gamma`` times the mean score of its
    references) is formed before the base method's ReLU; by default the references are the
    ``num_references`` classes whose scores are closest to the target's. camkit's native
    :class:`camkit.FinerCAM` weighs its rivals by a softmax of their logits instead (pytorch-grad-cam's rule).

    Args:
        model: input model
        target_layer: the target layer(s), as modules or names
        input_shape: shape of the expected input tensor excluding the batch dimension
        base_method: :class:`GradCAM`, :class:`GradCAMpp` or :class:`LayerCAM`
        gamma: weight of the references' mean score (finite, non-negative)
        num_references: how many automatic references (capped by the other classes available)
        base_kwargs: keyword arguments for ``base_method``
    """

    def __init__(
        self,
        model: nn.Module,
        target_layer: nn.Module | str | list[nn.Module | str] | None = None,
        input_shape: tuple[int, ...] = (3, 224, 224),
        *,
        base_method: type[_GradCAM] = GradCAM,
        gamma: float = 0.6,
        num_references: int = 3,
        **base_kwargs: Any,
    ) -> None:
        if base_method not in (GradCAM, GradCAMpp, LayerCAM):
            raise TypeError(f"base_method must be GradCAM, GradCAMpp, or LayerCAM, got {base_method!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)):
            raise TypeError(f"gamma must be a real number, got {gamma!r}")
        if not math.isfinite(gamma) or gamma < 0:
            raise ValueError(f"gamma must be finite and non-negative, got {gamma!r}")
        if isinstance(num_references, bool) or not isinstance(num_references, int):
            raise TypeError(f"num_references must be an integer, got {num_references!r}")
        if num_references < 1:
            raise ValueError(f"num_references must be positive, got {num_references}")
        self.gamma = float(gamma)
        self.num_references = num_references
        self.base_cam = base_method(model, target_layer, input_shape=input_shape, **base_kwargs)

    @staticmethod
    def _targets(class_idx: Any, batch: int, num_classes: int) -> list[int]:
        if isinstance(class_idx, int) and not isinstance(class_idx, bool):
            targets = [class_idx] * batch
        elif isinstance(class_idx, list):
            if len(class_idx) != batch:
                raise ValueError(f"class_idx has {len(class_idx)} entries but the batch size is {batch}")
            if any(isinstance(i, bool) or not isinstance(i, int) for i in class_idx):
                raise TypeError(f"class_idx must contain integers, got {class_idx!r}")
            targets = class_idx
        else:
            raise TypeError(f"class_idx must be an integer or a list of integers, got {class_idx!r}")
        if any(i < 0 or i >= num_classes for i in targets):
            raise ValueError(f"class_idx {class_idx!r} holds an out-of-range index for {num_classes} classes")
        return targets

    @staticmethod
    def _reference_rows(comparison_idx: Any, batch: int) -> list[list[int]]:
        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if is_int(comparison_idx):
            return [[comparison_idx]] * batch
        if not isinstance(comparison_idx, list):
            raise TypeError(f"comparison_idx must be an integer, a list, or a nested list, got {comparison_idx!r}")
        if not comparison_idx:
            raise ValueError("comparison_idx cannot be empty: give at least one reference class")
        if all(isinstance(row, list) for row in comparison_idx):
            if len(comparison_idx) != batch:
                raise ValueError(f"per-sample comparison_idx has {len(comparison_idx)} rows, the batch size is {batch}")
            if any(not row for row in comparison_idx):
                raise ValueError("comparison_idx rows cannot be empty")
            if len({len(row) for row in comparison_idx}) != 1:
                raise ValueError("per-sample comparison_idx rows must have equal lengths")
            return comparison_idx
        if all(is_int(v) for v in comparison_idx):
            return [comparison_idx] * batch
        raise TypeError(f"comparison_idx must contain integers or lists of integers, got {comparison_idx!r}")

    def _references(self, comparison_idx: Any, scores: Tensor, targets: list[int]) -> Tensor:
        batch, num_classes = scores.shape
        index = torch.tensor(targets, device=scores.device).view(-1, 1)
        if comparison_idx is None:
            distance = (scores.detach() - scores.detach().gather(1, index)).abs()
            distance.scatter_(1, index, float("inf"))
            return distance.topk(min(self.num_references, num_classes - 1), dim=1, largest=False).indices
        rows = self._reference_rows(comparison_idx, batch)
        for sample, (target, row) in enumerate(zip(targets, rows, strict=True)):
            if any(isinstance(v, bool) or not isinstance(v, int) for v in row):
                raise TypeError(f"comparison_idx must contain integers, got {row!r} for sample {sample}")
            if any(v < 0 or v >= num_classes for v in row):
                raise ValueError(f"comparison_idx {row!r} holds an out-of-range index for sample {sample}")
            if len(set(row)) != len(row):
                raise ValueError(f"comparison_idx {row!r} contains duplicates for sample {sample}")
            if target in row:
                raise ValueError(f"comparison_idx {row!r} contains the target class {target} for sample {sample}")
        return torch.tensor(rows, device=scores.device)

    def _contrast(self, class_idx: Any, scores: Any, comparison_idx: Any) -> tuple[Tensor, list[int], Tensor]:
        if scores is None:
            raise ValueError("model output scores is required to compute FinerCAM: pass extractor(class_idx, scores)")
        if not isinstance(scores, Tensor):
            raise TypeError(f"scores must be a tensor, got {type(scores).__name__}")
        if scores.ndim != 2 or scores.shape[0] < 1:
            raise ValueError(f"scores must have shape (batch_size, num_classes), got {tuple(scores.shape)}")
        if scores.shape[1] < 2:
            raise ValueError("FinerCAM requires at least one comparison class: the scores hold a single class")
        targets = self._targets(class_idx, scores.shape[0], scores.shape[1])
        refs = self._references(comparison_idx, scores, targets)
        index = torch.tensor(targets, device=scores.device).view(-1, 1)
        contrast = scores.gather(1, index) - self.gamma * scores.gather(1, refs).mean(dim=1, keepdim=True)
        return contrast, targets, refs

    def _maps(self, run: Callable[..., list[Tensor]], class_idx: Any, scores: Any, comparison_idx: Any,
              normalized: bool, kwargs: dict[str, Any]) -> list[Tensor]:
        if kwargs.pop("targets", None) is not None:
            raise ValueError("FinerCAM does not support arbitrary output targets: give class_idx (and comparison_idx)")
        contrast, targets, refs = self._contrast(class_idx, scores, comparison_idx)
        if contrast.requires_grad:  # the contrast is the only score column: class 0 of it
            return run([0] * contrast.shape[0], contrast, normalized, **kwargs)
        gamma = self.gamma

        def objective(target: int, row: Tensor) -> OutputTarget:
            return lambda out: out[target] - gamma * out[row].mean()

        fns = [objective(t, row) for t, row in zip(targets, refs, strict=True)]
        return run(None, scores, normalized, targets=fns, **kwargs)

    def __call__(
        self,
        class_idx: int | list[int],
        scores: Tensor | None = None,
        comparison_idx: int | list[int] | list[list[int]] | None = None,
        normalized: bool = True,
        **kwargs: Any,
    ) -> list[Tensor]:
        """One Finer-CAM per target layer [N, *s].

        Raises:
            ValueError: if ``targets`` are given (Finer-CAM contrasts classes), or an argument is out of range
            TypeError: if an argument has the wrong type
        """
        return self._maps(self.base_cam, class_idx, scores, comparison_idx, normalized, kwargs)

    def compute_cams(
        self,
        class_idx: int | list[int],
        scores: Tensor | None = None,
        comparison_idx: int | list[int] | list[list[int]] | None = None,
        normalized: bool = True,
        **kwargs: Any,
    ) -> list[Tensor]:
        """The maps, without the base extractor's checks."""
        return self._maps(self.base_cam.compute_cams, class_idx, scores, comparison_idx, normalized, kwargs)

    def fuse_cams(self, cams: list[Tensor], target_shape: tuple[int, ...] | None = None) -> Tensor:
        """Fuse maps with the base extractor's rule."""
        return self.base_cam.fuse_cams(cams, target_shape)

    def __repr__(self) -> str:
        return (
            f"FinerCAM(base_method={type(self.base_cam).__name__}, target_layer={self.target_names}, "
            f"gamma={self.gamma}, num_references={self.num_references})"
        )
