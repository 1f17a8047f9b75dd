"""Seeded k-means on a few low-dimensional points (the rows of a spectral embedding), in torch.

The points k-means sees here are at most a few thousand rows of at most ``max_clusters``
columns, so it runs on the CPU whatever the device of the rest: the whole problem is a few
hundred kilobytes, and each Lloyd step on a GPU would be a handful of kernel launches and a
host sync. Greedy k-means++ seeding (each new centre the best of ``2 + log k`` draws), then
Lloyd's iterations; the best of ``n_init`` seeded starts by inertia. The starts are seeded one
after the other (the same draws as one at a time) and then iterated together, as one batch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...errors import InvalidInputError

__all__ = ["kmeans"]


def _squared(points: Tensor, centres: Tensor) -> Tensor:
    """Squared Euclidean distances [..., n, k] from ``points`` [n, d] to ``centres`` [..., k, d], up to a per-row constant.

    Each row lacks its point's squared norm (the same for every centre), so the nearest centre is its argmin.
    """
    return (centres * centres).sum(dim=-1)[..., None, :] - 2 * torch.matmul(points, centres.mT)


def _plus_plus(points: Tensor, k: int, gen: torch.Generator) -> Tensor:
    """Greedy k-means++ centres [k, d]: each next centre the draw (of ``2 + log k``) that lowers the potential most."""
    n = len(points)
    trials = 2 + int(math.log(k))
    first = int(torch.randint(n, (1,), generator=gen))
    chosen = [first]
    closest = ((points - points[first]) ** 2).sum(dim=1)
    for _ in range(1, k):
        total = float(closest.sum())
        if total <= 0:  # every point sits on a centre already: any point will do
            pick = torch.randint(n, (trials,), generator=gen)
        else:
            pick = torch.multinomial(closest / total, trials, replacement=True, generator=gen)
        candidate = torch.minimum(closest[None], torch.cdist(points[pick], points) ** 2)  # [trials, n]
        best = int(torch.argmin(candidate.sum(dim=1)))
        chosen.append(int(pick[best]))
        closest = candidate[best]
    return points[chosen]


def _lloyd(points: Tensor, centres: Tensor, iters: int, tol: float) -> tuple[Tensor, Tensor]:
    """Lloyd's iterations from each start's ``centres`` [S, k, d]; ``(labels [S, n], inertia [S])``.

    Each start stops on its own (its labels unchanged, or its centres moved at most ``tol``); the
    others go on without it. An emptied cluster keeps its centre.
    """
    starts, k, d = centres.shape
    labels = _squared(points, centres).argmin(dim=-1)
    running = torch.arange(starts)
    for _ in range(iters):
        if not len(running):
            break
        now, held = centres[running], labels[running]
        slots = (held + torch.arange(len(running))[:, None] * k).reshape(-1)
        sums = torch.zeros(len(running) * k, d, dtype=points.dtype).index_add_(0, slots, points.repeat(len(running), 1))
        counts = torch.bincount(slots, minlength=len(running) * k).to(points.dtype).view(-1, k, 1)
        moved = torch.where(counts > 0, sums.view(-1, k, d) / counts.clamp_min(1), now)
        shift = ((moved - now) ** 2).sum(dim=(1, 2))
        new = _squared(points, moved).argmin(dim=-1)
        centres[running], labels[running] = moved, new
        running = running[~((new == held).all(dim=1) | (shift <= tol))]
    inertia = ((points - centres.gather(1, labels[..., None].expand(-1, -1, d))) ** 2).sum(dim=(1, 2))
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
    starts = torch.stack([_plus_plus(x, k, gen) for _ in range(max(1, n_init))])
    labels, inertia = _lloyd(x, starts, iters, scaled_tol)
    return labels[int(torch.argmin(inertia))]
