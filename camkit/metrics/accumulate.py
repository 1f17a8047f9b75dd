"""Aggregate per-image metric values over a dataset, batch by batch.

The running statistics stay on the values' device and are merged with Chan et al.'s
parallel update (float64), so adding a batch never syncs with the host. A sample whose
value holds any NaN (a NaN map, a constant map's undefined correlation) is counted in
:attr:`MetricAccumulator.skipped` and left out of the mean and std.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InvalidInputError
from .deletion import auc

__all__ = ["CurveAccumulator", "MetricAccumulator"]


class MetricAccumulator:
    """Mean and standard deviation of per-sample values [B, ...] over many batches.

    Example:
        >>> import torch
        >>> from camkit.metrics import MetricAccumulator
        >>> acc = MetricAccumulator()
        >>> acc.update(torch.tensor([1.0, float("nan")]))
        >>> acc.update(torch.tensor([True, False]))  # pointing-game hits work too
        >>> round(float(acc.mean), 4), round(float(acc.std), 4), acc.count, acc.skipped
        (0.6667, 0.5774, 3, 1)
    """

    def __init__(self) -> None:
        self._n: Tensor | None = None
        self._mean: Tensor | None = None
        self._m2: Tensor | None = None
        self._skipped: Tensor | None = None
        self._shape: tuple[int, ...] | None = None

    def update(self, values: Tensor) -> None:
        """Add per-sample values [B] or [B, ...] (e.g. [B, steps + 1] curves)."""
        if not isinstance(values, Tensor) or values.dim() < 1:
            raise InvalidInputError(
                f"values must be a tensor [B] or [B, ...], one row per sample, got "
                f"{list(values.shape) if isinstance(values, Tensor) else type(values).__name__}"
            )
        if self._shape is not None and tuple(values.shape[1:]) != self._shape:
            raise InvalidInputError(
                f"values have per-sample shape {list(values.shape[1:])}, but earlier batches had {list(self._shape)}"
            )
        self._shape = tuple(values.shape[1:])
        v = values.detach().double()
        valid = ~torch.isnan(v).flatten(1).any(dim=1) if v.dim() > 1 else ~torch.isnan(v)
        n_b = valid.sum().double()
        weight = valid.view(-1, *([1] * (v.dim() - 1))).double()
        v = torch.where(weight > 0, v, torch.zeros_like(v))
        mean_b = (v * weight).sum(0) / n_b.clamp(min=1)
        m2_b = (((v - mean_b) ** 2) * weight).sum(0)
        if self._n is None or self._mean is None or self._m2 is None or self._skipped is None:
            self._n, self._mean, self._m2 = n_b, mean_b, m2_b
            self._skipped = (~valid).sum()
            return
        n = self._n + n_b
        delta = mean_b - self._mean
        share = n_b / n.clamp(min=1)
        self._mean = self._mean + delta * share
        self._m2 = self._m2 + m2_b + delta**2 * self._n * share
        self._n = n
        self._skipped = self._skipped + (~valid).sum()

    @property
    def count(self) -> int:
        """Samples counted (not NaN)."""
        return 0 if self._n is None else int(self._n)

    @property
    def skipped(self) -> int:
        """Samples skipped because their value held NaN."""
        return 0 if self._skipped is None else int(self._skipped)

    @property
    def mean(self) -> Tensor:
        """Mean over counted samples, float64 [...] (NaN before any counted sample)."""
        if self._n is None or self._mean is None:
            return torch.tensor(float("nan"), dtype=torch.float64)
        return torch.where(self._n > 0, self._mean, torch.full_like(self._mean, float("nan")))

    @property
    def std(self) -> Tensor:
        """Sample standard deviation (n - 1 in the denominator), NaN with fewer than 2 samples."""
        if self._n is None or self._m2 is None:
            return torch.tensor(float("nan"), dtype=torch.float64)
        var = self._m2 / (self._n - 1).clamp(min=1)
        return torch.where(self._n > 1, var.sqrt(), torch.full_like(var, float("nan")))

    def summary(self) -> dict[str, float | int | list[float]]:
        """``{"mean", "std", "count", "skipped"}`` as plain Python values (one host sync)."""
        mean, std = self.mean, self.std
        return {
            "mean": mean.tolist(),
            "std": std.tolist(),
            "count": self.count,
            "skipped": self.skipped,
        }


class CurveAccumulator:
    """Mean curve and mean AUC of curves like :func:`deletion_curve`'s over many batches.

    Every batch must come with the same fractions (same ``steps`` and image size).

    Example:
        >>> import torch
        >>> from camkit.metrics import CurveAccumulator
        >>> acc = CurveAccumulator()
        >>> fractions = torch.tensor([0.0, 0.5, 1.0])
        >>> acc.update(fractions, torch.tensor([[1.0, 0.25, 0.0], [1.0, 0.5, 0.0]]))
        >>> acc.curve.mean.tolist(), round(float(acc.auc.mean), 4)
        ([1.0, 0.375, 0.0], 0.4375)
    """

    def __init__(self) -> None:
        self.fractions: Tensor | None = None
        self.curve = MetricAccumulator()
        self.auc = MetricAccumulator()

    def update(self, fractions: Tensor, scores: Tensor) -> None:
        """Add curves ``scores`` [B, S] sampled at ``fractions`` [S]."""
        areas = auc(fractions, scores)
        if scores.dim() != 2:
            raise InvalidInputError(f"scores must be curves [B, S], got shape {list(scores.shape)}")
        if self.fractions is None:
            self.fractions = fractions.detach().clone()
        elif self.fractions.shape != fractions.shape or not torch.allclose(
            self.fractions.to(fractions.device, fractions.dtype), fractions
        ):
            raise InvalidInputError(
                "these curves are sampled at other fractions than earlier ones; use the same steps and image size"
            )
        self.curve.update(scores)
        self.auc.update(areas)
