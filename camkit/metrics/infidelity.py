"""Sampled attribution-versus-output estimators: infidelity (Yeh et al. 2019) and sensitivity-n
(Ancona et al. 2018). Both draw random perturbations (from an explicit generator, or passed in)
and compare the attribution they carry with the score change they cause, per sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target
from ._perturb import Perturb, as_features, check_count, pearson, run_plan, stepwise
from .deletion import Baseline, _resolve_baseline
from .faithfulness import draw_subsets

__all__ = ["infidelity", "sensitivity_n"]


def infidelity(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    samples: int = 10,
    std: float = 0.1,
    perturbations: Tensor | None = None,
    normalize: bool = False,
    generator: torch.Generator | None = None,
    softmax: bool = False,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
    loss: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> Tensor:
    """Explanation infidelity (Yeh et al. 2019), the sampled estimator, per sample.

    For perturbations ``I_1..I_K`` of the input (default: Gaussian noise of standard deviation
    ``std``, drawn from ``generator``), ``INFD = mean_k (I_k . a - (f(x) - f(x - I_k)))^2``,
    where ``I . a`` sums over every element (a map without channels is read on every channel).
    ``normalize=True`` first scales the attribution by the best factor
    ``beta = mean_k[(I_k . a)(f(x) - f(x - I_k))] / mean_k[(I_k . a)^2]`` (the paper's
    scale-invariant variant). Lower is better. Equal to ``captum.metrics.infidelity`` given
    the same perturbations. Cost: ``B * K + B`` forward passes.

    Args:
        model, x, maps, target, softmax, chunk_size, output, keep_mode: as
            :func:`pixel_flipping`.
        samples: perturbations per sample (``K``).
        std: standard deviation of the Gaussian perturbations, in the input's units.
        perturbations: the perturbations themselves, [B, K, C, *S] (any ``I``, such as square
            removals ``I = (x - baseline) * mask``); then ``samples``, ``std`` and
            ``generator`` are not used.
        normalize: use the scale-invariant variant.
        generator: draws the perturbations (CPU generator).
        loss: ``loss(dots [B, K], changes [B, K]) -> [B]`` in place of the mean squared error
            (``I_k . a`` and ``f(x) - f(x - I_k)``, float64).

    Returns:
        Float tensor [B].

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import infidelity
        >>> class Weighted(nn.Module):  # linear: its gradient times I is exact
        ...     def forward(self, x):
        ...         return (x[:, 0] * torch.tensor([1.0, -2.0, 3.0])).sum(dim=1, keepdim=True)
        >>> x, g = torch.rand(2, 1, 3), torch.Generator().manual_seed(0)
        >>> exact = torch.tensor([[1.0, -2.0, 3.0]]).expand(2, 3)
        >>> infidelity(Weighted(), x, exact, samples=5, generator=g).abs().max() < 1e-10
        tensor(True)
        >>> infidelity(Weighted(), x, 2 * exact, normalize=True, generator=g).abs().max() < 1e-10
        tensor(True)
    """
    features = as_features(maps, x)
    batch = x.shape[0]
    perturbations = _perturbations(perturbations, x, samples, std, generator)
    samples = perturbations.shape[1]

    def build(owner: Tensor, index: Tensor) -> Tensor:
        return x[owner] - perturbations[owner, index]

    clean, scores = run_plan(
        model, x, target, build, samples, softmax=softmax, chunk_size=chunk_size, output=output, keep_mode=keep_mode
    )
    assert clean is not None
    a = features.values.view(batch, 1, *features.shape).double()
    dot = (perturbations.double() * a).flatten(2).sum(dim=2)  # [B, K]
    change = clean.double()[:, None] - scores.double()
    if normalize:
        beta = (dot * change).mean(dim=1) / (dot * dot).mean(dim=1)
        beta = torch.where(torch.isfinite(beta), beta, torch.zeros_like(beta))
        dot = beta[:, None] * dot
    result = ((dot - change) ** 2).mean(dim=1) if loss is None else loss(dot, change).to(dot.device, torch.float64)
    return torch.where(features.nan(), torch.full_like(result, float("nan")), result).to(x.dtype)


def _perturbations(
    perturbations: Tensor | None, x: Tensor, samples: int, std: float, generator: torch.Generator | None
) -> Tensor:
    """The perturbations [B, K, C, *S] on ``x``'s device and dtype: those given, checked, or Gaussian draws."""
    batch = x.shape[0]
    if perturbations is None:
        check_count(samples, "samples")
        if not std > 0:
            raise InvalidInputError(f"std must be a positive standard deviation, got {std!r}")
        perturbations = std * torch.randn(batch, samples, *x.shape[1:], generator=generator, dtype=x.dtype)
    if not isinstance(perturbations, Tensor) or perturbations.dim() != x.dim() + 1 or (
        perturbations.shape[0] != batch or perturbations.shape[2:] != x.shape[1:]
    ):
        got = list(perturbations.shape) if isinstance(perturbations, Tensor) else type(perturbations).__name__
        raise InvalidInputError(f"perturbations must be [B, K, *x.shape[1:]] = [{batch}, K, {list(x.shape[1:])}], got {got}")
    return perturbations.to(x.device, x.dtype)


def sensitivity_n(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    target: Target = None,
    *,
    sizes: Sequence[int] | None = None,
    samples: int = 100,
    subsets: Sequence[Tensor] | None = None,
    baseline: Baseline = 0.0,
    generator: torch.Generator | None = None,
    softmax: bool = False,
    chunk_size: int = 32,
    output: OutputSelector = None,
    keep_mode: bool = False,
    similarity: Callable[[Tensor, Tensor], Tensor] | None = None,
    perturb: Perturb | None = None,
) -> tuple[Tensor, Tensor]:
    """Sensitivity-n (Ancona et al. 2018): per sample and subset size ``n``, the correlation
    between the attribution of random subsets of ``n`` features and the score they carry.

    For each ``n`` in ``sizes``, ``samples`` random subsets ``S`` of ``n`` features are replaced
    by the baseline; the value is Pearson's correlation, over those subsets, between
    ``sum_{i in S} a_i`` and ``f(x) - f(x_S)``, computed for each sample on its own, as in the
    paper. A map is sensitivity-n for all ``n`` only if the model is linear in its features.
    Cost: ``B * len(sizes) * samples + B`` forward passes.

    Args:
        model, x, maps, target, baseline, softmax, chunk_size, output, keep_mode: as
            :func:`pixel_flipping`.
        sizes: subset sizes; default ten sizes spread evenly from 1 to 80 % of the features.
        samples: subsets per size.
        subsets: the subsets themselves, one LongTensor [B, samples, n] of feature indices
            per size (then ``sizes``, ``samples`` and ``generator`` are not used).
        generator: draws the subsets (drawn on its device: a generator on the input's device keeps the draw there).
        similarity: ``f(sums [B, samples], changes [B, samples]) -> [B]`` per size, for Pearson's.
        perturb: instead of ``baseline``, the caller's perturbation (as
            :func:`~camkit.metrics.pixel_flipping`'s), called on ``x`` once per subset column
            ([B, n]), size by size.

    Returns:
        ``(sizes [K], correlations [B, K])``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.metrics import sensitivity_n
        >>> class Weighted(nn.Module):
        ...     def forward(self, x):
        ...         return (x[:, 0] * torch.arange(1.0, 7.0)).sum(dim=1, keepdim=True)
        >>> x, g = torch.ones(1, 1, 6), torch.Generator().manual_seed(0)
        >>> n, r = sensitivity_n(Weighted(), x, torch.arange(1.0, 7.0)[None], sizes=[1, 3], samples=8, generator=g)
        >>> n.tolist(), r
        ([1, 3], tensor([[1., 1.]]))
    """
    features = as_features(maps, x)
    batch, total = x.shape[0], features.count
    subsets = _subsets(subsets, batch, total, sizes, samples, generator)
    sizes = [s.shape[2] for s in subsets]
    table, offsets = _subset_table(subsets, total, x.device)
    canvas = _resolve_baseline(baseline, x)

    def build(owner: Tensor, index: Tensor) -> Tensor:
        chosen = torch.zeros(owner.shape[0], total + 1, dtype=torch.bool, device=x.device)
        chosen.scatter_(1, table[owner, index].long(), True)  # padding points at the spare column
        return torch.where(features.mask(chosen[:, :total].contiguous()), canvas[owner], x[owner])

    clean, scores = run_plan(
        model, x, target, build, offsets[-1], softmax=softmax, chunk_size=chunk_size, output=output,
        keep_mode=keep_mode, steps=None if perturb is None else _subset_steps(perturb, x, subsets),
    )  # fmt: skip
    assert clean is not None
    curves = _size_curves(features.values, subsets, clean[:, None] - scores, offsets, similarity or pearson)
    curves = torch.where(features.nan()[:, None], torch.full_like(curves, float("nan")), curves)
    return torch.tensor(sizes), curves.to(x.dtype)


def _size_curves(
    values: Tensor, subsets: list[Tensor], change: Tensor, offsets: list[int], similarity: Callable[[Tensor, Tensor], Tensor]
) -> Tensor:
    """Per size, the similarity of the subsets' attribution sums and score changes, [B, sizes]."""
    rows = [
        similarity(values.gather(1, s.to(values.device, torch.long).flatten(1)).view(s.shape).sum(dim=2),
                   change[:, offsets[k] : offsets[k + 1]]).to(change.dtype)
        for k, s in enumerate(subsets)
    ]  # fmt: skip
    return torch.stack(rows, dim=1)


def _subset_steps(perturb: Perturb, x: Tensor, subsets: list[Tensor]) -> Callable[[int], Tensor]:
    """The caller's perturbation of ``x``, once per subset column [B, n], size by size."""
    columns = [s.to(x.device, torch.long)[:, j] for s in subsets for j in range(s.shape[1])]
    return stepwise(perturb, x, columns.__getitem__, cumulative=False)


def _subsets(
    subsets: Sequence[Tensor] | None, batch: int, total: int, sizes: Sequence[int] | None, samples: int,
    generator: torch.Generator | None,
) -> list[Tensor]:  # fmt: skip
    """The subsets, one [B, samples, n] per size: those given, checked, or drawn (default sizes: ten up to 80 %)."""
    if subsets is None:
        if sizes is None:
            top = max(1, int(0.8 * total))
            sizes = sorted({max(1, round(1 + k * (top - 1) / 9)) for k in range(10)})
        sizes = [int(n) for n in sizes]
        if not sizes or any(not 0 < n <= total for n in sizes):
            raise InvalidInputError(f"sizes must be subset sizes in [1, {total}], got {sizes}")
        check_count(samples, "samples", minimum=2)
        subsets = [draw_subsets(batch, total, samples, n, generator) for n in sizes]
    subsets = list(subsets)
    if not subsets or any(not isinstance(s, Tensor) or s.dim() != 3 or s.shape[0] != batch for s in subsets):
        raise InvalidInputError("subsets must be a list of LongTensors [B, samples, n], one per subset size")
    return subsets


def _subset_table(subsets: list[Tensor], total: int, device: torch.device) -> tuple[Tensor, list[int]]:
    """One table [B, sum(runs), width] of feature indices (int32; ``total`` pads the shorter
    subsets, a spare column the mask drops), and each size's first row (host ints, no sync)."""
    runs = [s.shape[1] for s in subsets]
    offsets = [0]
    for r in runs:
        offsets.append(offsets[-1] + r)
    width = max(s.shape[2] for s in subsets)
    table = torch.full((subsets[0].shape[0], offsets[-1], width), total, dtype=torch.int32, device=device)
    for k, s in enumerate(subsets):
        table[:, offsets[k] : offsets[k + 1], : s.shape[2]] = s.to(device, torch.int32)
    return table, offsets
