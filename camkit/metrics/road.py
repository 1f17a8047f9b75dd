"""ROAD: RemOve And Debias (Rong et al. 2022), with noisy linear imputation.

Removing pixels by painting them a constant leaks the map's shape to the model (the hole
itself is a feature). ROAD instead fills each removed pixel with the weighted mean of its
eight neighbours (weight 1/6 for the four edge neighbours, 1/12 for the four diagonal ones,
neighbours outside the image left out), solved jointly for all removed pixels of an image,
then adds Gaussian noise to the filled pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch
from torch import Tensor, nn

from .._internal.state import eval_mode
from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target
from ._common import ChunkScorer, check_images, check_maps, chunks, count_for_fraction, nan_maps, pixel_ranks

__all__ = ["noisy_linear_imputation", "road_curve"]

# (row offset, column offset, weight), as in Rong et al.'s reference imputer.
_NEIGHBOURS = (
    (-1, -1, 1 / 12), (-1, 0, 1 / 6), (-1, 1, 1 / 12),
    (0, -1, 1 / 6), (0, 1, 1 / 6),
    (1, -1, 1 / 12), (1, 0, 1 / 6), (1, 1, 1 / 12),
)  # fmt: skip

_DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def noisy_linear_imputation(
    x: Tensor, removed: Tensor, *, noise: float = 0.01, generator: torch.Generator | None = None
) -> Tensor:
    """Fill removed pixels from their neighbours, then add noise; never modifies ``x``.

    Each removed pixel ``i`` gets the value solving ``W_i * v_i = sum_j w_ij * v_j`` over its
    in-image neighbours ``j`` (removed neighbours are unknowns too), per channel; then
    ``noise * N(0, 1)`` is added to it. The sparse systems of the whole batch are built at
    once with tensor ops (no loop over pixels); then each image's system is factorised once
    (SciPy's SuperLU, on the CPU) and solved for all channels together. Kept pixels are
    returned unchanged. The values match Rong et al.'s reference imputer.

    Args:
        x: images [B, C, H, W].
        removed: bool [B, H, W], True for pixels to fill. An image may not lose every
            pixel (there would be nothing to fill from).
        noise: standard deviation of the added noise (0 for none).
        generator: a CPU ``torch.Generator`` for reproducible noise.

    Returns:
        Images [B, C, H, W] like ``x``.

    Example:
        >>> import torch
        >>> from camkit.metrics import noisy_linear_imputation
        >>> x = torch.tensor([[[[0.0, 0.0, 0.0], [0.0, 9.0, 6.0], [0.0, 0.0, 12.0]]]])
        >>> removed = torch.zeros(1, 3, 3, dtype=torch.bool); removed[0, 1, 1] = True
        >>> noisy_linear_imputation(x, removed, noise=0.0)[0, 0, 1, 1]  # 6/6 + 12/12
        tensor(2.)
    """
    from scipy.sparse import csc_matrix  # imported here: only ROAD needs SciPy
    from scipy.sparse.linalg import splu

    check_images(x)
    batch, channels, height, width = x.shape
    if not isinstance(removed, Tensor) or removed.dtype != torch.bool or removed.shape != (batch, height, width):
        got = f"{removed.dtype} {list(removed.shape)}" if isinstance(removed, Tensor) else type(removed).__name__
        raise InvalidInputError(f"removed must be a bool tensor [{batch}, {height}, {width}], got {got}")
    if not noise >= 0:
        raise InvalidInputError(f"noise must be a standard deviation >= 0, got {noise!r}")
    mask = removed.detach().cpu()
    if bool(mask.flatten(1).all(dim=1).any()):
        raise InvalidInputError(
            "an image has every pixel removed, so there is nothing to impute from; remove a smaller fraction"
        )
    flat = mask.reshape(-1)
    unknown = flat.nonzero()[:, 0]  # global pixel index b * H * W + row * W + col
    count = unknown.numel()
    if count == 0:
        return x.clone()
    variable = torch.full((flat.numel(),), -1, dtype=torch.long)
    variable[unknown] = torch.arange(count)
    values = x.detach().to("cpu", torch.float64).permute(0, 2, 3, 1).reshape(-1, channels)  # [B*H*W, C]
    row = (unknown // width) % height
    col = unknown % width
    diag = torch.zeros(count, dtype=torch.float64)
    rhs = torch.zeros(count, channels, dtype=torch.float64)
    eq = torch.arange(count)
    rows, cols, vals = [eq], [eq], [diag]  # diag is filled in below, in place
    for dr, dc, weight in _NEIGHBOURS:
        inside = (row + dr >= 0) & (row + dr < height) & (col + dc >= 0) & (col + dc < width)
        here = eq[inside]
        there = unknown[inside] + dr * width + dc
        diag.index_add_(0, here, torch.full((here.numel(),), weight, dtype=torch.float64))
        is_unknown = flat[there]
        rows.append(here[is_unknown])
        cols.append(variable[there[is_unknown]])
        vals.append(torch.full((rows[-1].numel(),), -weight, dtype=torch.float64))
        known = ~is_unknown
        rhs.index_add_(0, here[known], weight * values[there[known]])
    system = csc_matrix(
        (torch.cat(vals).numpy(), (torch.cat(rows).numpy(), torch.cat(cols).numpy())), shape=(count, count)
    )
    # One factorisation per image: the blocks are independent, and SuperLU's ordering of one
    # block-diagonal system fills in far more than the blocks factorised one by one.
    solved = torch.empty(count, channels, dtype=torch.float64)
    bounds = [0, *torch.cumsum(mask.flatten(1).sum(dim=1), 0).tolist()]
    for start, stop in pairwise(bounds):
        if stop > start:
            block = system[start:stop, start:stop].tocsc()
            solved[start:stop] = torch.from_numpy(splu(block).solve(rhs[start:stop].numpy()).reshape(-1, channels))
    if noise > 0:
        solved = solved + noise * torch.randn(count, channels, generator=generator, dtype=torch.float64)
    out = x.detach().permute(0, 2, 3, 1).reshape(-1, channels).clone()
    out[unknown.to(x.device)] = solved.to(device=x.device, dtype=x.dtype)
    return out.view(batch, height, width, channels).permute(0, 3, 1, 2).contiguous()


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
) -> tuple[Tensor, Tensor]:
    """The ROAD curve: the target's score as pixels are removed by noisy linear imputation.

    For each fraction ``f`` the ``ceil(f * N)`` most relevant pixels (``order="morf"``:
    most relevant first; a fast drop means a faithful map) or least relevant pixels
    (``order="lerf"``: the score should stay high) of the ``N = H * W`` are filled by
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
    if order not in ("morf", "lerf"):
        raise InvalidInputError(f"order must be 'morf' (most relevant first) or 'lerf', got {order!r}")
    batch, n = x.shape[0], maps.shape[1] * maps.shape[2]
    fractions = [float(f) for f in fractions]
    if not fractions or any(not 0 <= f < 1 for f in fractions):
        raise InvalidInputError(f"fractions must be a non-empty list of shares in [0, 1), got {fractions}")
    counts = [count_for_fraction(f, n) for f in fractions]
    if max(counts) >= n:
        raise InvalidInputError(
            f"a fraction of {max(fractions)} removes all {n} pixels, leaving nothing to impute from; "
            "use smaller fractions"
        )
    scorer = ChunkScorer(model, target, softmax=softmax, output=output, chunk_size=chunk_size)
    with torch.no_grad(), eval_mode(model, enabled=not keep_mode):
        ranks = pixel_ranks(maps).view(batch, *maps.shape[1:])
        if order == "lerf":
            ranks = n - 1 - ranks
        step_counts = torch.tensor(counts, device=x.device)
        if target is None:  # the top-1 class of the clean image
            scorer.clean(x)
        else:  # the clean scores are not on the curve: skip that pass
            scorer.defer(batch)
        curve: Tensor | None = None
        for start, stop in chunks(batch * len(counts), chunk_size):
            pair = torch.arange(start, stop, device=x.device)
            owner, step = pair // len(counts), pair % len(counts)
            removed = ranks[owner] < step_counts[step].view(-1, 1, 1)
            images = noisy_linear_imputation(x[owner], removed, noise=noise, generator=generator)
            scores = scorer.score(images, owner)
            if curve is None:
                curve = torch.empty(batch, len(counts), dtype=scores.dtype, device=x.device)
            curve[owner, step] = scores.to(curve.dtype)
        if curve is None:
            raise RuntimeError("no image was scored")  # unreachable: check_images requires B >= 1
        curve = torch.where(nan_maps(maps)[:, None], torch.full_like(curve, float("nan")), curve)
    removed_share = (torch.tensor(counts, dtype=torch.float64) / n).to(device=x.device, dtype=curve.dtype)
    return removed_share, curve
