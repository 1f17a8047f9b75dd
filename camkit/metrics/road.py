"""ROAD: RemOve And Debias (Rong et al. 2022), with noisy linear imputation.

Removing pixels by painting them a constant leaks the map's shape to the model (the hole
itself is a feature). ROAD instead fills each removed pixel with the weighted mean of its
neighbours, solved jointly for all removed pixels of an image, then adds Gaussian noise to
the filled pixels.

The weights sum to 1 over a position's neighbours (those outside the input are left out):

* an image's pixel: Rong et al.'s kernel, the eight pixels around it, 1/6 for the four
  edge neighbours and 1/12 for the four diagonal ones;
* a signal's sample: its two neighbours, 1/2 each;
* a volume's (or video's) voxel: its six face neighbours, 1/6 each. The 26 voxels of the
  3 x 3 x 3 block (diagonals at half weight, as on images) would make the sparse
  factorisation about five times slower (48^3 voxels, half removed: 25 s against 5 s on
  one CPU core). With the six, the filled voxels solve the usual 7-point discrete Laplace
  equation, as a signal's filled samples are its linear interpolation. A video's frame
  axis is one of the three: a removed position is filled from the frames before and after
  it too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from itertools import pairwise, product
from typing import Any

import torch
from torch import Tensor, nn

from .._internal.state import eval_mode
from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target
from ._common import ChunkScorer, check_images, check_maps, chunks, count_for_fraction, nan_maps, pixel_ranks

__all__ = ["noisy_linear_imputation", "road_curve"]


@functools.lru_cache(maxsize=3)
def _neighbours(spatial_dims: int) -> tuple[tuple[tuple[int, ...], float], ...]:
    """(offset per axis, weight) of each neighbour, in row-major order (see the module docstring).

    A neighbour steps by one along at most two axes on images (diagonals weigh half), along
    one axis otherwise. On images these are Rong et al.'s floats: 1/6 = 1.0 / 6.0 and
    1/12 = 0.5 / 6.0.
    """
    reach = 2 if spatial_dims == 2 else 1
    offsets = [o for o in product((-1, 0, 1), repeat=spatial_dims) if 0 < sum(map(abs, o)) <= reach]
    shares = [0.5 ** (sum(map(abs, offset)) - 1) for offset in offsets]
    total = sum(shares)
    return tuple((offset, share / total) for offset, share in zip(offsets, shares))


_DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def noisy_linear_imputation(
    x: Tensor, removed: Tensor, *, noise: float = 0.01, generator: torch.Generator | None = None
) -> Tensor:
    """Fill removed pixels from their neighbours, then add noise; never modifies ``x``.

    Each removed position ``i`` gets the value solving ``W_i * v_i = sum_j w_ij * v_j`` over
    its in-input neighbours ``j`` (removed neighbours are unknowns too; the weights are in
    the module docstring), per channel; then ``noise * N(0, 1)`` is added to it. The sparse
    systems of the whole batch are built at once with tensor ops (no loop over positions);
    then each input's system is factorised once (SciPy's SuperLU, on the CPU) and solved for
    all channels together. Kept positions are returned unchanged. On images the values
    match Rong et al.'s reference imputer. Signals, images and volumes go through the same
    code. A volume's factorisation grows fast with the number of removed voxels: roughly
    1 s for 16,000 and 5 s for 55,000 on one CPU core.

    Args:
        x: inputs [B, C, *S]: signals [B, C, T], images [B, C, H, W], volumes or videos
            [B, C, D, H, W].
        removed: bool [B, *S], True for positions to fill. An input may not lose every
            position (there would be nothing to fill from).
        noise: standard deviation of the added noise (0 for none).
        generator: a CPU ``torch.Generator`` for reproducible noise.

    Returns:
        Inputs [B, C, *S] like ``x``.

    Example:
        >>> import torch
        >>> from camkit.metrics import noisy_linear_imputation
        >>> x = torch.tensor([[[[0.0, 0.0, 0.0], [0.0, 9.0, 6.0], [0.0, 0.0, 12.0]]]])
        >>> removed = torch.zeros(1, 3, 3, dtype=torch.bool); removed[0, 1, 1] = True
        >>> noisy_linear_imputation(x, removed, noise=0.0)[0, 0, 1, 1]  # 6/6 + 12/12
        tensor(2.)
        >>> signal = torch.tensor([[[0.0, 0.0, 6.0]]])  # a signal [B, C, T]: the mean of its two neighbours
        >>> noisy_linear_imputation(signal, torch.tensor([[False, True, False]]), noise=0.0)
        tensor([[[0., 3., 6.]]])
    """
    from scipy.sparse import csc_matrix  # imported here: only ROAD needs SciPy
    from scipy.sparse.linalg import splu

    check_images(x)
    batch, channels, *spatial = x.shape
    mask = _removed_mask(removed, batch, spatial, noise)
    flat = mask.reshape(-1)
    unknown = flat.nonzero()[:, 0]  # global position index, b * H * W + row * W + col on images
    count = unknown.numel()
    if count == 0:
        return x.clone()
    channels_last = (0, *range(2, x.dim()), 1)
    values = x.detach().to("cpu", torch.float64).permute(channels_last).reshape(-1, channels)  # [B*N, C]
    (vals, rows, cols), rhs = _imputation_system(flat, unknown, values, spatial)
    system = csc_matrix((vals.numpy(), (rows.numpy(), cols.numpy())), shape=(count, count))
    solved = _solve_per_input(splu, system, rhs, mask)
    if noise > 0:
        solved = solved + noise * torch.randn(count, channels, generator=generator, dtype=torch.float64)
    out = x.detach().permute(channels_last).reshape(-1, channels).clone()
    out[unknown.to(x.device)] = solved.to(device=x.device, dtype=x.dtype)
    return out.view(batch, *spatial, channels).permute(0, x.dim() - 1, *range(1, x.dim() - 1)).contiguous()


def _removed_mask(removed: Tensor, batch: int, spatial: list[int], noise: float) -> Tensor:
    """The positions to fill, bool [B, *S] on the CPU, after checking them and the noise."""
    if not isinstance(removed, Tensor) or removed.dtype != torch.bool or removed.shape != (batch, *spatial):
        got = f"{removed.dtype} {list(removed.shape)}" if isinstance(removed, Tensor) else type(removed).__name__
        raise InvalidInputError(f"removed must be a bool tensor {[batch, *spatial]}, got {got}")
    if not noise >= 0:
        raise InvalidInputError(f"noise must be a standard deviation >= 0, got {noise!r}")
    mask = removed.detach().cpu()
    if bool(mask.flatten(1).all(dim=1).any()):
        raise InvalidInputError(
            "an image has every pixel removed, so there is nothing to impute from; remove a smaller fraction"
        )
    return mask


def _imputation_system(
    flat: Tensor, unknown: Tensor, values: Tensor, spatial: list[int]
) -> tuple[tuple[Tensor, Tensor, Tensor], Tensor]:
    """The sparse system over the removed positions of the whole batch, as (values, rows, columns) of its
    entries, and its right-hand sides [U, C]."""
    count, channels = unknown.numel(), values.shape[1]
    variable = torch.full((flat.numel(),), -1, dtype=torch.long)
    variable[unknown] = torch.arange(count)
    strides = [math.prod(spatial[axis + 1 :]) for axis in range(len(spatial))]
    coords = [(unknown // stride) % size for stride, size in zip(strides, spatial)]  # (row, col) on images
    diag = torch.zeros(count, dtype=torch.float64)
    rhs = torch.zeros(count, channels, dtype=torch.float64)
    eq = torch.arange(count)
    rows, cols, vals = [eq], [eq], [diag]  # diag is filled in below, in place
    for offset, weight in _neighbours(len(spatial)):
        inside = torch.ones_like(unknown, dtype=torch.bool)
        for coord, step, size in zip(coords, offset, spatial):
            if step:
                inside &= (coord + step >= 0) & (coord + step < size)
        here = eq[inside]
        there = unknown[inside] + sum(step * stride for step, stride in zip(offset, strides))
        diag.index_add_(0, here, torch.full((here.numel(),), weight, dtype=torch.float64))
        is_unknown = flat[there]
        rows.append(here[is_unknown])
        cols.append(variable[there[is_unknown]])
        vals.append(torch.full((rows[-1].numel(),), -weight, dtype=torch.float64))
        known = ~is_unknown
        rhs.index_add_(0, here[known], weight * values[there[known]])
    return (torch.cat(vals), torch.cat(rows), torch.cat(cols)), rhs


def _solve_per_input(splu: Callable[[Any], Any], system: Any, rhs: Tensor, mask: Tensor) -> Tensor:
    """The filled values [U, C]: each input's block of the system factorised once (``splu``) and solved for every channel."""
    count, channels = rhs.shape
    # One factorisation per image: the blocks are independent, and SuperLU's ordering of one
    # block-diagonal system fills in far more than the blocks factorised one by one.
    solved = torch.empty(count, channels, dtype=torch.float64)
    bounds = [0, *torch.cumsum(mask.flatten(1).sum(dim=1), 0).tolist()]
    for start, stop in pairwise(bounds):
        if stop > start:
            block = system[start:stop, start:stop].tocsc()
            solved[start:stop] = torch.from_numpy(splu(block).solve(rhs[start:stop].numpy()).reshape(-1, channels))
    return solved


def road_curve(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    fractions: Sequence[float] = _DEFAULT_FRACTIONS,
    order: str = "morf",
    noise: float = 0.01,
    softmax: bool = False,
    chunk_size: int = 32,
    generator: torch.Generator | None = None,
    output: OutputSelector = None,
    keep_mode: bool = False,
    hits: bool = False,
) -> tuple[Tensor, Tensor]:
    """The ROAD curve: the target's score as pixels are removed by noisy linear imputation.

    For each fraction ``f`` the ``ceil(f * N)`` most relevant pixels (``order="morf"``:
    most relevant first; a fast drop means a faithful map) or least relevant pixels
    (``order="lerf"``: the score should stay high) of the ``N`` positions (``T``, ``H * W``
    or ``D * H * W``: signals, images and volumes alike) are filled by
    :func:`noisy_linear_imputation` and the image is scored. The ranking is
    :func:`deletion_curve`'s (highest first, ties in row-major order; LeRF takes the same
    ranking from the bottom). Each chunk of ``chunk_size`` perturbed images is imputed (one
    sparse factorisation per image) and scored with one forward pass; the clean images are run only when
    ``target=None`` (to find the top-1 class). The noise draws follow the chunks, so with
    ``noise > 0`` results repeat exactly for the same ``generator`` seed and ``chunk_size``.

    Args:
        model, x, maps, target, softmax, chunk_size, output, keep_mode: as
            :func:`camkit.metrics.deletion_curve`.
        fractions: shares of pixels to remove, each in [0, 1), not removing every pixel.
        order: ``"morf"`` or ``"lerf"``.
        noise: standard deviation of the imputation noise (Rong et al. use 0.01 on
            normalised images).
        generator: CPU ``torch.Generator`` for reproducible noise.
        hits: record 1.0 where the imputed input's top-1 class is still the target class and
            0.0 elsewhere, instead of the score (Rong et al.'s accuracy curve; class targets only).

    Returns:
        ``(fractions, scores)``: fractions actually removed [F] (counts divided by N) and
        scores [B, F] on ``x``'s device; a map holding NaN gives a NaN row.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import road_curve
        >>> class Sum(nn.Module):
        ...     def forward(self, x):
        ...         return x.sum(dim=(1, 2, 3))[:, None]
        >>> x = torch.tensor([[[[3.0, 0.0, 0.0]]]])
        >>> fr, scores = road_curve(Sum(), x, x[:, 0], fractions=[1 / 3, 2 / 3], noise=0.0)
        >>> [round(v, 4) for v in fr.tolist()], scores.tolist()
        ([0.3333, 0.6667], [[0.0, 0.0]])
    """
    check_images(x)
    maps = check_maps(maps, x)
    counts = _removal_counts(maps, fractions, order)
    scorer = ChunkScorer(model, target, softmax=softmax, output=output, chunk_size=chunk_size)
    with torch.no_grad(), eval_mode(model, enabled=not keep_mode):
        curve = _imputed_curve(scorer, x, maps, counts, order, target is None, noise, generator, chunk_size, hits)
    removed_share = (torch.tensor(counts, dtype=torch.float64) / maps[0].numel()).to(device=x.device, dtype=curve.dtype)
    return removed_share, curve


def _removal_counts(maps: Tensor, fractions: Sequence[float], order: str) -> list[int]:
    """How many positions each fraction removes, after checking the order and the fractions."""
    if order not in ("morf", "lerf"):
        raise InvalidInputError(f"order must be 'morf' (most relevant first) or 'lerf', got {order!r}")
    n = maps[0].numel()
    fractions = [float(f) for f in fractions]
    if not fractions or any(not 0 <= f < 1 for f in fractions):
        raise InvalidInputError(f"fractions must be a non-empty list of shares in [0, 1), got {fractions}")
    counts = [count_for_fraction(f, n) for f in fractions]
    if max(counts) >= n:
        raise InvalidInputError(
            f"a fraction of {max(fractions)} removes all {n} pixels, leaving nothing to impute from; "
            "use smaller fractions"
        )
    return counts


def _imputed_curve(
    scorer: ChunkScorer, x: Tensor, maps: Tensor, counts: list[int], order: str, clean: bool, noise: float,
    generator: torch.Generator | None, chunk_size: int, hits: bool,
) -> Tensor:  # fmt: skip
    """Scores [B, F] of the inputs with each count of positions imputed, ``chunk_size`` inputs per pass."""
    batch, n = x.shape[0], maps[0].numel()
    ranks = pixel_ranks(maps).view(batch, *maps.shape[1:])
    if order == "lerf":
        ranks = n - 1 - ranks
    step_counts = torch.tensor(counts, device=x.device)
    if clean:  # the top-1 class of the clean image
        scorer.clean(x)
    else:  # the clean scores are not on the curve: skip that pass
        scorer.defer(batch)
    curve: Tensor | None = None
    for start, stop in chunks(batch * len(counts), chunk_size):
        pair = torch.arange(start, stop, device=x.device)
        owner, step = pair // len(counts), pair % len(counts)
        removed = ranks[owner] < step_counts[step].view(-1, *(1,) * (maps.dim() - 1))
        images = noisy_linear_imputation(x[owner], removed, noise=noise, generator=generator)
        scores = scorer.hits(images, owner) if hits else scorer.score(images, owner)
        if curve is None:
            curve = torch.empty(batch, len(counts), dtype=scores.dtype, device=x.device)
        curve[owner, step] = scores.to(curve.dtype)
    if curve is None:
        raise RuntimeError("no image was scored")  # unreachable: check_images requires B >= 1
    return torch.where(nan_maps(maps)[:, None], torch.full_like(curve, float("nan")), curve)
