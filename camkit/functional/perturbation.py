"""Pure tensor math for the forward-only methods: Score-CAM masks, Eigen-CAM projections,
occlusion windows and RISE masks.

No hooks, no state, no host syncs. Shapes are stated per function.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InvalidInputError
from .maps import interpolation_mode, normalize_maps, upsample_maps

__all__ = [
    "channel_masks",
    "default_window",
    "eigen_projection",
    "occlusion_map",
    "rise_masks",
    "unique_rows",
    "window_indicators",
]


def channel_masks(acts: Tensor, size: tuple[int, ...]) -> Tensor:
    """Score-CAM masks: each activation map upsampled to ``size`` and min-max normalised.

    Args:
        acts: activation maps [..., *s] (for example one row per channel, [N, h, w]).
        size: the input's spatial size, ``(T,)``, ``(H, W)`` or ``(D, H, W)``; the maps have
            as many trailing spatial axes.

    Returns:
        Masks [..., *size] in [0, 1] in the dtype of ``acts``; a constant map gives a zero mask.

    Example:
        >>> import torch
        >>> from camkit.functional.perturbation import channel_masks
        >>> channel_masks(torch.tensor([[[1.0, 3.0]], [[2.0, 2.0]]]), (1, 2)).tolist()
        [[[0.0, 1.0]], [[0.0, 0.0]]]
    """
    return normalize_maps(upsample_maps(acts, size), spatial_dims=len(size))[0]


def unique_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """Find identical rows of a 2-D tensor [N, D].

    Returns:
        ``(first, inverse)``: ``first`` [U] holds, for each distinct row, the index of its
        first occurrence (ascending), and ``inverse`` [N] maps every row to its position in
        ``first``, so ``rows[first][inverse]`` equals ``rows``.

    Example:
        >>> import torch
        >>> from camkit.functional.perturbation import unique_rows
        >>> first, inverse = unique_rows(torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 1.0]]))
        >>> first.tolist(), inverse.tolist()
        ([0, 1], [0, 1, 0])
    """
    if rows.dim() != 2:
        raise InvalidInputError(f"rows must be 2-D [N, D], got shape {list(rows.shape)}")
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    count = int(inverse.max()) + 1 if inverse.numel() else 0
    order = torch.arange(rows.shape[0], device=rows.device)
    first_by_sorted = torch.full((count,), rows.shape[0], dtype=torch.long, device=rows.device)
    first_by_sorted.scatter_reduce_(0, inverse, order, reduce="amin")
    # Renumber the distinct rows by first occurrence, so the result does not depend on sort order.
    first, rank = torch.sort(first_by_sorted)
    position = torch.empty_like(rank)
    position[rank] = torch.arange(count, device=rows.device)
    return first, position[inverse]


def eigen_projection(acts: Tensor, *, exact: bool = True, sign: str = "correlation") -> Tensor:
    """Eigen-CAM (Muhammad & Yeasin 2020): the projection on the first principal component.

    Each sample's activations [C, *s] are read as prod(s) points in C dimensions, centred
    over the positions, and projected on their first principal direction. The sign of a
    principal component is arbitrary; it is fixed so that the projection correlates
    positively with the channel-summed activation map (ties: a positive sum of the
    direction). No ReLU here: the explainers apply it.

    Args:
        acts: [B, C, *s] with one to three spatial axes (float32 recommended).
        sign: how the arbitrary sign of the component is fixed. ``"correlation"`` (Eigen-CAM):
            the projection correlates positively with the channel-summed activations.
            ``"extremes"`` (Seg-Eigen-CAM, eq. 13): the projection is flipped when its
            minimum is larger in magnitude than its maximum, so the larger extreme is positive.
        exact: ``True``: a batched SVD. ``False``: the top eigenvector of the positions' Gram
            matrix by repeated squaring, matrix products only; the SVD reads its status
            back to the host on a GPU (a sync per call), this does not. Both give the same
            projection (up to float rounding) unless the two leading components are within
            a fraction of a percent of each other, where the component itself is ill-defined.

    Returns:
        [B, *s]; zeros where the activations do not vary over positions.

    Example:
        >>> import torch
        >>> from camkit.functional.perturbation import eigen_projection
        >>> a = torch.tensor([[[[0.0, 1.0, 2.0]], [[0.0, 2.0, 4.0]]]])  # channel 2 = 2 * channel 1
        >>> torch.round(eigen_projection(a) * 1e4) / 1e4
        tensor([[[-2.2361,  0.0000,  2.2361]]])
        >>> torch.round(eigen_projection(a, exact=False) * 1e4) / 1e4 + 0.0  # + 0.0: no "-0.0000"
        tensor([[[-2.2361,  0.0000,  2.2361]]])
        >>> b = torch.tensor([[[[0.0, 0.0, 3.0]], [[0.0, 0.0, 3.0]]]])  # one bright position
        >>> torch.round(eigen_projection(b, sign="extremes") * 1e4) / 1e4 + 0.0
        tensor([[[-1.4142, -1.4142,  2.8284]]])
    """
    if sign not in ("correlation", "extremes"):
        raise InvalidInputError(f"sign must be 'correlation' or 'extremes', got {sign!r}")
    if not 3 <= acts.dim() <= 5:
        raise InvalidInputError(
            f"activations must be [B, C, t], [B, C, h, w] or [B, C, d, h, w], got shape {list(acts.shape)}"
        )
    b, c, *grid = acts.shape
    points = acts.reshape(b, c, -1).transpose(1, 2)  # [B, positions, C]
    centred = points - points.mean(dim=1, keepdim=True)
    if exact:
        _, _, vh = torch.linalg.svd(centred, full_matrices=False)
        projection = torch.einsum("bpc,bc->bp", centred, vh[:, 0, :])
        sums = vh[:, 0, :].sum(dim=1)
    else:
        projection = _top_projection(centred)
        sums = torch.ones_like(projection[:, 0])
    if sign == "extremes":
        flip = projection.amin(dim=1).abs() > projection.amax(dim=1).abs()
        return torch.where(flip[:, None], -projection, projection).reshape(b, *grid)
    total = points.sum(dim=2)
    agreement = (projection * (total - total.mean(dim=1, keepdim=True))).sum(dim=1)
    agreement = torch.where(agreement == 0, sums, agreement)
    factor = torch.where(agreement < 0, -torch.ones_like(agreement), torch.ones_like(agreement))
    return (projection * factor[:, None]).reshape(b, *grid)


_SQUARINGS = 14  # the second component shrinks like (l2 / l1) ** (2 ** 14) against the first


def _top_projection(centred: Tensor) -> Tensor:
    # The projection X v1 on the first principal direction equals sigma1 * u1, with u1 the top
    # eigenvector of the Gram matrix G = X X^T [hw, hw]. Repeated squaring of G (normalised each
    # time) converges to u1 u1^T; one power step with G itself then refines u1, and
    # sigma1 = |G u1| / |u1|... written with matrix products and reductions only, so no value
    # has to come back to the host.
    gram = centred @ centred.transpose(1, 2)  # [B, P, P], symmetric PSD
    tiny = torch.finfo(gram.dtype).tiny
    power = gram / gram.flatten(1).norm(dim=1).clamp_min(tiny)[:, None, None]
    for _ in range(_SQUARINGS):
        power = power @ power
        power = power / power.flatten(1).norm(dim=1).clamp_min(tiny)[:, None, None]
    # The column of the converged rank-one matrix with the largest diagonal entry is along u1.
    column = power.diagonal(dim1=1, dim2=2).argmax(dim=1)
    u = power.gather(2, column[:, None, None].expand(-1, power.shape[1], 1))[..., 0]  # [B, P]
    for _ in range(2):
        u = torch.einsum("bpq,bq->bp", gram, u)
        u = u / u.norm(dim=1, keepdim=True).clamp_min(tiny)
    sigma = torch.einsum("bp,bpq,bq->b", u, gram, u).clamp_min(0).sqrt()
    return u * sigma[:, None]


def window_indicators(length: int, window: int, stride: int) -> Tensor:
    """Where sliding windows sit along one axis, as a float indicator [P, length].

    Windows start at ``0, stride, 2 * stride, ...``; when the last one stops short of the
    end, one more window is placed flush with the end, so every position is covered.

    Example:
        >>> from camkit.functional.perturbation import window_indicators
        >>> window_indicators(5, 2, 2).tolist()
        [[1.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0, 1.0]]
    """
    if not 0 < window <= length or stride <= 0:
        raise InvalidInputError(
            f"need 0 < window <= {length} and stride > 0, got window={window}, stride={stride}; "
            "choose a window no larger than the input"
        )
    starts = list(range(0, length - window + 1, stride))
    if starts[-1] != length - window:
        starts.append(length - window)
    start = torch.tensor(starts)[:, None]
    pos = torch.arange(length)[None, :]
    return ((pos >= start) & (pos < start + window)).float()


def default_window(size: Sequence[int]) -> tuple[int, ...]:
    """Occlusion's default window for an input of spatial ``size``, one entry per axis.

    * an image ``(H, W)``: 16 x 16 pixels whatever its size (27 x 27 = 729 windows at
      224 x 224 with the default stride of half a window);
    * a signal ``(T,)``: ``ceil(T / 32)`` samples, about 63 windows along the signal;
    * a volume or clip ``(D, H, W)``: ``ceil(S / 4)`` on each axis, about 7 windows per
      axis (7 ** 3 = 343 forwards), since every forward of a 3-D model is costly.

    Example:
        >>> from camkit.functional.perturbation import default_window
        >>> default_window((224, 224)), default_window((1000,)), default_window((16, 112, 112))
        ((16, 16), (32,), (4, 28, 28))
    """
    if len(size) == 2:
        return (16, 16)
    parts = 32 if len(size) == 1 else 4
    return tuple(max(1, -(-int(n) // parts)) for n in size)


# Einsum labels of the window positions and of the input's axes (the last ones for fewer
# axes): an image reads "rh,...rs,sw->...hw", as it always has.
_POSITIONS, _AXES = "qrs", "dhw"


def occlusion_map(drops: Tensor, *indicators: Tensor) -> Tensor:
    """Average the score drops of the windows covering each position of the input.

    Args:
        drops: [B, *P] or [B, K, *P], the score change of each window position, with one
            axis of positions per spatial axis: ``P`` is ``(Pt,)``, ``(Pr, Pc)`` or ``(Pd, Pr, Pc)``.
        indicators: one window indicator [P_i, S_i] per spatial axis, in the input's axis
            order (:func:`window_indicators`).

    Returns:
        [B, *S] (or [B, K, *S]): each position's mean drop over the windows covering it.

    Example:
        >>> import torch
        >>> from camkit.functional.perturbation import occlusion_map, window_indicators
        >>> ind = window_indicators(3, 2, 1)
        >>> occlusion_map(torch.tensor([[[4.0, 0.0], [0.0, 0.0]]]), ind, ind)
        tensor([[[4., 2., 0.],
                 [2., 1., 0.],
                 [0., 0., 0.]]])
        >>> occlusion_map(torch.tensor([[6.0, 0.0]]), ind)  # a signal: windows [0, 1] and [1, 2]
        tensor([[6., 3., 0.]])
    """
    n = len(indicators)
    positions = tuple(ind.shape[0] for ind in indicators)
    if not 1 <= n <= 3 or drops.dim() not in (n + 1, n + 2) or tuple(drops.shape[drops.dim() - n :]) != positions:
        raise InvalidInputError(
            f"drops must be [B, *P] or [B, K, *P] with P = {list(positions)} (one axis per indicator, 1 to 3), "
            f"got shape {list(drops.shape)}"
        )
    inds = [ind.to(drops) for ind in indicators]
    pos, axes = _POSITIONS[3 - n :], _AXES[3 - n :]
    terms = [p + a for p, a in zip(pos, axes)]
    spec = ",".join([terms[0], "..." + pos, *terms[1:]]) + "->..." + axes
    total = torch.einsum(spec, inds[0], drops, *inds[1:])
    count = inds[0].sum(dim=0)
    for ind in inds[1:]:
        count = count[..., None] * ind.sum(dim=0)
    return total / count


def rise_masks(grids: Tensor, shifts: Tensor, size: Sequence[int]) -> Tensor:
    """RISE masks (Petsiuk et al. 2018): small grids upsampled smoothly, then shifted and cropped.

    On each spatial axis, a grid of ``g`` cells covers a length ``S`` with cells of
    ``ceil(S / g)`` positions; it is upsampled (linear, bilinear or trilinear by rank,
    ``align_corners=False``) to ``g + 1`` cells and cropped to ``S`` from its offset on
    that axis.

    Args:
        grids: [N, *g] values in [0, 1] (binary in the paper), one axis per spatial axis
            (``[N, g]``, ``[N, gh, gw]`` or ``[N, gd, gh, gw]``).
        shifts: [N, n] integer offsets, one per spatial axis (row, column for an image),
            each in ``[0, cell)`` of its axis.
        size: the input's spatial size, ``(T,)``, ``(H, W)`` or ``(D, H, W)``.

    Returns:
        [N, *size] masks in the grids' dtype, on the grids' device.

    Example:
        >>> import torch
        >>> from camkit.functional.perturbation import rise_masks
        >>> rise_masks(torch.ones(2, 2, 2), torch.zeros(2, 2, dtype=torch.long), (4, 4)).shape
        torch.Size([2, 4, 4])
        >>> rise_masks(torch.tensor([[1.0, 0.0]]), torch.tensor([[1]]), (4,))  # a signal, shifted by 1
        tensor([[1.0000, 0.6667, 0.3333, 0.0000]])
    """
    n = len(size)
    if not 1 <= n <= 3 or grids.dim() != n + 1 or tuple(shifts.shape) != (grids.shape[0], n):
        raise InvalidInputError(
            f"for an input of spatial size {list(size)}, grids must be [N, *g] and shifts [N, {n}] "
            f"(one axis each per spatial axis), got {list(grids.shape)} and {list(shifts.shape)}"
        )
    count, cells = grids.shape[0], tuple(grids.shape[1:])
    cell = [-(-int(length) // g) for length, g in zip(size, cells)]
    upsampled = tuple((g + 1) * c for g, c in zip(cells, cell))
    big = F.interpolate(grids[:, None], size=upsampled, mode=interpolation_mode(n), align_corners=False)[:, 0]
    shifts = shifts.to(grids.device, non_blocking=True)
    index = [torch.arange(count, device=grids.device).view(count, *(1,) * n)]
    for axis, length in enumerate(size):
        shape = [count] + [1] * n
        shape[axis + 1] = int(length)
        index.append((shifts[:, axis, None] + torch.arange(int(length), device=grids.device)[None, :]).view(shape))
    return big[tuple(index)]
