"""Faithfulness by removing regions: region perturbation (Samek et al. 2016), selectivity
(Montavon et al. 2018) and IROF (Rieger and Hansen 2020).

A region is a square (cube, segment of a signal) patch of ``patch_size`` positions along every
spatial axis, on a grid starting at the first position (the last patch of an axis is shorter
when ``patch_size`` does not divide it), or, for IROF, a segment of a given label map. Regions
are removed cumulatively, all channels together.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target
from ._perturb import Features, Perturb, as_features, check_count, run_plan, stepwise
from .deletion import Baseline, _resolve_baseline

__all__ = ["irof", "region_perturbation", "selectivity"]


def patch_labels(spatial: tuple[int, ...], patch_size: int, device: torch.device) -> Tensor:
    """Label of every position's patch, LongTensor [*S], row-major over the patch grid."""
    label = torch.zeros(spatial, dtype=torch.long, device=device)
    for axis, size in enumerate(spatial):
        cells = math.ceil(size / patch_size)
        coord = torch.arange(size, device=device) // patch_size
        label = label * cells + coord.view(*(1,) * axis, size, *(1,) * (len(spatial) - axis - 1))
    return label


def _region_sums(features: Features, labels: Tensor, count: int) -> Tensor:
    """Map sum over each region [B, R] (channel maps summed over channels too); labels [B, N]."""
    values = features.values.view(features.values.shape[0], features.shape[0], -1).sum(dim=1)
    sums = torch.zeros(values.shape[0], count, dtype=torch.float64, device=values.device)
    return sums.scatter_add_(1, labels, values.double())


def _ranks(sums: Tensor, order: str, generator: torch.Generator | None) -> Tensor:
    """Removal rank of every region [B, R], 0 first; ties keep region order."""
    if order == "random":
        keys = torch.rand(sums.shape, generator=generator).to(sums.device)
        perm = keys.argsort(dim=1)
    elif order in ("morf", "lerf"):
        perm = torch.sort(sums, dim=1, descending=order == "morf", stable=True).indices
    else:
        raise InvalidInputError(f"order must be 'morf', 'lerf' or 'random', got {order!r}")
    ranks = torch.empty_like(perm)
    return ranks.scatter_(1, perm, torch.arange(sums.shape[1], device=sums.device).expand_as(perm))


def _removal_scores(
    model: nn.Module,
    x: Tensor,
    labels: Tensor,
    ranks: Tensor,
    steps: int,
    canvas: Tensor,
    fill: Tensor | None,
    target: Target,
    *,
    softmax: bool,
    chunk_size: int,
    output: OutputSelector,
    keep_mode: bool,
    perturb: Perturb | None = None,
    masks: bool = False,
) -> tuple[Tensor, Tensor]:
    """Clean scores [B] and scores [B, steps] after removing the first 1..steps regions of ``ranks``
    (``perturb`` gets each step's elements, or with ``masks`` its positions as a bool mask [B, 1, *S])."""
    def build(owner: Tensor, index: Tensor) -> Tensor:
        rank = ranks[owner].gather(1, labels[owner])  # [M, N]: each position's region rank
        chosen = (rank <= index[:, None]).view(owner.shape[0], 1, *x.shape[2:])
        if fill is None:
            filler = canvas[owner]
        else:  # the value drawn for the step that removed the position
            filler = fill[owner].gather(1, rank.clamp(max=steps - 1)).view(owner.shape[0], 1, *x.shape[2:])
            filler = filler.to(x.dtype).expand_as(x[owner])
        return torch.where(chosen, filler, x[owner])

    plan = None
    if perturb is not None:
        positions = ranks.gather(1, labels)  # each position's removal step
        step_mask = lambda k: (positions == k).view(x.shape[0], 1, *x.shape[2:])  # noqa: E731
        plan = stepwise(perturb, x, step_mask if masks else _region_elements(x, labels, ranks), cumulative=True)
    clean, scores = run_plan(
        model, x, target, build, steps, softmax=softmax, chunk_size=chunk_size, output=output, keep_mode=keep_mode,
        steps=plan,
    )  # fmt: skip
    assert clean is not None
    return clean, scores


def _region_elements(x: Tensor, labels: Tensor, ranks: Tensor) -> Callable[[int], Tensor]:
    """``indices(k)``: the elements [B, C * n] of the region each sample loses at step ``k``, channel by channel
    (each channel's positions row-major); every region must hold the same number ``n`` of positions."""
    members = torch.sort(labels, dim=1, stable=True).indices  # positions grouped by region, row-major inside
    size = labels.shape[1] // ranks.shape[1]
    if size * ranks.shape[1] != labels.shape[1] or bool((torch.bincount(labels[0]) != size).any()):
        raise InvalidInputError("a perturbation function needs regions of one size: a patch_size that divides every side")
    members = members.view(labels.shape[0], ranks.shape[1], size)
    removal = ranks.argsort(dim=1)  # region removed at each step
    channels = torch.arange(x.shape[1], device=x.device)[None, :, None] * labels.shape[1]

    def indices(k: int) -> Tensor:
        positions = members[torch.arange(x.shape[0], device=x.device), removal[:, k]]  # [B, n]
        return (channels + positions[:, None, :]).flatten(1)

    return indices


def _patch_curve(
    model: nn.Module, x: Tensor, maps: Tensor, target: Target, *, patch_size: int, order: str, regions: int | None,
    baseline: Baseline, fill: Tensor | None, generator: torch.Generator | None, softmax: bool, chunk_size: int,
    output: OutputSelector, keep_mode: bool, perturb: Perturb | None = None,
) -> tuple[Tensor, Tensor, Features]:  # fmt: skip
    features = as_features(maps, x)
    check_count(patch_size, "patch_size")
    batch, spatial = x.shape[0], tuple(x.shape[2:])
    grid = patch_labels(spatial, patch_size, x.device)
    count = math.prod(math.ceil(size / patch_size) for size in spatial)  # the grid's labels, without reading it
    steps = count if regions is None else min(check_count(regions, "regions"), count)
    labels = grid.flatten().expand(batch, -1)
    ranks = _ranks(_region_sums(features, labels, count), order, generator)
    if fill is not None and (not isinstance(fill, Tensor) or tuple(fill.shape) != (batch, steps)):
        got = list(fill.shape) if isinstance(fill, Tensor) else type(fill).__name__
        raise InvalidInputError(f"fill must be a tensor [B, regions] = [{batch}, {steps}], got {got}")
    canvas = _resolve_baseline(baseline, x)
    fill = None if fill is None else fill.to(x.device)
    clean, scores = _removal_scores(
        model, x, labels, ranks, steps, canvas, fill, target, softmax=softmax, chunk_size=chunk_size, output=output,
        keep_mode=keep_mode, perturb=perturb,
    )  # fmt: skip
    return clean, scores, features


def region_perturbation(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    patch_size: int = 8,
    order: str = "morf",
    regions: int | None = None,
    baseline: Baseline = 0.0,
    fill: Tensor | None = None,
    generator: torch.Generator | None = None,
    softmax: bool = False,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
    perturb: Perturb | None = None,
) -> Tensor:
    """Region perturbation (Samek et al. 2016): the score drop as patches are removed, by relevance.

    Patches are ranked by the map's sum over them (``order="morf"``: most relevant first;
    ``"lerf"``: least relevant first; ``"random"``: a random order from ``generator``); step
    ``k`` replaces the first ``k`` patches by the baseline and records ``f(x) - f(x_k)``. The
    paper's AOPC is the mean over steps (and samples): ``drops.mean(dim=1)``; MoRF should rise
    fast, LeRF slowly. Cost: ``B * regions + B`` forward passes.

    Args:
        model, x, maps, target, baseline, softmax, chunk_size, output, keep_mode: as
            :func:`pixel_flipping`.
        patch_size: patch side, in positions along every spatial axis.
        order: ``"morf"``, ``"lerf"`` or ``"random"``.
        regions: how many patches to remove (default: all).
        fill: per-step replacement values [B, regions] (the patch removed at step ``k`` gets
            ``fill[:, k]``) instead of ``baseline``.
        generator: draws the random order.
        perturb: instead of ``baseline`` and ``fill``, the caller's perturbation (as
            :func:`~camkit.metrics.pixel_flipping`'s), called once per step, in order, on the
            previous step's images, with the removed patch's elements [B, C * n] (channel by
            channel, row-major); needs a ``patch_size`` that divides every side.

    Returns:
        Score drops [B, regions] (NaN rows for NaN maps).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import region_perturbation
        >>> class Sum(nn.Module):
        ...     def forward(self, x):
        ...         return x.flatten(1).sum(dim=1)[:, None]
        >>> x = torch.tensor([[[1.0, 2.0, 3.0, 4.0, 5.0]]])  # patches {1, 2}, {3, 4}, {5}
        >>> region_perturbation(Sum(), x, x[:, 0], patch_size=2)
        tensor([[ 7., 12., 15.]])
        >>> region_perturbation(Sum(), x, x[:, 0], patch_size=2, order="lerf")
        tensor([[ 3.,  8., 15.]])
    """
    clean, scores, features = _patch_curve(
        model, x, maps, target, patch_size=patch_size, order=order, regions=regions, baseline=baseline, fill=fill,
        generator=generator, softmax=softmax, chunk_size=chunk_size, output=output, keep_mode=keep_mode,
        perturb=perturb,
    )  # fmt: skip
    drops = clean[:, None] - scores
    return torch.where(features.nan()[:, None], torch.full_like(drops, float("nan")), drops)


def selectivity(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    patch_size: int = 8,
    baseline: Baseline = 0.0,
    fill: Tensor | None = None,
    softmax: bool = False,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
    perturb: Perturb | None = None,
) -> Tensor:
    """Selectivity (Montavon et al. 2018): the score as patches are removed, most relevant first.

    As :func:`region_perturbation` with ``order="morf"`` over all patches, returning the scores
    ``f(x_k)`` themselves; a faithful map makes them fall fast (a small area under the curve:
    ``torch.trapezoid(scores, dim=1)``). Cost: ``B * regions + B`` forward passes.

    Args and Returns: as :func:`region_perturbation` (``fill`` [B, regions]; scores [B, regions]).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import selectivity
        >>> class Sum(nn.Module):
        ...     def forward(self, x):
        ...         return x.flatten(1).sum(dim=1)[:, None]
        >>> x = torch.tensor([[[1.0, 2.0, 3.0, 4.0, 5.0]]])
        >>> selectivity(Sum(), x, x[:, 0], patch_size=2)
        tensor([[8., 3., 0.]])
    """
    _, scores, features = _patch_curve(
        model, x, maps, target, patch_size=patch_size, order="morf", regions=None, baseline=baseline, fill=fill,
        generator=None, softmax=softmax, chunk_size=chunk_size, output=output, keep_mode=keep_mode, perturb=perturb,
    )  # fmt: skip
    return torch.where(features.nan()[:, None], torch.full_like(scores, float("nan")), scores)


def slic_segments(x: Tensor) -> Tensor:
    """SLIC superpixels (scikit-image, ``start_label=0``, its defaults) of images [B, C, H, W], LongTensor [B, H, W]."""
    from skimage.segmentation import slic  # imported here: only IROF's default needs scikit-image

    if x.dim() != 4:
        raise InvalidInputError(
            f"IROF's default segments are SLIC superpixels of images [B, C, H, W], got {list(x.shape)}; "
            "pass segments=[B, *S] labels for signals and volumes"
        )
    images = x.detach().to("cpu", torch.float64).permute(0, 2, 3, 1).numpy()
    labels = [torch.from_numpy(slic(image, start_label=0)) for image in images]
    return torch.stack(labels).to(device=x.device, dtype=torch.long)


def irof(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    segments: Tensor | None = None,
    baseline: Baseline = "mean",
    softmax: bool = True,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
    perturb: Perturb | None = None,
) -> Tensor:
    """IROF, iterative removal of features (Rieger and Hansen 2020): the area over the curve of
    the relative score as segments are removed, most relevant (highest mean) first.

    With ``K`` segments ranked by the map's mean over them, step ``k = 0..K`` removes the first
    ``k`` (step 0 is the input) and records ``f(x_k) / f(x)``; the result is
    ``1 - trapezoid(curve)`` over removed shares ``k / K``. Higher is better. Segments are
    SLIC superpixels (scikit-image) by default, or any label map. Removed segments become the
    baseline (default ``"mean"``: each input's per-channel mean). Cost: ``B * K + B`` forward
    passes (``K`` the largest segment count).

    Args:
        model, x, maps, target, baseline, softmax, chunk_size, output, keep_mode: as
            :func:`pixel_flipping` (softmax is on by default, as the ratio needs positive scores).
        segments: integer labels [B, *S] (``0..K-1``, each label used); default SLIC superpixels
            of each image.
        perturb: instead of ``baseline``, ``perturb(images, mask) -> images`` removes the positions
            of bool ``mask`` [B, 1, *S] (this step's segment; empty for a sample out of segments),
            called once per step, in order, on the previous step's images.

    Returns:
        Float tensor [B].

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import irof
        >>> class Sum(nn.Module):
        ...     def forward(self, x):
        ...         return x.flatten(1).sum(dim=1)[:, None]
        >>> x = torch.tensor([[[3.0, 1.0]]])  # curve 1, 1/4, 0 over 0, 1/2, 1: area 3/8
        >>> irof(Sum(), x, x[:, 0], segments=torch.tensor([[0, 1]]), baseline=0.0, softmax=False)
        tensor([0.6250], dtype=torch.float64)
    """
    features = as_features(maps, x)
    batch = x.shape[0]
    segments = slic_segments(x) if segments is None else segments
    if not isinstance(segments, Tensor) or segments.dtype.is_floating_point or segments.shape != (batch, *x.shape[2:]):
        got = f"{segments.dtype} {list(segments.shape)}" if isinstance(segments, Tensor) else type(segments).__name__
        raise InvalidInputError(f"segments must be integer labels {[batch, *x.shape[2:]]}, got {got}")
    labels = segments.to(x.device, torch.long).flatten(1)
    count = int(labels.max()) + 1
    per_sample = labels.max(dim=1).values + 1  # [B]
    sizes = torch.zeros(batch, count, dtype=torch.float64, device=x.device)
    sizes.scatter_add_(1, labels, torch.ones_like(labels, dtype=torch.float64))
    means = _region_sums(features, labels, count) / (sizes * features.shape[0]).clamp(min=1)
    means = torch.where(sizes > 0, means, torch.full_like(means, -math.inf))  # unused labels go last
    ranks = _ranks(means, "morf", None)
    canvas = _resolve_baseline(baseline, x)
    clean, scores = _removal_scores(
        model, x, labels, ranks, count, canvas, None, target, softmax=softmax, chunk_size=chunk_size, output=output,
        keep_mode=keep_mode, perturb=perturb, masks=True,
    )  # fmt: skip
    curve = torch.cat([clean[:, None], scores], dim=1).double() / clean.double()[:, None]
    shares = torch.arange(count + 1, dtype=torch.float64, device=x.device)[None] / per_sample[:, None]
    area = torch.stack([torch.trapezoid(curve[b, : int(k) + 1], shares[b, : int(k) + 1]) for b, k in enumerate(per_sample.tolist())])
    result = 1.0 - area
    return torch.where(features.nan(), torch.full_like(result, float("nan")), result)
