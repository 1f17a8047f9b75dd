"""Pure tensor math for the forward-only methods: Score-CAM masks, Eigen-CAM projections,
occlusion windows and RISE masks.

No hooks, no state, no host syncs. Shapes are stated per function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InvalidInputError
from .maps import normalize_maps, upsample_maps

__all__ = [
    "channel_masks",
    "eigen_projection",
    "occlusion_map",
    "rise_masks",
    "unique_rows",
    "window_indicators",
]


def channel_masks(acts: Tensor, size: tuple[int, int]) -> Tensor:
    """Score-CAM masks: each activation map upsampled to ``size`` and min-max normalised.

    Args:
        acts: activation maps [..., h, w] (for example one row per channel, [N, h, w]).
        size: the input's ``(H, W)``.

    Returns:
        Masks [..., H, W] in [0, 1] in the dtype of ``acts``; a constant map gives a zero mask.

    Example:
        >>> import torch
        >>> from camkit.functional.perturbation import channel_masks
        >>> channel_masks(torch.tensor([[[1.0, 3.0]], [[2.0, 2.0]]]), (1, 2)).tolist()
        [[[0.0, 1.0]], [[0.0, 0.0]]]
    """
    return normalize_maps(upsample_maps(acts, size))[0]


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


def eigen_projection(acts: Tensor, *, exact: bool = True) -> Tensor:
    """Eigen-CAM (Muhammad & Yeasin 2020): the projection on the first principal component.

    Each sample's activations [C, h, w] are read as h*w points in C dimensions, centred
    over the positions, and projected on their first principal direction. The sign of a
    principal component is arbitrary; it is fixed so that the projection correlates
    positively with the channel-summed activation map (ties: a positive sum of the
    direction). No ReLU here: the explainers apply it.

    Args:
        acts: [B, C, h, w] (float32 recommended).
        exact: ``True``: a batched SVD. ``False``: the top eigenvector of the positions' Gram
            matrix by repeated squaring, matrix products only; the SVD reads its status
            back to the host on a GPU (a sync per call), this does not. Both give the same
            projection (up to float rounding) unless the two leading components are within
            a fraction of a percent of each other, where the component itself is ill-defined.

    Returns:
        [B, h, w]; zeros where the activations do not vary over positions.

    Example:
        >>> import torch
        >>> from camkit.functional.perturbation import eigen_projection
        >>> a = torch.tensor([[[[0.0, 1.0, 2.0]], [[0.0, 2.0, 4.0]]]])  # channel 2 = 2 * channel 1
        >>> torch.round(eigen_projection(a) * 1e4) / 1e4
        tensor([[[-2.2361,  0.0000,  2.2361]]])
        >>> torch.round(eigen_projection(a, exact=False) * 1e4) / 1e4 + 0.0  # + 0.0: no "-0.0000"
        tensor([[[-2.2361,  0.0000,  2.2361]]])
    """
    if acts.dim() != 4:
        raise InvalidInputError(f"activations must be [B, C, H, W], got shape {list(acts.shape)}")
    b, c, h, w = acts.shape
    points = acts.reshape(b, c, h * w).transpose(1, 2)  # [B, hw, C]
    centred = points - points.mean(dim=1, keepdim=True)
    if exact:
        _, _, vh = torch.linalg.svd(centred, full_matrices=False)
        projection = torch.einsum("bpc,bc->bp", centred, vh[:, 0, :])
        sums = vh[:, 0, :].sum(dim=1)
    else:
        projection = _top_projection(centred)
        sums = torch.ones_like(projection[:, 0])
    total = points.sum(dim=2)
    agreement = (projection * (total - total.mean(dim=1, keepdim=True))).sum(dim=1)
    agreement = torch.where(agreement == 0, sums, agreement)
    sign = torch.where(agreement < 0, -torch.ones_like(agreement), torch.ones_like(agreement))
    return (projection * sign[:, None]).reshape(b, h, w)


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


def occlusion_map(drops: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """Average the score drops of the windows covering each pixel.

    Args:
        drops: [B, Pr, Pc] or [B, K, Pr, Pc], the score change for each window position.
        rows: [Pr, H] row indicators; cols: [Pc, W] column indicators (:func:`window_indicators`).

    Returns:
        [B, H, W] (or [B, K, H, W]).

    Example:
        >>> import torch
        >>> from camkit.functional.perturbation import occlusion_map, window_indicators
        >>> ind = window_indicators(3, 2, 1)
        >>> occlusion_map(torch.tensor([[[4.0, 0.0], [0.0, 0.0]]]), ind, ind)
        tensor([[[4., 2., 0.],
                 [2., 1., 0.],
                 [0., 0., 0.]]])
    """
    rows, cols = rows.to(drops), cols.to(drops)
    total = torch.einsum("rh,...rs,sw->...hw", rows, drops, cols)
    count = rows.sum(dim=0)[:, None] * cols.sum(dim=0)[None, :]
    return total / count


def rise_masks(grids: Tensor, shifts: Tensor, size: tuple[int, int]) -> Tensor:
    """RISE masks (Petsiuk et al. 2018): small grids upsampled bilinearly, then shifted and cropped.

    Each grid [s, s] covers ``size`` with cells of ``ceil(H / s) x ceil(W / s)`` pixels; it is
    upsampled to ``(s + 1)`` cells per side and cropped to ``size`` at the given offset.

    Args:
        grids: [N, s, s] values in [0, 1] (binary in the paper).
        shifts: [N, 2] integer offsets (row, column), each in ``[0, cell)``.
        size: ``(H, W)``.

    Returns:
        [N, H, W] masks in the grids' dtype, on the grids' device.

    Example:
        >>> import torch
        >>> from camkit.functional.perturbation import rise_masks
        >>> rise_masks(torch.ones(2, 2, 2), torch.zeros(2, 2, dtype=torch.long), (4, 4)).shape
        torch.Size([2, 4, 4])
    """
    if grids.dim() != 3 or shifts.shape != (grids.shape[0], 2):
        raise InvalidInputError(
            f"grids must be [N, s, s] and shifts [N, 2], got {list(grids.shape)} and {list(shifts.shape)}"
        )
    n, s = grids.shape[0], grids.shape[1]
    height, width = size
    cell_h, cell_w = -(-height // s), -(-width // s)
    big = F.interpolate(grids[:, None], size=((s + 1) * cell_h, (s + 1) * cell_w), mode="bilinear", align_corners=False)
    shifts = shifts.to(grids.device, non_blocking=True)
    r = shifts[:, 0, None] + torch.arange(height, device=grids.device)[None, :]  # [N, H]
    c = shifts[:, 1, None] + torch.arange(width, device=grids.device)[None, :]  # [N, W]
    return big[:, 0][torch.arange(n, device=grids.device)[:, None, None], r[:, :, None], c[:, None, :]]
