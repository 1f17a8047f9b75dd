"""Quantus 0.6.0's localisation metrics on :mod:`camkit.metrics`.

Maps and masks come as Quantus takes them (``a_batch`` and ``s_batch`` [B, 1, *S], or without
the channel axis); a mask position counts as inside where ``s != 0``. Maps with several
channels ([B, C, *S]) are read as Quantus reads every map, flattened: each channel's value is
a position of its own, and the mask [B, 1, *S] holds for every channel (Quantus 0.6.0 fails
there, its flattened one-channel mask being C times shorter than the map); ``Focus`` sums the
positive relevance of every channel, as Quantus does. The model is not used.
Where the region is empty, every class returns NaN (Quantus's ``PointingGame`` returns True).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from camkit import metrics
from camkit.errors import InvalidInputError

from ._base import Metric, Result

__all__ = [
    "AUC",
    "AttributionLocalisation",
    "Focus",
    "PointingGame",
    "RelevanceMassAccuracy",
    "RelevanceRankAccuracy",
    "TopKIntersection",
]


def single_channel(a: Tensor, name: str) -> Tensor:
    """Maps [B, 1, *S] as [B, *S]; several channels are refused."""
    if a.shape[1] != 1:
        raise InvalidInputError(
            f"{name} takes maps with one channel ([B, 1, *S]), got {list(a.shape)}; sum them over the channel axis"
        )
    return a[:, 0]


def rows(values: Tensor) -> Result:
    return [float(v) for v in values.double().cpu().tolist()]


class _Localisation(Metric):
    """A localisation metric: maps and masks, no model."""

    def _needs_model(self) -> bool:
        return False

    def map_dtype(self, a: np.ndarray, x: Tensor) -> torch.dtype:
        """The maps' own precision: float64 maps are scored in float64, as Quantus scores the numpy arrays."""
        return torch.float64 if a.dtype == np.float64 else x.dtype

    def masks(self, a: Tensor, s: Tensor | None) -> tuple[Tensor, Tensor]:
        """Maps and bool masks [B, *S]; for maps with several channels, both flattened to [B, C * N]."""
        name = type(self).__name__
        if s is None:
            raise InvalidInputError(f"{name} needs the ground-truth masks: pass s_batch [B, 1, *S]")
        if a.shape[1] != 1:
            return a.flatten(1), s.expand_as(a).flatten(1) != 0
        return single_channel(a, name), single_channel(s, name) != 0

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        maps, masks = self.masks(a, s)
        return rows(self.score(maps, masks))

    def score(self, maps: Tensor, masks: Tensor) -> Tensor:
        raise NotImplementedError


class PointingGame(_Localisation):
    """Quantus's ``PointingGame`` on :func:`camkit.metrics.pointing_game` with ``ties="any"``.

    A hit when any position holding the map's maximum lies in the mask (Quantus's rule); one
    bool per sample. Differs from Quantus: an empty mask gives NaN (Quantus writes NaN into a
    bool array, which reads True: a hit); ``weighted=True`` gives ``hit * (1 - |mask| / N)``
    as a float (Quantus 0.6.0 fails with a numpy indexing error).
    """

    def __init__(self, weighted: bool = False, abs: bool = False, normalise: bool = True, **kwargs: Any) -> None:
        super().__init__(abs=abs, normalise=normalise, **kwargs)
        self.weighted = weighted

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        maps, masks = self.masks(a, s)
        hit = metrics.pointing_game(maps, masks, ties="any")
        empty = ~masks.flatten(1).any(dim=1)
        if self.weighted:
            share = masks.flatten(1).sum(dim=1) / masks[0].numel()
            values = hit.double() * (1 - share.double())
            return rows(torch.where(empty, torch.full_like(values, float("nan")), values))
        return [float("nan") if e else bool(h) for h, e in zip(hit.cpu().tolist(), empty.cpu().tolist())]


class AttributionLocalisation(_Localisation):
    """Quantus's ``AttributionLocalisation`` on :func:`camkit.metrics.attribution_localisation`.

    Equal to Quantus for ``weighted=False``. With ``weighted=True`` camkit multiplies by the
    mask's share of the map's positions; Quantus divides the mask's size by
    ``x_batch[2:].size``, the values of the samples after the second, so its weight depends on
    the batch size (infinite for batches of two). ``max_size`` only warns in Quantus and is accepted.
    """

    def __init__(
        self, weighted: bool = False, max_size: float = 1.0, positive_attributions: bool = False, abs: bool = True,
        normalise: bool = True, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, **kwargs)
        self.weighted = weighted
        self.max_size = max_size
        self.positive_attributions = positive_attributions

    def score(self, maps: Tensor, masks: Tensor) -> Tensor:
        return metrics.attribution_localisation(
            maps, masks, weighted=self.weighted, positive_only=self.positive_attributions
        )


class TopKIntersection(_Localisation):
    """Quantus's ``TopKIntersection`` on :func:`camkit.metrics.top_k_intersection`.

    Equal to Quantus where the map has no ties among its top values; Quantus orders ties with
    numpy's unstable sort, camkit puts the earlier position first.
    """

    def __init__(
        self, k: int = 1000, concept_influence: bool = False, abs: bool = False, normalise: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(abs=abs, normalise=normalise, **kwargs)
        self.k = k
        self.concept_influence = concept_influence

    def score(self, maps: Tensor, masks: Tensor) -> Tensor:
        return metrics.top_k_intersection(maps, masks, self.k, concept_influence=self.concept_influence)


class RelevanceRankAccuracy(_Localisation):
    """Quantus's ``RelevanceRankAccuracy`` on :func:`camkit.metrics.relevance_rank_accuracy`.

    Equal to Quantus where the map has no ties at the cut (ties as in :class:`TopKIntersection`).
    """

    def score(self, maps: Tensor, masks: Tensor) -> Tensor:
        return metrics.relevance_rank_accuracy(maps, masks)


class RelevanceMassAccuracy(_Localisation):
    """Quantus's ``RelevanceMassAccuracy`` on :func:`camkit.metrics.relevance_mass_accuracy`: equal to Quantus."""

    def score(self, maps: Tensor, masks: Tensor) -> Tensor:
        return metrics.relevance_mass_accuracy(maps, masks)


class AUC(_Localisation):
    """Quantus's ``AUC``: the area under the ROC curve of each map as a detector of its mask.

    The area is :func:`camkit.metrics.region_auc`'s; the number is summed as Quantus sums it
    (scikit-learn's ``roc_curve`` corners and trapezoid, in numpy's order), so it equals Quantus's
    to the last bit, where ``region_auc`` gives the correctly rounded ratio (the two can differ by
    one unit in the last place: 0.33333333333333337 here for 1/3). A mask covering the whole map
    gives NaN, as in Quantus (scikit-learn warns there).
    """

    def score(self, maps: Tensor, masks: Tensor) -> Tensor:
        area = metrics.region_auc(maps.double(), masks)  # float64, as scikit-learn's area
        flat, inside = maps.double().flatten(1).cpu().numpy(), masks.flatten(1).cpu().numpy()
        summed = [_trapezoid_roc_area(f, m) if not np.isnan(v) else v for f, m, v in zip(flat, inside, area.tolist())]
        return torch.tensor(summed, dtype=torch.float64)


def _trapezoid_roc_area(scores: np.ndarray, inside: np.ndarray) -> float:
    """The ROC area of one map, summed as scikit-learn sums it.

    The curve's corners: the counts of positives and negatives above each distinct score, the
    points between two collinear ones dropped; then the trapezoid over them in numpy's summation
    order. Only the rounding differs from the Mann-Whitney ratio.
    """
    order = np.argsort(-scores, kind="stable")
    ranked, positive = scores[order], inside[order].astype(np.float64)
    ends = np.concatenate([np.nonzero(np.diff(ranked))[0], [ranked.size - 1]])
    tps = np.cumsum(positive)[ends]
    fps = 1.0 + ends - tps
    if fps.size > 2:  # a point on the line between its neighbours is no corner
        corner = np.concatenate([[True], np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), [True]])
        tps, fps = tps[corner], fps[corner]
    tpr = np.concatenate([[0.0], tps]) / tps[-1]
    fpr = np.concatenate([[0.0], fps]) / fps[-1]
    return float((np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0).sum())


class Focus(_Localisation):
    """Quantus's ``Focus`` on :func:`camkit.metrics.focus`.

    ``custom_batch`` [B, 4] says which of each mosaic's quadrants (top-left, top-right,
    bottom-left, bottom-right) show the explained class; no ``s_batch``. Equal to Quantus,
    except that a map with no positive relevance gives NaN (Quantus: 0). Signals ([B, 2]) and
    volumes ([B, 8]) work too. ``mosaic_shape`` is accepted and unused, as in Quantus.
    """

    def __init__(self, mosaic_shape: Any = None, abs: bool = False, normalise: bool = True, **kwargs: Any) -> None:
        super().__init__(abs=abs, normalise=normalise, **kwargs)
        self.mosaic_shape = mosaic_shape
        self._parts: Tensor | None = None
        self._offset = 0

    def __call__(self, *args: Any, custom_batch: Any = None, **kwargs: Any) -> Result:
        if custom_batch is None:
            raise InvalidInputError("Focus needs custom_batch [B, 4]: which quadrants of each mosaic show the class")
        self._parts, self._offset = torch.as_tensor(custom_batch), 0
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self._parts = None

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        if self._parts is None:
            raise InvalidInputError("Focus needs custom_batch")
        batch = x.shape[0]
        parts = self._parts[self._offset : self._offset + batch].to(x.device)
        self._offset += batch
        positive = a[:, 0] if a.shape[1] == 1 else a.clamp(min=0).sum(dim=1)  # each channel's positive relevance
        return rows(metrics.focus(positive, parts))
