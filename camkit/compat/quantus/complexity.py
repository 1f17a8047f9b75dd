"""Quantus 0.6.0's complexity metrics on :mod:`camkit.metrics`; they need no model (``model=None`` is fine)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from camkit import metrics

from ._base import Metric, Result

__all__ = ["Complexity", "EffectiveComplexity", "Sparseness"]


class _MapOnly(Metric):
    def __init__(self, abs: bool = True, normalise: bool = True, **kwargs: Any) -> None:
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=0.0, **kwargs)

    def _needs_model(self) -> bool:
        return False


class Sparseness(_MapOnly):
    """Quantus's ``Sparseness`` on :func:`camkit.metrics.sparseness`: the Gini index.

    As Quantus, 1e-7 is added to every value first (so an all-zero map scores 0, not NaN);
    Quantus adds it to the caller's own ``a_batch`` in place when ``abs`` and ``normalise`` are
    both off, camkit never modifies it. Equal to Quantus on non-negative maps (its default
    ``abs=True``); with ``abs=False`` Quantus takes the Gini index of signed values (it leaves
    [0, 1]), camkit that of their magnitudes.
    """

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        return [float(v) for v in metrics.sparseness(a.double() + 1e-7).tolist()]


class Complexity(_MapOnly):
    """Quantus's ``Complexity`` on :func:`camkit.metrics.complexity`: the entropy of ``|a| / sum |a|``.

    Equal to Quantus up to its ``log(p + 1e-12)``, within 1e-9 on maps normalised to a maximum of 1.
    """

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        return [float(v) for v in metrics.complexity(a).tolist()]


class EffectiveComplexity(_MapOnly):
    """Quantus's ``EffectiveComplexity`` on :func:`camkit.metrics.effective_complexity`.

    Quantus counts ``a > eps``: with ``abs=False`` negative values do not count; camkit's
    function counts ``|a| > eps``, and this class keeps Quantus's count. Equal to Quantus.
    """

    def __init__(self, eps: float = 1e-5, abs: bool = True, normalise: bool = True, **kwargs: Any) -> None:
        super().__init__(abs=abs, normalise=normalise, **kwargs)
        self.eps = eps

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        return [int(v) for v in metrics.effective_complexity(a.clamp(min=0), eps=self.eps).tolist()]
