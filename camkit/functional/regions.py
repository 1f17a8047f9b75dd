"""Pure math of the region (feature-mask) methods: region maps, coalitions and the
ablation, Shapley-sampling, KernelSHAP and LIME estimators.

A *region map* is an integer tensor [*S] (or [B, *S]) giving each position of an input
[B, C, *S] a region id, for a signal (``S = (T,)``), an image (``(H, W)``) or a volume or
clip (``(D, H, W)``). A *coalition* is a boolean row [M] over a sample's M regions: True
keeps the region's positions from the input, False replaces them with the baseline. No hooks, no model: the
explainers in :mod:`camkit.methods.perturbation.regions` evaluate the coalitions and call these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from ..errors import InvalidInputError

__all__ = [
    "ablation_coalitions",
    "coalition_masks",
    "exact_kernel_coalitions",
    "grid_regions",
    "kernel_shap_coalitions",
    "lime_kernel",
    "permutation_coalitions",
    "relabel_regions",
    "shapley_from_permutations",
    "shapley_permutations",
    "solve_kernel_shap",
    "superpixel_regions",
    "weighted_linear_fit",
]

Superpixels = Literal["slic", "quickshift", "felzenszwalb"]


def grid_regions(size: Sequence[int], cells: int | Sequence[int]) -> Tensor:
    """A grid of box regions covering an input of spatial ``size``, ``cells`` per axis.

    On each axis of length ``S`` cut in ``c`` cells, position ``i`` is in cell ``i * c // S``
    (cells differ by at most one position in length); the ids run in row-major order over
    the cells, ``(i * rows // H) * cols + (j * cols // W)`` on an image. A signal's cells are
    contiguous windows.

    Args:
        size: ``(T,)``, ``(H, W)`` or ``(D, H, W)``.
        cells: cells per axis, an int (every axis) or one per axis.

    Returns:
        Region ids [*size] (long), ``0 .. prod(cells) - 1``.

    Example:
        >>> from camkit.functional.regions import grid_regions
        >>> grid_regions((2, 4), (1, 2)).tolist()
        [[0, 0, 1, 1], [0, 0, 1, 1]]
        >>> grid_regions((6,), 3).tolist()  # a signal: three windows of two samples
        [0, 0, 1, 1, 2, 2]
    """
    size = tuple(int(n) for n in size)
    counts = (int(cells),) * len(size) if isinstance(cells, int) else tuple(int(c) for c in cells)
    if not 1 <= len(size) <= 3 or len(counts) != len(size) or not all(0 < c <= n for c, n in zip(counts, size)):
        raise InvalidInputError(
            f"need one cell count per axis with 1 <= cells <= size on every axis, got cells={cells} for size "
            f"{size}; use fewer cells"
        )
    ids = torch.zeros((), dtype=torch.long)
    for n, c in zip(size, counts):
        ids = ids[..., None] * c + torch.arange(n) * c // n
    return ids


def superpixel_regions(x: Tensor, method: Superpixels = "slic", **options: Any) -> Tensor:
    """Superpixel (supervoxel) region maps [B, *S] of a batch of images or volumes, with scikit-image.

    Each sample is min-max scaled to [0, 1] (so normalised inputs segment like photos), moved
    to the CPU once, and segmented by ``skimage.segmentation.slic`` (default
    ``n_segments=50, compactness=10``; images and volumes, e.g. ``spacing=(2.5, 1, 1)`` for
    anisotropic voxels), ``quickshift`` (RGB images only) or ``felzenszwalb`` (images only).

    Args:
        x: [B, C, H, W] or [B, C, D, H, W]. Signals [B, C, T] are refused: segment them in
            contiguous windows with :func:`grid_regions` (``regions="grid", cells=...``).
        method: the scikit-image algorithm.
        options: keyword arguments for it (e.g. ``n_segments=100``).

    Returns:
        Region ids [B, *S] (long) on ``x``'s device.

    Example:
        >>> import torch
        >>> from camkit.functional.regions import superpixel_regions
        >>> x = torch.zeros(1, 3, 32, 32)
        >>> x[..., 16:] = 1.0  # a dark left half, a bright right half
        >>> superpixel_regions(x, "slic", n_segments=4)[0, 0, ::4].tolist()
        [0, 0, 0, 0, 1, 1, 1, 1]
    """
    from skimage import segmentation

    if x.dim() == 3:
        raise InvalidInputError(
            f"superpixels segment images and volumes, not signals: got a signal batch [B, C, T] = {list(x.shape)}; "
            "use regions='grid' with cells=N for N contiguous windows, or pass region ids [T] or [B, T]"
        )
    if x.dim() not in (4, 5):
        raise InvalidInputError(
            f"superpixels need a batch [B, C, H, W] or [B, C, D, H, W], got shape {list(x.shape)}"
        )
    if x.dim() == 5 and method in ("quickshift", "felzenszwalb"):
        raise InvalidInputError(
            f"{method!r} segments 2-D images only, got a volume batch [B, C, D, H, W] = {list(x.shape)}; "
            "use regions='slic' (supervoxels) or regions='grid'"
        )
    images = x.detach().float().cpu()
    axes = tuple(range(1, x.dim()))
    low = images.amin(dim=axes, keepdim=True)
    high = images.amax(dim=axes, keepdim=True)
    scaled = ((images - low) / (high - low).clamp_min(1e-12)).movedim(1, -1).numpy().astype(np.float64)
    out = []
    for image in scaled:
        if method == "slic":
            kwargs = {"n_segments": 50, "compactness": 10.0, "start_label": 0, **options}
            labels = segmentation.slic(image, channel_axis=-1, **kwargs)
        elif method == "quickshift":
            if image.shape[-1] != 3:
                raise InvalidInputError(f"quickshift needs RGB images, got {image.shape[-1]} channels; use 'slic'")
            labels = segmentation.quickshift(image, **{"kernel_size": 3, "max_dist": 6, **options})
        elif method == "felzenszwalb":
            labels = segmentation.felzenszwalb(image, channel_axis=-1, **options)
        else:
            raise InvalidInputError(f"superpixels must be 'slic', 'quickshift' or 'felzenszwalb', got {method!r}")
        out.append(torch.from_numpy(np.ascontiguousarray(labels).astype(np.int64)))
    return torch.stack(out).to(x.device)


def relabel_regions(regions: Tensor) -> tuple[Tensor, list[int]]:
    """Renumber each sample's region ids to ``0 .. M_b - 1`` in increasing order of the old ids.

    Ids that label no position disappear, so every region of the result is non-empty.

    Args:
        regions: integer ids [B, *S] (one to three spatial axes).

    Returns:
        ``(ids, counts)``: the renumbered ids [B, *S] (long) and each sample's ``M_b``.

    Example:
        >>> import torch
        >>> from camkit.functional.regions import relabel_regions
        >>> ids, counts = relabel_regions(torch.tensor([[[7, 3], [3, 9]]]))
        >>> ids.tolist(), counts
        ([[[1, 0], [0, 2]]], [3])
    """
    if not 2 <= regions.dim() <= 4 or regions.is_floating_point() or regions.dtype == torch.bool:
        raise InvalidInputError(
            f"region ids must be an integer tensor [B, T], [B, H, W] or [B, D, H, W], got {regions.dtype} "
            f"{list(regions.shape)}"
        )
    ids, counts = [], []
    for sample in regions:
        values, inverse = torch.unique(sample, return_inverse=True)
        ids.append(inverse.long())
        counts.append(int(values.numel()))
    return torch.stack(ids), counts


def coalition_masks(regions: Tensor, keep: Tensor) -> Tensor:
    """Masks of coalitions: 1 where the position's region is kept, 0 where it is replaced.

    Args:
        regions: region ids [N, *S] (one map per row, e.g. ``ids[sample_of_row]``), any rank.
        keep: coalitions [N, M] (bool or 0/1), M at least the largest id plus one.

    Returns:
        Float masks [N, *S].

    Example:
        >>> import torch
        >>> from camkit.functional.regions import coalition_masks
        >>> coalition_masks(torch.tensor([[[0, 1, 1]]]), torch.tensor([[False, True]])).tolist()
        [[[0.0, 1.0, 1.0]]]
    """
    return keep.float().gather(1, regions.reshape(regions.shape[0], -1)).reshape(regions.shape)


def ablation_coalitions(m: int) -> Tensor:
    """Feature ablation's coalitions [M, M]: row ``r`` keeps every region but ``r``.

    Example:
        >>> from camkit.functional.regions import ablation_coalitions
        >>> ablation_coalitions(2).tolist()
        [[False, True], [True, False]]
    """
    return ~torch.eye(m, dtype=torch.bool)


def shapley_permutations(m: int, count: int, generator: torch.Generator) -> Tensor:
    """``count`` random orders [count, M] of M regions, drawn from ``generator``.

    Example:
        >>> import torch
        >>> from camkit.functional.regions import shapley_permutations
        >>> p = shapley_permutations(3, 2, torch.Generator().manual_seed(0))
        >>> sorted(p[0].tolist()), tuple(p.shape)
        ([0, 1, 2], (2, 3))
    """
    return torch.rand(count, m, generator=generator).argsort(dim=1)


def permutation_coalitions(perms: Tensor) -> Tensor:
    """The prefixes of each order: [count * (M + 1), M], row ``p * (M + 1) + t`` keeps ``perms[p, :t]``.

    Example:
        >>> import torch
        >>> from camkit.functional.regions import permutation_coalitions
        >>> permutation_coalitions(torch.tensor([[1, 0]])).tolist()
        [[False, False], [False, True], [True, True]]
    """
    count, m = perms.shape
    rank = perms.argsort(dim=1)  # rank[p, f]: position of feature f in order p
    steps = torch.arange(m + 1)[None, :, None]
    return (rank[:, None, :] < steps).reshape(count * (m + 1), m)


def shapley_from_permutations(perms: Tensor, values: Tensor) -> Tensor:
    """Shapley value estimates from the scores of every prefix of every order.

    Feature ``perms[p, t]`` gets ``values[p, t + 1] - values[p, t]`` (its marginal
    contribution when added after ``perms[p, :t]``); the estimate is the mean over orders.
    Each order's contributions telescope, so the estimates sum exactly to
    ``values[:, M] - values[:, 0]`` (the full minus the empty coalition's score).

    Args:
        perms: [P, M] orders.
        values: [P, M + 1, K] scores of the prefixes (:func:`permutation_coalitions` order).

    Returns:
        [M, K].

    Example:
        >>> import torch
        >>> from camkit.functional.regions import shapley_from_permutations
        >>> v = torch.tensor([[[0.0], [1.0], [3.0]], [[0.0], [2.0], [3.0]]])  # orders (0, 1) and (1, 0)
        >>> shapley_from_permutations(torch.tensor([[0, 1], [1, 0]]), v)[:, 0].tolist()
        [1.0, 2.0]
    """
    count, m = perms.shape
    gains = values[:, 1:] - values[:, :-1]  # [P, M, K]
    out = torch.zeros(m, values.shape[-1], dtype=values.dtype, device=values.device)
    out.index_add_(0, perms.reshape(-1).to(values.device), gains.reshape(count * m, -1))
    return out / count


def _kernel(m: int, size: Tensor) -> Tensor:
    """The Shapley kernel ``(M - 1) / (C(M, s) s (M - s))`` of coalitions of ``size`` (float64)."""
    size = size.double()
    log_binom = torch.lgamma(torch.tensor(m + 1.0, dtype=torch.float64)) - torch.lgamma(size + 1) - torch.lgamma(m - size + 1)
    return (m - 1) / (torch.exp(log_binom) * size * (m - size))


def kernel_shap_coalitions(m: int, count: int, generator: torch.Generator) -> Tensor:
    """``count`` random coalitions [count, M] for KernelSHAP (Lundberg & Lee 2017), M >= 2.

    A size ``s`` in ``1 .. M - 1`` is drawn with probability proportional to
    ``(M - 1) / (s (M - s))``, then a subset of that size uniformly: each coalition is drawn
    with probability proportional to its Shapley kernel weight, so the regression weights
    are all 1 (repeats count as often as they are drawn).

    Example:
        >>> import torch
        >>> from camkit.functional.regions import kernel_shap_coalitions
        >>> z = kernel_shap_coalitions(4, 100, torch.Generator().manual_seed(0))
        >>> tuple(z.shape), bool(((z.sum(1) >= 1) & (z.sum(1) <= 3)).all())
        ((100, 4), True)
    """
    if m < 2:
        raise InvalidInputError(f"KernelSHAP coalitions need at least 2 regions, got {m}")
    sizes = torch.arange(1, m, dtype=torch.float64)
    weights = (m - 1) / (sizes * (m - sizes))
    drawn = torch.multinomial(weights, count, replacement=True, generator=generator) + 1  # [count]
    rank = torch.rand(count, m, generator=generator).argsort(dim=1).argsort(dim=1)
    return rank < drawn[:, None]


def exact_kernel_coalitions(m: int) -> tuple[Tensor, Tensor]:
    """Every coalition of size ``1 .. M - 1`` [2^M - 2, M] with its Shapley kernel weight [2^M - 2].

    With these, the KernelSHAP regression (:func:`solve_kernel_shap`) gives the exact
    Shapley values.

    Example:
        >>> from camkit.functional.regions import exact_kernel_coalitions
        >>> z, w = exact_kernel_coalitions(3)
        >>> z.sum(1).tolist(), [round(v, 4) for v in w.tolist()]
        ([1, 1, 2, 1, 2, 2], [0.3333, 0.3333, 0.3333, 0.3333, 0.3333, 0.3333])
    """
    codes = torch.arange(1, 2**m - 1)
    z = (codes[:, None] >> torch.arange(m)[None, :]) & 1
    return z.bool(), _kernel(m, z.sum(dim=1))


def solve_kernel_shap(z: Tensor, y: Tensor, weights: Tensor, full: Tensor, empty: Tensor) -> Tensor:
    """KernelSHAP's weighted least squares under the efficiency constraint.

    Minimises ``sum_i w_i (y_i - empty - z_i . phi)^2`` subject to ``sum(phi) = full - empty``
    (the constraint replaces the infinite weights of the empty and full coalitions):
    the last region's value is eliminated and the rest solved with a pseudo-inverse in
    float64 (minimum-norm when the samples do not determine them).

    Args:
        z: coalitions [N, M]; y: their scores [N, K]; weights: [N] (non-negative).
        full, empty: scores [K] of the full and the empty coalition.

    Returns:
        phi [M, K] (float64), summing exactly to ``full - empty``.

    Example:
        >>> import torch
        >>> from camkit.functional.regions import exact_kernel_coalitions, solve_kernel_shap
        >>> z, w = exact_kernel_coalitions(2)  # v(S) = 3 [0 in S] + 1 [1 in S]: Shapley (3, 1)
        >>> y = (z.double() @ torch.tensor([3.0, 1.0], dtype=torch.float64))[:, None]
        >>> phi = solve_kernel_shap(z, y, w, torch.tensor([4.0]), torch.tensor([0.0]))
        >>> [round(v, 6) for v in phi[:, 0].tolist()]
        [3.0, 1.0]
    """
    z, y = z.double(), y.double()
    full, empty = full.double().reshape(-1), empty.double().reshape(-1)
    delta = full - empty  # [K]
    m = z.shape[1]
    if m == 1:
        return delta[None, :].clone()
    root = weights.double().clamp_min(0).sqrt()[:, None]
    a = (z[:, :-1] - z[:, -1:]) * root
    b = (y - empty[None, :] - z[:, -1:] * delta[None, :]) * root
    head = torch.linalg.pinv(a) @ b  # [M - 1, K]
    return torch.cat([head, (delta - head.sum(dim=0))[None, :]])


def lime_kernel(z: Tensor, width: float) -> Tensor:
    """LIME's sample weights: ``exp(-d^2 / (2 width^2))`` with ``d`` the cosine distance of the
    coalition to the full one (all regions kept): ``d = 1 - sqrt(s / M)`` for ``s`` regions
    kept (``d = 1`` for the empty coalition).

    Example:
        >>> import torch
        >>> from camkit.functional.regions import lime_kernel
        >>> [round(v, 4) for v in lime_kernel(torch.tensor([[1, 1], [1, 0], [0, 0]]), 0.5).tolist()]
        [1.0, 0.8423, 0.1353]
    """
    m = z.shape[1]
    distance = 1.0 - (z.double().sum(dim=1) / m).sqrt()
    return torch.exp(-(distance**2) / (2.0 * width**2))


def weighted_linear_fit(z: Tensor, y: Tensor, weights: Tensor, alpha: float = 0.0) -> tuple[Tensor, Tensor]:
    """Weighted (ridge) linear regression with an intercept, in float64.

    Minimises ``sum_i w_i (y_i - b - z_i . c)^2 + alpha |c|^2`` (the intercept is not
    penalised); solved with a pseudo-inverse (minimum norm when under-determined).

    Args:
        z: [N, M]; y: [N, K]; weights: [N]; alpha: ridge penalty (>= 0).

    Returns:
        ``(coef [M, K], intercept [K])``.

    Example:
        >>> import torch
        >>> from camkit.functional.regions import weighted_linear_fit
        >>> z = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> coef, b = weighted_linear_fit(z, (z @ torch.tensor([2.0, -1.0]) + 0.5)[:, None], torch.ones(4))
        >>> [round(v, 6) for v in coef[:, 0].tolist()], round(b.item(), 6)
        ([2.0, -1.0], 0.5)
    """
    if alpha < 0 or not math.isfinite(alpha):
        raise InvalidInputError(f"alpha must be a finite number >= 0, got {alpha}")
    z, y, w = z.double(), y.double(), weights.double()[:, None]
    total = w.sum().clamp_min(1e-300)
    z_mean = (w * z).sum(dim=0) / total
    y_mean = (w * y).sum(dim=0) / total
    zc, yc = z - z_mean, y - y_mean
    gram = zc.T @ (w * zc) + alpha * torch.eye(z.shape[1], dtype=z.dtype, device=z.device)
    coef = torch.linalg.pinv(gram) @ (zc.T @ (w * yc))
    return coef, y_mean - z_mean @ coef
