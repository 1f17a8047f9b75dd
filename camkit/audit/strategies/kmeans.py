"""Seeded k-means on a few low-dimensional points (the rows of a spectral embedding), in torch.

The points k-means sees here are at most a few thousand rows of at most :data:`MAX_CLUSTERS`
columns, so it runs on the CPU whatever the device of the rest: the whole problem is a few
hundred kilobytes, and each Lloyd step on a GPU would be a handful of kernel launches and a
host sync. Greedy k-means++ seeding (each new centre the best of ``2 + log k`` draws), then
Lloyd's iterations; the best of ``n_init`` seeded starts by inertia.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...errors import InvalidInputError

__all__ = ["kmeans"]


def _plus_plus(points: Tensor, k: int, gen: torch.Generator) -> Tensor:
    """Greedy k-means++ centres [k, d]: each next centre the draw (of ``2 + log k``) that lowers the potential most."""
    n = len(points)
    trials = 2 + int(math.log(k))
    first = int(torch.randint(n, (1,), generator=gen))
    centres = [points[first]]
    closest = ((points - points[first]) ** 2).sum(dim=1)
    for _ in range(1, k):
        total = float(closest.sum())
        if total <= 0:  # every point sits on a centre already: any point will do
            pick = torch.randint(n, (trials,), generator=gen)
        else:
            pick = torch.multinomial(closest / total, trials, replacement=True, generator=gen)
        candidate = torch.minimum(closest[None], torch.cdist(points[pick], points) ** 2)  # [trials, n]
        best = int(torch.argmin(candidate.sum(dim=1)))
        centres.append(points[pick[best]])
        closest = candidate[best]
    return torch.stack(centres)


def _lloyd(points: Tensor, centres: Tensor, iters: int, tol: float) -> tuple[Tensor, float]:
    """Lloyd's iterations from ``centres``; ``(labels [n], inertia)``. An emptied cluster keeps its centre."""
    labels = torch.cdist(points, centres).argmin(dim=1)
    for _ in range(iters):
        sums = torch.zeros_like(centres).index_add_(0, labels, points)
        counts = torch.bincount(labels, minlength=len(centres)).to(points.dtype)
        moved = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], centres)
        shift = float(((moved - centres) ** 2).sum())
        centres = moved
        new = torch.cdist(points, centres).argmin(dim=1)
        if torch.equal(new, labels) or shift <= tol:
            labels = new
            break
        labels = new
    inertia = float(((points - centres[labels]) ** 2).sum())
    return labels, inertia


def kmeans(points: Tensor, k: int, *, n_init: int = 3, iters: int = 300, tol: float = 1e-4, seed: int = 0) -> Tensor:
    """Cluster ``points`` [N, d] into ``k`` groups; int64 labels [N] on the CPU, the same for the same seed.

    ``tol`` is relative to the points' mean variance per column (as scikit-learn's); the result is
    the start with the lowest inertia (sum of squared distances to the centres), the earliest on a tie.

    Example:
        >>> import torch
        >>> from camkit.audit.strategies.kmeans import kmeans
        >>> pts = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0], [5.0, 5.1]])
        >>> labels = kmeans(pts, 2)
        >>> labels[0] == labels[1] != labels[2] == labels[3] == labels[4]
        tensor(True)
    """
    if k < 1 or k > len(points):
        raise InvalidInputError(f"k-means needs 1 <= k <= {len(points)} points, got k={k}")
    x = points.detach().to("cpu", torch.float64)
    gen = torch.Generator().manual_seed(int(seed))
    scaled_tol = tol * float(x.var(dim=0, unbiased=False).mean()) if len(x) > 1 else 0.0
    best, least = _lloyd(x, _plus_plus(x, k, gen), iters, scaled_tol)
    for _ in range(1, n_init):
        labels, inertia = _lloyd(x, _plus_plus(x, k, gen), iters, scaled_tol)
        if inertia < least:
            best, least = labels, inertia
    return best
