"""ARCC (pytorch-grad-cam 1.5.7): the harmonic mean of coherency, simplicity and ROAD.

* :func:`arcc_complexity`: the mean absolute value of a map (its L1 norm over the positions);
* :func:`coherency`: how much a map agrees with the map of the same method on the input masked
  by it, as ``(Pearson + 1) / 2`` (Poppi et al. 2021);
* :func:`arcc`: ``3 / (1 / coherency + 1 / (1 - complexity) + 1 / road)``, with ROAD the MoRF/LeRF
  gap of :func:`camkit.metrics.road_curve` scaled to [0, 1].

Maps of any rank: [B, T], [B, H, W] or [B, D, H, W] with inputs [B, C, *S].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from .._internal.state import eval_mode
from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target, resolve_target, select_output
from ._common import check_images, check_maps, check_model
from .road import road_curve

__all__ = ["ARCCScores", "arcc", "arcc_complexity", "coherency"]

_EPS = 1e-8


class ARCCScores(NamedTuple):
    """What :func:`arcc` returns: the score and its three parts, each [B].

    Attributes:
        arcc: the harmonic mean of ``coherency``, ``1 - complexity`` and ``road``.
        complexity: :func:`arcc_complexity` of the maps.
        coherency: :func:`coherency` of the maps.
        road: ``clip(lerf - morf, 0, 1)``: the mean score gap between removing the least and the
            most relevant pixels (ROAD, averaged over the percentiles), times two as in
            pytorch-grad-cam (which reads it as a probability gap in [-0.5, 0.5]) and clipped.

    Example:
        >>> import torch
        >>> from camkit.metrics import ARCCScores
        >>> ARCCScores(*(torch.ones(1),) * 4)._fields
        ('arcc', 'complexity', 'coherency', 'road')
    """

    arcc: Tensor
    complexity: Tensor
    coherency: Tensor
    road: Tensor


def arcc_complexity(maps: Tensor) -> Tensor:
    """The mean absolute value of each map, [B]: 0 for an empty map, 1 for a map of ones.

    Args:
        maps: [B, T], [B, H, W] or [B, D, H, W] (maps in [0, 1] give a complexity in [0, 1]).

    Example:
        >>> import torch
        >>> from camkit.metrics import arcc_complexity
        >>> arcc_complexity(torch.tensor([[[1.0, 0.0], [0.5, -0.5]]]))
        tensor([0.5000])
    """
    maps = check_maps(maps)
    return maps.flatten(1).abs().mean(dim=1)


def pearson_rows(a: Tensor, b: Tensor) -> Tensor:
    """Pearson's correlation of each sample of ``a`` with the same sample of ``b``, in float64.

    Each sample is flattened to a row; the covariance and the standard deviations use ``n - 1``,
    and ``1e-8`` is added to the product of the deviations, so a constant row gives 0, not NaN.

    Args:
        a, b: [B, ...] of the same shape.

    Returns:
        float64 [B].

    Example:
        >>> import torch
        >>> from camkit.metrics import pearson_rows
        >>> a = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
        >>> pearson_rows(a, torch.tensor([[2.0, 4.0, 6.0], [1.0, 2.0, 3.0]])).tolist()
        [0.999999995, 0.0]
    """
    a, b = a.flatten(1).double(), b.flatten(1).double()
    n = a.shape[1]
    ac, bc = a - a.mean(dim=1, keepdim=True), b - b.mean(dim=1, keepdim=True)
    cov = (ac * bc).sum(dim=1) / (n - 1)
    sa = (ac.pow(2).sum(dim=1) / (n - 1)).sqrt()
    sb = (bc.pow(2).sum(dim=1) / (n - 1)).sqrt()
    return cov / (sa * sb + _EPS)


def _fixed_target(
    model: nn.Module, x: Tensor, target: Target, output: OutputSelector, keep_mode: bool
) -> Target:
    """``target``, with ``None`` replaced by the clean images' top-1 classes (so masked images keep them)."""
    if target is not None:
        return target
    with torch.no_grad(), eval_mode(model, enabled=not keep_mode):
        classes, _ = resolve_target(None, select_output(model(x), output))
    return classes


def coherency(
    x: Tensor,
    maps: Tensor,
    explainer: Callable[[Tensor, Any], Tensor],
    target: Target = None,
) -> Tensor:
    """How well a map explains itself: ``(r + 1) / 2``, ``r`` the Pearson correlation of ``maps``
    with ``explainer(x * maps, target)``, [B] in [0, 1].

    The input is multiplied by its own map (broadcast over channels) and explained again by
    the same method; a coherent map comes back unchanged (1), an unrelated one gives 0.5.
    Pearson's ``r`` is ``cov / (std_a std_b + 1e-8)`` with unbiased moments, as in
    pytorch-grad-cam 1.5.7 (a flat map gives ``r = 0``).

    Args:
        x: the inputs [B, C, *S].
        maps: their maps [B, *S], as the explainer returned them (in [0, 1]).
        explainer: ``explainer(images, target) -> maps [B, *S]``: a camkit explainer.
        target: the target the maps were made for; pass it (class indices) when it was ``None``,
            so the masked images are explained for the same classes (:func:`arcc` does).

    Example:
        >>> import torch
        >>> from camkit.metrics import coherency
        >>> x = torch.rand(2, 3, 4, 4)
        >>> maps = torch.rand(2, 4, 4)
        >>> same = coherency(x, maps, lambda images, target: images.mean(dim=1) / x.mean(dim=1))  # gives maps back
        >>> [round(v, 4) for v in same.tolist()]
        [1.0, 1.0]
    """
    check_images(x)
    maps = check_maps(maps, x)
    again = explainer(x * maps[:, None].to(x.dtype), target)
    if not isinstance(again, Tensor) or again.shape != maps.shape:
        got = list(again.shape) if isinstance(again, Tensor) else type(again).__name__
        raise InvalidInputError(f"the explainer must return maps {list(maps.shape)} for the masked inputs, got {got}")
    return ((pearson_rows(again, maps) + 1) / 2).to(maps.dtype)


def road_removals(percentiles: Sequence[float], n: int) -> list[int]:
    """How many of ``n`` positions pytorch-grad-cam's ROAD removes at each percentile ``p``.

    It keeps the positions under the ``p``-th percentile (linear interpolation) of the map and
    removes the others: ``n - ceil((n - 1) p / 100)`` of them when the values are distinct.

    Example:
        >>> from camkit.metrics.arcc import road_removals
        >>> road_removals([20, 40, 60, 80], 64)
        [51, 38, 26, 13]
    """
    out = []
    for p in percentiles:
        if not 0 < float(p) < 100:
            raise InvalidInputError(f"percentiles must lie in (0, 100), got {p!r}")
        out.append(n - math.ceil((n - 1) * (float(p) / 100)))
    return out


def arcc(
    model: nn.Module,
    x: Tensor,
    maps: Tensor,
    explainer: Callable[[Tensor, Any], Tensor],
    target: Target = None,
    *,
    percentiles: Sequence[float] = (20, 40, 60, 80),
    noise: float = 0.01,
    softmax: bool = False,
    chunk_size: int = 32,
    generator: torch.Generator | None = None,
    output: OutputSelector = None,
    keep_mode: bool = False,
) -> ARCCScores:
    """ARCC: the harmonic mean of coherency, simplicity (``1 - complexity``) and ROAD, [B] each.

    ``arcc = 3 / (1 / (coherency + 1e-8) + 1 / (1 - complexity + 1e-8) + 1 / (road + 1e-8))``
    (pytorch-grad-cam 1.5.7's ``metrics.arcc.ARCC``), all three in [0, 1], higher better. ROAD
    is the mean over ``percentiles`` of half the score gap between LeRF and MoRF
    (:func:`camkit.metrics.road_curve`, noisy linear imputation), doubled and clipped to
    [0, 1]. At percentile ``p`` the positions above the ``p``-th percentile of the map (MoRF)
    or below the ``(100 - p)``-th (LeRF) are removed: :func:`road_removals` counts them, ties
    broken in row-major order (pytorch-grad-cam's threshold removes every tied position).

    Args:
        model: the model the maps explain.
        x: the inputs [B, C, *S].
        maps: their maps [B, *S] in [0, 1].
        explainer: ``explainer(images, target) -> maps``, the method that made ``maps`` (for
            :func:`coherency`).
        target: ``None`` (the clean images' top-1 class, kept for the masked ones), class
            indices [B], or a callable; see :func:`camkit.metrics.deletion_curve`.
        percentiles: pytorch-grad-cam's ROAD percentiles.
        noise: standard deviation of the imputation noise.
        softmax: score ROAD with the class probability instead of the raw output (the scale
            pytorch-grad-cam's clip to [0, 1] assumes).
        chunk_size, generator, output, keep_mode: as :func:`camkit.metrics.road_curve`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> from camkit.metrics import arcc
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> x = torch.rand(2, 3, 8, 8)
        >>> explainer = camkit.GradCAM(net, "1")
        >>> scores = arcc(net, x, explainer(x, 0), explainer, 0, softmax=True)
        >>> tuple(scores.arcc.shape), bool(((scores.arcc >= 0) & (scores.arcc <= 1)).all())
        ((2,), True)
    """
    check_model(model)
    check_images(x)
    maps = check_maps(maps, x)
    n = maps[0].numel()
    fractions = [count / n for count in road_removals(percentiles, n)]
    fixed = _fixed_target(model, x, target, output, keep_mode)
    road_options: dict[str, Any] = dict(
        fractions=fractions, noise=noise, softmax=softmax, chunk_size=chunk_size, generator=generator,
        output=output, keep_mode=keep_mode,
    )
    _, lerf = road_curve(model, x, maps, fixed, order="lerf", **road_options)
    _, morf = road_curve(model, x, maps, fixed, order="morf", **road_options)
    road = (lerf.mean(dim=1) - morf.mean(dim=1)).clamp(0, 1)  # ((lerf - morf) / 2) * 2
    simple = arcc_complexity(maps)
    coherent = coherency(x, maps, explainer, fixed)
    score = 3 / (1 / (coherent + _EPS) + 1 / ((1 - simple) + _EPS) + 1 / (road + _EPS))
    return ARCCScores(score, simple, coherent, road.to(score.dtype))
