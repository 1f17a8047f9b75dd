"""Faithfulness by feature removal: pixel flipping, faithfulness correlation and estimate
(monotonicity and monotonicity correlation are in :mod:`camkit.metrics.monotonicity`).

Each perturbs features of the input (see :mod:`camkit.metrics._perturb` for what a feature
is) and compares the model's response with the map; all share one chunked, gradient-free
model runner.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target
from ._perturb import Features, Perturb, as_features, check_count, pearson, run_plan, step_indices, step_masks, stepwise
from .deletion import Baseline, _resolve_baseline

__all__ = [
    "faithfulness_correlation",
    "faithfulness_estimate",
    "pixel_flipping",
]


def _order(features: Features, *, descending: bool) -> Tensor:
    """Rank of every feature [B, F], 0 first; ties keep index order (a stable sort)."""
    order = torch.sort(features.values, dim=1, descending=descending, stable=True).indices
    ranks = torch.empty_like(order)
    positions = torch.arange(features.count, device=order.device).expand_as(order)
    return ranks.scatter_(1, order, positions)


def _nan_rows(result: Tensor, features: Features) -> Tensor:
    bad = features.nan().view(-1, *(1,) * (result.dim() - 1))
    return torch.where(bad, torch.full_like(result, float("nan")), result)


def pixel_flipping(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    features_in_step: int = 1,
    baseline: Baseline = 0.0,
    softmax: bool = False,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
    perturb: Perturb | None = None,
) -> Tensor:
    """Pixel flipping (Bach et al. 2015): the score as features are removed, most relevant first.

    Step ``k = 1..P`` (``P = ceil(F / features_in_step)``) replaces the ``k * features_in_step``
    most relevant of the ``F`` features by the baseline (cumulatively) and scores the input;
    ties keep index order. A faithful map makes the curve fall fast. Cost: ``B * P`` forward
    passes (plus ``B`` for ``target=None``), ``chunk_size`` at a time.

    Args:
        model: the classifier; never modified.
        x: inputs [B, C, *S] (signals, images, volumes).
        maps: [B, *S] or [B, 1, *S] (a feature is a position) or [B, C, *S] (a feature is one
            element).
        target: as :func:`camkit.metrics.deletion_curve`.
        features_in_step: features removed per step.
        baseline: what removed features become (:data:`camkit.metrics.Baseline`).
        softmax, chunk_size, output, keep_mode: as :func:`camkit.metrics.deletion_curve`.
        perturb: instead of ``baseline``, ``perturb(images [B, C, *S], indices [B, k]) -> images``
            replaces the features ``indices`` (into each sample's flattened features, in the
            order they are taken) of the whole batch; called once per step, in order, on the
            previous step's images (first ``x``).

    Returns:
        Scores [B, P] after each step (NaN rows for NaN maps).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import pixel_flipping
        >>> class Sum(nn.Module):
        ...     def forward(self, x):
        ...         return x.flatten(1).sum(dim=1)[:, None]
        >>> x = torch.tensor([[[1.0, 2.0, 4.0]]])  # a signal [B, C, T]
        >>> pixel_flipping(Sum(), x, torch.tensor([[0.1, 0.5, 0.9]]))
        tensor([[3., 1., 0.]])
    """
    features = as_features(maps, x)
    step = check_count(features_in_step, "features_in_step")
    count = -(-features.count // step)
    canvas = _resolve_baseline(baseline, x)
    order = _order(features, descending=True)

    def build(owner: Tensor, index: Tensor) -> Tensor:
        chosen = features.mask(step_masks(order[owner], index, step, cumulative=True))
        return torch.where(chosen, canvas[owner], x[owner])

    steps = None if perturb is None else stepwise(perturb, x, step_indices(features, step, descending=True), cumulative=True)
    _, scores = run_plan(
        model, x, target, build, count, softmax=softmax, chunk_size=chunk_size, output=output,
        keep_mode=keep_mode, clean=False, steps=steps,
    )  # fmt: skip
    return _nan_rows(scores, features)


def draw_subsets(batch: int, features: int, runs: int, size: int, generator: torch.Generator | None) -> Tensor:
    """``runs`` random subsets of ``size`` distinct features per sample, LongTensor [B, runs, size].

    Drawn on the generator's device (the CPU without one), one sample at a time: keys for
    the whole batch would hold ``B * runs * F`` floats at once.
    """
    device = generator.device if generator is not None else None
    keys = (torch.rand(runs, features, generator=generator, device=device) for _ in range(batch))
    return torch.stack([k.topk(size, dim=1, sorted=False).indices for k in keys])


def faithfulness_correlation(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    runs: int = 100,
    subset_size: int = 224,
    subsets: Tensor | None = None,
    baseline: Baseline = 0.0,
    fill: Tensor | None = None,
    generator: torch.Generator | None = None,
    softmax: bool = False,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
    similarity: Callable[[Tensor, Tensor], Tensor] | None = None,
    perturb: Perturb | None = None,
) -> Tensor:
    """Faithfulness correlation (Bhatt et al. 2020), per sample.

    ``runs`` times, a random subset ``S`` of ``subset_size`` features is replaced by the
    baseline; the result is Pearson's correlation, over the runs, between the attribution
    the subset holds, ``sum_{i in S} a_i``, and the score it costs, ``f(x) - f(x_S)``. Higher
    is better. Cost: ``B * runs`` forward passes plus ``B``.

    Args:
        model, x, maps, target, baseline, softmax, chunk_size, output, keep_mode: as
            :func:`pixel_flipping`.
        runs: number of random subsets per sample.
        subset_size: features per subset.
        subsets: the subsets themselves, LongTensor [B, runs, subset_size] of feature indices
            (then ``runs``, ``subset_size`` and ``generator`` are not used).
        fill: one value per sample and run, [B, runs], written into that run's subset in place of
            ``baseline`` (a fresh random value per run, for instance); None: ``baseline``.
        generator: draws the subsets (drawn on its device, which may be the input's; the draw does not depend on ``chunk_size``).
        similarity: ``f(sums, drops) -> [B]`` on the [B, runs] rows, in place of Pearson's
            correlation (``None``).
        perturb: instead of ``baseline`` and ``fill``, the caller's perturbation (as
            :func:`pixel_flipping`'s), called once per run on ``x`` with that run's subsets [B, size].

    Returns:
        Correlations [B] (NaN where a map or the score changes are constant).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import faithfulness_correlation
        >>> class Weighted(nn.Module):  # score = sum of w_i x_i
        ...     def forward(self, x):
        ...         return (x[:, 0] * torch.arange(1.0, 9.0)).sum(dim=1, keepdim=True)
        >>> x = torch.ones(1, 1, 8)
        >>> g = torch.Generator().manual_seed(0)
        >>> faithfulness_correlation(Weighted(), x, torch.arange(1.0, 9.0)[None], runs=10, subset_size=3, generator=g)
        tensor([1.])
    """
    features = as_features(maps, x)
    batch = x.shape[0]
    subsets = _checked_subsets(subsets, batch, features.count, runs, subset_size, generator).to(x.device, torch.long)
    runs = subsets.shape[1]
    canvas = _resolve_baseline(baseline, x)
    values = None if fill is None else _run_values(fill, x, runs)

    def build(owner: Tensor, index: Tensor) -> Tensor:
        chosen = torch.zeros(owner.shape[0], features.count, dtype=torch.bool, device=x.device)
        chosen.scatter_(1, subsets[owner, index], True)
        value = canvas[owner] if values is None else values[owner, index].view(-1, *(1,) * (x.dim() - 1))
        return torch.where(features.mask(chosen), value, x[owner])

    steps = None if perturb is None else stepwise(perturb, x, lambda k: subsets[:, k], cumulative=False)
    clean, scores = run_plan(
        model, x, target, build, runs, softmax=softmax, chunk_size=chunk_size, output=output, keep_mode=keep_mode,
        steps=steps,
    )  # fmt: skip
    assert clean is not None  # run_plan(clean=True) always scores the clean inputs
    sums = features.values.gather(1, subsets.flatten(1)).view(batch, runs, -1).sum(dim=2)
    return _nan_rows((similarity or pearson)(sums, clean[:, None] - scores), features).to(x.dtype)


def _checked_subsets(
    subsets: Tensor | None, batch: int, count: int, runs: int, size: int, generator: torch.Generator | None
) -> Tensor:
    """The subsets given, checked, or ``runs`` drawn subsets of ``size`` of the ``count`` features."""
    if subsets is None:
        check_count(runs, "runs", minimum=2)
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= count:
            raise InvalidInputError(f"subset_size must be an int in [1, {count}], got {size!r}")
        subsets = draw_subsets(batch, count, runs, size, generator)
    if not isinstance(subsets, Tensor) or subsets.dim() != 3 or subsets.shape[0] != batch:
        got = list(subsets.shape) if isinstance(subsets, Tensor) else type(subsets).__name__
        raise InvalidInputError(f"subsets must be a LongTensor [B, runs, size] of feature indices, got {got}")
    return subsets


def _run_values(fill: Tensor, x: Tensor, runs: int) -> Tensor:
    """``fill`` [B, runs] checked and on ``x``'s device and dtype."""
    if not isinstance(fill, Tensor) or tuple(fill.shape) != (x.shape[0], runs):
        got = list(fill.shape) if isinstance(fill, Tensor) else type(fill).__name__
        raise InvalidInputError(f"fill must be a tensor [B, runs] = [{x.shape[0]}, {runs}], got {got}")
    return fill.to(x.device, x.dtype)


def faithfulness_estimate(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    features_in_step: int = 1,
    baseline: Baseline = 0.0,
    softmax: bool = False,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
    similarity: Callable[[Tensor, Tensor], Tensor] | None = None,
    perturb: Perturb | None = None,
) -> Tensor:
    """Faithfulness estimate (Alvarez-Melis and Jaakkola 2018), per sample.

    The features are taken in groups of ``features_in_step``, most relevant first; each group
    alone is replaced by the baseline (the others kept). The result is Pearson's correlation,
    over the groups, between a group's attribution sum and the score drop it causes,
    ``f(x) - f(x_group)``. Higher is better. Cost: ``B * ceil(F / features_in_step)`` forward
    passes plus ``B``.

    Args and Returns: as :func:`pixel_flipping`, one correlation per sample [B]; ``similarity``:
    ``f(sums, drops) -> [B]`` on the [B, steps] rows, in place of Pearson's correlation (``None``);
    ``perturb``: as :func:`pixel_flipping`'s, each step's call on ``x`` (not cumulative).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import faithfulness_estimate
        >>> class Square(nn.Module):  # score = sum of x_i^2
        ...     def forward(self, x):
        ...         return x.pow(2).flatten(1).sum(dim=1, keepdim=True)
        >>> x = torch.tensor([[[1.0, 2.0, 3.0]]])
        >>> faithfulness_estimate(Square(), x, x[:, 0] ** 2)
        tensor([1.])
    """
    features = as_features(maps, x)
    step = check_count(features_in_step, "features_in_step")
    count = -(-features.count // step)
    canvas = _resolve_baseline(baseline, x)
    order = _order(features, descending=True)

    def build(owner: Tensor, index: Tensor) -> Tensor:
        chosen = features.mask(step_masks(order[owner], index, step, cumulative=False))
        return torch.where(chosen, canvas[owner], x[owner])

    steps = None if perturb is None else stepwise(perturb, x, step_indices(features, step, descending=True), cumulative=False)
    clean, scores = run_plan(
        model, x, target, build, count, softmax=softmax, chunk_size=chunk_size, output=output, keep_mode=keep_mode,
        steps=steps,
    )  # fmt: skip
    assert clean is not None
    groups = torch.div(order, step, rounding_mode="floor")
    sums = torch.zeros(x.shape[0], count, dtype=features.values.dtype, device=x.device)
    sums.scatter_add_(1, groups, features.values)
    return _nan_rows((similarity or pearson)(sums, clean[:, None] - scores), features).to(x.dtype)
