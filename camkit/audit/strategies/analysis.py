"""Each class's strategies from its maps (SpRAy) and from its concept relevance vectors, and what to look at first.

:func:`find_strategies` takes maps and vectors already computed (an audit's, or your own):
per class it clusters the downsampled maps and, separately, the concept relevance vectors
(:func:`~camkit.audit.strategies.spectral.spectral_clusters`), then describes every cluster
(a *strategy*): its size, accuracy and mean confidence, its mean map and how concentrated
that is, its prototypes (the images nearest its centre), for concept strategies the
channels that set it apart; the outliers of the class; and a ranking of the strategies,
highest first, by how much they differ: a strategy whose accuracy differs from the rest of
its class, whose mean map is concentrated on one place (a fixed tag, a corner) although
objects move, the more so when that place is away from where the rest of its class looks. The typical concentration is the median over every strategy of the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import InvalidInputError
from .spectral import MIN_IMAGES, Clustering, spectral_clusters

__all__ = ["KINDS", "ClassStrategies", "Strategies", "Strategy", "find_strategies", "focus"]

KINDS = ("maps", "concepts")
_OUTLIER_Z = 3.5
_MAX_OUTLIERS = 5
_CHANNELS = 3


def focus(mean_map: np.ndarray, top: float = 0.1) -> float:
    """The share of a (non-negative) map's total in its top ``top`` cells; NaN for an all-zero map.

    A strategy whose images all look at one fixed place has a concentrated mean map (near 1);
    one that follows objects around the image has a spread-out one (near ``top``).

    Example:
        >>> import numpy as np
        >>> from camkit.audit.strategies.analysis import focus
        >>> m = np.zeros((10, 10)); m[0, :5] = 1.0; m[9, 9] = 5.0
        >>> round(focus(m), 3)
        1.0
    """
    flat = np.sort(np.clip(np.asarray(mean_map, dtype=np.float64).ravel(), 0, None))[::-1]
    total = flat.sum()
    if total <= 0:
        return math.nan
    return float(flat[: max(1, math.ceil(top * flat.size))].sum() / total)


def _spread_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Total variation distance between two non-negative maps as distributions, in [0, 1]."""
    p, q = np.clip(a.ravel(), 0, None), np.clip(b.ravel(), 0, None)
    if p.sum() <= 0 or q.sum() <= 0:
        return math.nan
    return float(0.5 * np.abs(p / p.sum() - q / q.sum()).sum())


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(kept) / len(kept) if kept else None


@dataclass
class Strategy:
    """One cluster of a class's images: one way the model decides that class.

    Attributes:
        name: ``"CLASS/ID"`` (ID 0 is the class's largest strategy).
        size, share: its images, and their share of the class.
        accuracy, confidence: over its images (``None`` without labels / values).
        mean_map: the mean of its downsampled maps (``None`` without maps); ``focus`` its
            concentration (:func:`focus`); ``away``: the total variation distance between its mean
            map and the mean map of the rest of its class (``None`` for a class with one strategy); ``coherence``: the length of
            the mean of its unit-length maps, the mean cosine between each map and that mean
            direction: near 1 when its images all look at the same place (a fixed tag), lower
            when they follow objects around.
        prototypes: positions (in the arrays given) of the images nearest its centre.
        members: positions of all its images.
        channels: for concept strategies, ``(channel, lift)`` of the channels whose mean share of
            relevance is most above the rest of the class's.
        references: for each of those channels, the positions of the strategy's images where it
            has the largest share of the relevance (its reference samples).
        score, why: the ranking score and its reasons in words.
    """

    name: str
    size: int
    share: float
    accuracy: float | None
    confidence: float | None
    mean_map: np.ndarray | None
    focus: float | None
    away: float | None
    coherence: float | None
    prototypes: list[int]
    members: list[int]
    channels: list[tuple[int, float]] = field(default_factory=list)
    references: dict[int, list[int]] = field(default_factory=dict)
    score: float = 0.0
    why: str = ""

    @property
    def peak(self) -> list[float] | None:
        """Where its mean map is highest: the cell's centre as a fraction of each axis (rows, then columns)."""
        if self.mean_map is None or not np.any(self.mean_map > 0):
            return None
        cell = np.unravel_index(int(np.argmax(self.mean_map)), self.mean_map.shape)
        return [round((int(i) + 0.5) / side, 4) for i, side in zip(cell, self.mean_map.shape)]

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary (no arrays)."""
        return {
            "name": self.name, "size": self.size, "share": self.share, "accuracy": self.accuracy,
            "confidence": self.confidence, "focus": self.focus, "away": self.away, "coherence": self.coherence,
            "peak": self.peak, "score": self.score,
            "why": self.why, "channels": [[c, lift] for c, lift in self.channels],
        }  # fmt: skip


@dataclass
class ClassStrategies:
    """One class's strategies of one kind (``"maps"`` or ``"concepts"``).

    Attributes:
        cls, kind: the class name and the kind of feature clustered.
        positions: int [n], the class's images (positions in the arrays given).
        clustering: the spectral clustering (labels per image, eigenvalues, 2-D embedding).
        strategies: one per cluster, largest first.
        outliers: positions of the images farthest from their strategy's centre (robust z > 3.5).
        reason: why the class has one strategy without clustering ("" otherwise).
    """

    cls: str
    kind: str
    positions: np.ndarray
    clustering: Clustering
    strategies: list[Strategy]
    outliers: list[int]
    reason: str = ""

    def describe(self, keys: Sequence[str] | None = None) -> dict[str, Any]:
        """A JSON-ready summary; ``keys`` turns positions into image keys."""

        def name(i: int) -> Any:
            return keys[i] if keys is not None else i

        out: dict[str, Any] = {
            "images": len(self.positions), "strategies": len(self.strategies), "reason": self.reason,
            "eigenvalues": [round(float(v), 6) for v in self.clustering.eigenvalues],
            "outliers": [name(i) for i in self.outliers], "per_strategy": [],
        }  # fmt: skip
        for s in self.strategies:
            out["per_strategy"].append({**s.describe(), "prototypes": [name(i) for i in s.prototypes]})
        return out


@dataclass
class Strategies:
    """Every class's strategies of both kinds, and the ranking (see :func:`find_strategies`).

    Attributes:
        classes: the class of each image, as given.
        maps, concepts: ``{class: ClassStrategies}`` for each kind that had features.
        ranking: every strategy, highest score first, as ``(kind, Strategy)``.
    """

    classes: list[str]
    maps: dict[str, ClassStrategies]
    concepts: dict[str, ClassStrategies]
    ranking: list[tuple[str, Strategy]]

    def names(self, kind: str = "maps") -> list[str]:
        """Each image's strategy name (``"circle/1"``); ``""`` for an image without one."""
        groups = self.maps if kind == "maps" else self.concepts
        out = [""] * len(self.classes)
        for group in groups.values():
            for s in group.strategies:
                for i in s.members:
                    out[i] = s.name
        return out

    def describe(self, keys: Sequence[str] | None = None, top: int = 10) -> dict[str, Any]:
        """The ``strategies`` section of an audit's ``summary.json``."""
        return {
            "maps": {c: g.describe(keys) for c, g in sorted(self.maps.items())},
            "concepts": {c: g.describe(keys) for c, g in sorted(self.concepts.items())},
            "ranking": [{"kind": kind, **s.describe()} for kind, s in self.ranking[:top]],
        }


def find_strategies(
    classes: Sequence[str],
    maps: np.ndarray | None = None,
    vectors: np.ndarray | None = None,
    *,
    correct: Sequence[bool | None] | None = None,
    confidence: Sequence[float | None] | None = None,
    seed: int = 0,
    max_clusters: int = 6,
    min_images: int = MIN_IMAGES,
    prototypes: int = 4,
    device: Any = None,
) -> Strategies:
    """Each class's strategies from its maps and/or its concept relevance vectors.

    Args:
        classes: the class of each of the N images (labels, or predictions without labels).
        maps: [N, *s] downsampled maps (non-negative), or ``None``.
        vectors: [N, C] concept relevance vectors (e.g. :meth:`camkit.ConceptRelevance.relevance`), or ``None``.
        correct: per image, whether the prediction was right (``None``: unknown).
        confidence: per image, the model's confidence.
        seed: for the eigen-solver and k-means: the same inputs give the same strategies.
        max_clusters: the most strategies a class may get.
        min_images: a class with fewer images gets one strategy, and says why.
        prototypes: images kept per strategy.
        device: where a class of more than 1,500 images is clustered (a ``torch.device`` or its name;
            default the CPU); smaller classes are clustered on the CPU.

    Returns:
        :class:`Strategies`.

    Example:
        >>> import numpy as np
        >>> from camkit.audit.strategies import find_strategies
        >>> rng = np.random.default_rng(0)
        >>> maps = rng.uniform(0, 0.2, (30, 4, 4)); maps[:10, 3, 3] = 5.0  # a third look at one corner
        >>> found = find_strategies(["cat"] * 30, maps, correct=[True] * 10 + [False] * 20)
        >>> names = found.names("maps")
        >>> names[0], names[29], found.ranking[0][1].name, found.ranking[0][1].size
        ('cat/1', 'cat/0', 'cat/1', 10)
    """
    n = len(classes)
    for name, array in (("maps", maps), ("vectors", vectors)):
        if array is not None and len(array) != n:
            raise InvalidInputError(f"{name} has {len(array)} rows for {n} classes; give one row per image")
    if maps is None and vectors is None:
        raise InvalidInputError("find_strategies needs maps, vectors or both")
    right = list(correct) if correct is not None else [None] * n
    conf = list(confidence) if confidence is not None else [None] * n
    by_class: dict[str, list[int]] = {}
    for i, c in enumerate(classes):
        by_class.setdefault(str(c), []).append(i)
    found: dict[str, dict[str, ClassStrategies]] = {"maps": {}, "concepts": {}}
    for cls, members in by_class.items():
        pos = np.asarray(members, dtype=np.int64)
        for kind, array in (("maps", maps), ("concepts", vectors)):
            if array is None:
                continue
            feats = np.asarray(array[pos], dtype=np.float32).reshape(len(pos), -1)
            if kind == "maps":
                feats = np.clip(feats, 0, None)
            clustering = spectral_clusters(
                feats, max_clusters=max_clusters, min_images=min_images, seed=seed, device=device
            )
            found[kind][cls] = _describe_class(cls, kind, pos, clustering, maps, vectors, right, conf, prototypes)
    ranking = _rank(found)
    return Strategies([str(c) for c in classes], found["maps"], found["concepts"], ranking)


def _describe_class(cls: str, kind: str, pos: np.ndarray, clustering: Clustering, maps: np.ndarray | None,
                    vectors: np.ndarray | None, right: list[Any], conf: list[Any], prototypes: int) -> ClassStrategies:  # fmt: skip
    feats = clustering.features
    strategies: list[Strategy] = []
    distance = np.zeros(len(pos))
    if vectors is not None and kind == "concepts":
        unit = np.asarray(vectors[pos], dtype=np.float32)
        unit = unit / np.maximum(np.abs(unit).sum(axis=1, keepdims=True), 1e-12)  # each channel's share
    for c in range(clustering.count):
        inside = np.flatnonzero(clustering.labels == c)
        centre = feats[inside].mean(axis=0)
        d = np.linalg.norm(feats[inside] - centre, axis=1)
        distance[inside] = d
        proto = pos[inside[np.argsort(d, kind="stable")[:prototypes]]].tolist()
        coherence = None
        mean_map = None
        if maps is not None:
            member_maps = np.clip(np.asarray(maps[pos[inside]], dtype=np.float64), 0, None)
            mean_map = member_maps.mean(axis=0)
            flat = member_maps.reshape(len(inside), -1)
            norms = np.linalg.norm(flat, axis=1, keepdims=True)
            coherence = float(np.linalg.norm(np.divide(flat, norms, out=np.zeros_like(flat), where=norms > 0).mean(axis=0)))
        s = Strategy(
            name=f"{cls}/{c}", size=len(inside), share=len(inside) / len(pos),
            accuracy=_mean([None if right[i] is None else float(bool(right[i])) for i in pos[inside]]),
            confidence=_mean([conf[i] for i in pos[inside]]), mean_map=mean_map,
            focus=focus(mean_map) if mean_map is not None else None, away=None, coherence=coherence, prototypes=proto,
            members=pos[inside].tolist(),
        )  # fmt: skip
        if kind == "concepts" and vectors is not None and clustering.count > 1:
            lift = unit[inside].mean(axis=0) - unit[np.flatnonzero(clustering.labels != c)].mean(axis=0)
            top = np.argsort(-lift, kind="stable")[:_CHANNELS]
            s.channels = [(int(ch), float(lift[ch])) for ch in top if lift[ch] > 0]
            for ch, _ in s.channels:
                best = inside[np.argsort(-unit[inside, ch], kind="stable")[:prototypes]]
                s.references[ch] = pos[best].tolist()
        strategies.append(s)
    if maps is not None and len(strategies) > 1:
        class_maps = np.clip(np.asarray(maps[pos], dtype=np.float64), 0, None)
        total = class_maps.sum(axis=0)
        for c, s in enumerate(strategies):
            if s.mean_map is not None:
                rest = (total - class_maps[clustering.labels == c].sum(axis=0)) / max(1, len(pos) - s.size)
                s.away = _spread_distance(s.mean_map, rest)
    outliers: list[int] = []
    if clustering.count and len(pos) >= 3 and not clustering.reason:
        med = np.median(distance)
        mad = 1.4826 * np.median(np.abs(distance - med))
        if mad > 0:
            z = (distance - med) / mad
            worst = np.argsort(-z, kind="stable")[:_MAX_OUTLIERS]
            outliers = [int(pos[i]) for i in worst if z[i] > _OUTLIER_Z]
    return ClassStrategies(cls, kind, pos, clustering, strategies, outliers, clustering.reason)


def _rank(found: dict[str, dict[str, ClassStrategies]]) -> list[tuple[str, Strategy]]:
    """Score every strategy; highest first (ties: larger first, then by name).

    The score adds: the gap between the strategy's accuracy and the rest of its class's; how much
    more coherent its maps are than the run's typical strategy (the median coherence: images
    that all look at one place, as at a fixed tag, against images that follow their objects);
    and, weighted by that excess coherence, how far its mean map lies from the rest of its class's.
    """
    every = [(kind, g, s) for kind, groups in found.items() for g in groups.values() for s in g.strategies]
    values = [s.coherence for _, _, s in every if s.coherence is not None and not math.isnan(s.coherence)]
    typical = float(np.median(values)) if values else 1.0
    for _, group, s in every:
        reasons, score = [], 0.0
        coherent = s.coherence is not None and s.coherence >= typical + 0.05
        if len(group.strategies) > 1:
            rest_right = [t for t in group.strategies if t is not s and t.accuracy is not None]
            if s.accuracy is not None and rest_right:
                rest_acc = sum(t.accuracy * t.size for t in rest_right if t.accuracy is not None) / sum(
                    t.size for t in rest_right
                )
                gap = abs(s.accuracy - rest_acc)
                score += gap
                if gap >= 0.1:
                    reasons.append(f"accuracy {s.accuracy:.0%} against {rest_acc:.0%} for the rest of the class")
            weight = min(1.0, max(0.0, (s.coherence - typical) / 0.1)) if s.coherence is not None else 0.0
            if s.away is not None and not math.isnan(s.away) and weight > 0:
                score += weight * s.away  # concentrated attention away from the rest; clusters that follow objects are not
                if s.away >= 0.2 and coherent:
                    reasons.append(f"attention {s.away:.2f} away from where the rest of the class looks")
        if s.coherence is not None and s.coherence > typical:
            score += 2 * (s.coherence - typical)
            if coherent:
                reasons.append(
                    f"its images look at the same place (coherence {s.coherence:.2f} against a typical {typical:.2f})"
                )
        if s.channels and len(group.strategies) > 1:
            reasons.append("set apart by channels " + ", ".join(str(c) for c, _ in s.channels))
        s.score = score
        s.why = "; ".join(reasons) or "like the rest"
    ordered = sorted(every, key=lambda t: (-t[2].score, -t[2].size, t[2].name, t[0]))
    return [(kind, s) for kind, _, s in ordered]
