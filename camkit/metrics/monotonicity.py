"""Monotonicity (Arya et al. 2019) and monotonicity correlation (Nguyen and Martinez 2020): the score
as features are restored or replaced, least relevant first (see :mod:`camkit.metrics.faithfulness`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target
from ._perturb import (
    Features,
    Perturb,
    as_features,
    check_count,
    run_plan,
    spearman_rows,
    step_indices,
    step_masks,
    stepwise,
)  # fmt: skip
from .deletion import Baseline, _resolve_baseline
from .faithfulness import _nan_rows, _order

__all__ = ["monotonicity", "monotonicity_correlation"]

def monotonicity(
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
    """Monotonicity (Arya et al. 2019): does adding features back, least relevant first, only raise the score?

    Starting from the baseline, step ``k = 1..P`` restores the ``k * features_in_step`` least
    relevant features to their values in ``x`` (cumulatively) and scores the input. The result
    is 1.0 where the ``P`` scores never decrease, else 0.0. Cost: ``B * P`` forward passes.

    Args and Returns: as :func:`~camkit.metrics.pixel_flipping`; one value per sample [B], 1.0 or 0.0 (NaN
    for NaN maps). ``perturb``: the caller's step, in place of restoring: called once per step, in
    order, with the features of that step (least relevant first), on the previous step's images
    (first the baseline's); what it writes is the caller's choice.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import monotonicity
        >>> class Sum(nn.Module):
        ...     def forward(self, x):
        ...         return x.flatten(1).sum(dim=1)[:, None]
        >>> x = torch.tensor([[[1.0, -2.0, 4.0]]])
        >>> monotonicity(Sum(), x, x[:, 0]), monotonicity(Sum(), x, x[:, 0].abs())  # 1, 2, 4 first gives 1, -1, 3
        (tensor([1.]), tensor([0.]))
    """
    features = as_features(maps, x)
    step = check_count(features_in_step, "features_in_step")
    count = -(-features.count // step)
    canvas = _resolve_baseline(baseline, x)
    order = _order(features, descending=False)

    def build(owner: Tensor, index: Tensor) -> Tensor:
        chosen = features.mask(step_masks(order[owner], index, step, cumulative=True))
        return torch.where(chosen, x[owner], canvas[owner])

    steps = None
    if perturb is not None:
        start = canvas.expand_as(x).to(x.dtype)
        steps = stepwise(perturb, start, step_indices(features, step, descending=False), cumulative=True)
    _, scores = run_plan(
        model, x, target, build, count, softmax=softmax, chunk_size=chunk_size, output=output,
        keep_mode=keep_mode, clean=False, steps=steps,
    )  # fmt: skip
    rising = (scores.diff(dim=1) >= 0).all(dim=1).to(x.dtype)
    return _nan_rows(rising, features)


def monotonicity_correlation(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    samples: int = 100,
    features_in_step: int = 1,
    low: float = 0.0,
    high: float = 1.0,
    fill: Tensor | None = None,
    eps: float = 1e-5,
    generator: torch.Generator | None = None,
    softmax: bool = False,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
    similarity: Callable[[Tensor, Tensor], Tensor] | None = None,
    perturb: Perturb | None = None,
) -> Tensor:
    """Monotonicity correlation (Nguyen and Martinez 2020), per sample.

    The features are taken in groups of ``features_in_step``, least relevant first. Each
    group alone is replaced ``samples`` times by values drawn uniformly from ``[low, high)``;
    its variance is ``mean_s (f(x_s) - f(x))^2 / f(x)^2`` (``f(x)^2`` read as 1 where
    ``|f(x)| < eps``). The result is Spearman's rank correlation, over the groups, between a
    group's attribution sum and its variance. Higher is better. Cost: ``B * samples *
    ceil(F / features_in_step)`` forward passes plus ``B``.

    Args:
        model, x, maps, target, features_in_step, softmax, chunk_size, output, keep_mode: as
            :func:`pixel_flipping`.
        samples: draws per group.
        low, high: range of the uniform replacement values.
        fill: the replacement values themselves, [B, P, samples, features_in_step] (group
            ``p``'s ``j``-th feature in draw ``s``; a last group with fewer features uses the
            first ones); then ``samples``, ``low``, ``high`` and ``generator`` are not used.
        eps: smallest ``|f(x)|`` the variance is divided by.
        generator: draws the replacement values (CPU generator).
        similarity: ``f(sums, variances) -> [B]`` on the [B, P] float64 rows, in place of
            Spearman's rank correlation (``None``).
        perturb: the caller's perturbation in place of the draws (as :func:`~camkit.metrics.pixel_flipping`'s),
            called ``samples`` times per group on ``x``, group by group.

    Returns:
        Correlations [B].

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import monotonicity_correlation
        >>> class Weighted(nn.Module):  # score = 1 + sum of w_i x_i
        ...     def forward(self, x):
        ...         return 1 + (x[:, 0] * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum(dim=1, keepdim=True)
        >>> x, g = torch.full((1, 1, 4), 2.0), torch.Generator().manual_seed(0)
        >>> monotonicity_correlation(Weighted(), x, torch.tensor([[1.0, 2.0, 3.0, 4.0]]), samples=20, generator=g)
        tensor([1.])
    """
    features = as_features(maps, x)
    step = check_count(features_in_step, "features_in_step")
    count = -(-features.count // step)
    order = _order(features, descending=False)
    steps = None
    if perturb is None:
        fill = _uniform_fill(fill, x, count, step, samples, low, high, generator)
        samples = fill.shape[2]
    else:  # the plan's builder is not called: the steps make the images
        fill, samples = x.new_zeros(x.shape[0], count, 1, step), check_count(samples, "samples")
        steps = stepwise(perturb, x, step_indices(features, step, descending=False), cumulative=False, repeat=samples)
    build = _group_replacer(x, features, order, fill, step)
    clean, scores = run_plan(
        model, x, target, build, count * samples, softmax=softmax, chunk_size=chunk_size, output=output,
        keep_mode=keep_mode, steps=steps,
    )  # fmt: skip
    assert clean is not None
    variance = _variances(clean.double(), scores.double().view(x.shape[0], count, samples), eps)
    groups = torch.div(order, step, rounding_mode="floor")
    sums = torch.zeros(x.shape[0], count, dtype=torch.float64, device=x.device).scatter_add_(1, groups, features.values.double())
    correlate = spearman_rows if similarity is None else similarity
    return _nan_rows(correlate(sums, variance), features).to(x.dtype)


def _variances(clean: Tensor, scores: Tensor, eps: float) -> Tensor:
    """``mean_s (f(x_s) - f(x))^2 / f(x)^2`` per group [B, P] from scores [B, P, samples] (``f(x)^2`` is 1 below ``eps``)."""
    inverse = torch.where(clean.abs() >= eps, 1.0 / clean.abs(), torch.ones_like(clean)) ** 2
    return ((scores - clean[:, None, None]) ** 2).mean(dim=2) * inverse[:, None]


def _uniform_fill(
    fill: Tensor | None, x: Tensor, count: int, step: int, samples: int, low: float, high: float,
    generator: torch.Generator | None,
) -> Tensor:  # fmt: skip
    """The replacement values [B, P, samples, step] on ``x``'s device and dtype: ``fill``, checked, or uniform draws."""
    batch = x.shape[0]
    if fill is None:
        check_count(samples, "samples")
        fill = low + (high - low) * torch.rand(batch, count, samples, step, generator=generator, dtype=torch.float64)
    if not isinstance(fill, Tensor) or fill.dim() != 4 or tuple(fill.shape[:2]) != (batch, count):
        got = list(fill.shape) if isinstance(fill, Tensor) else type(fill).__name__
        raise InvalidInputError(
            f"fill must be a tensor [B, P, samples, features_in_step] = [{batch}, {count}, samples, {step}], got {got}"
        )
    return fill.to(x.device, x.dtype)


def _group_replacer(
    x: Tensor, features: Features, order: Tensor, fill: Tensor, step: int
) -> Callable[[Tensor, Tensor], Tensor]:
    """The plan's inputs: plan entry ``group * samples + draw`` replaces one group alone by that draw's values."""
    samples = fill.shape[2]

    def build(owner: Tensor, index: Tensor) -> Tensor:
        group, draw = index // samples, index % samples
        ranks = order[owner]
        chosen = step_masks(ranks, group, step, cumulative=False)
        slot = (ranks - (group * step)[:, None]).clamp(0, step - 1)  # a feature's place in its group
        values = fill[owner, group, draw].gather(1, slot)  # [M, F]
        shape = (owner.shape[0], *features.shape)
        canvas = values.view(shape) if features.shape[0] == x.shape[1] else values.view(shape).expand_as(x[owner])
        return torch.where(features.mask(chosen), canvas, x[owner])

    return build
