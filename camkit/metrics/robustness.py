"""Robustness measures: how much a map moves when the input moves a little.

* :func:`avg_sensitivity`, :func:`max_sensitivity` (Yeh et al. 2019; captum's ``sensitivity_max``);
* :func:`local_lipschitz_estimate` (Alvarez-Melis and Jaakkola 2018);
* :func:`continuity` (Montavon et al. 2018), on translated inputs;
* :func:`consistency` (Dasgupta et al. 2022), which needs no re-explanation.

The measures that perturb re-explain ``N`` perturbed copies of the batch: the ``N x B``
inputs go to the explainer ``chunk_size`` at a time. Perturbations are drawn from a
``torch.Generator`` or given as a plan ``perturbed`` [N, B, C, *S] (the perturbed inputs
themselves), so the same draws can be replayed or shared with another library. Maps with a
channel axis [B, K, *S] are compared whole (every norm runs over all their values). The model,
where a measure needs it, runs in eval mode without gradients. Lower is more robust for
every measure here except :func:`consistency`. The relative stabilities (Agarwal et al. 2022)
are in :mod:`camkit.metrics.stability`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target
from ._common import check_maps
from ._perturbed import (
    Explain,
    perturbed_inputs,
    prediction_changed,
    reduce_copies,
    reexplained,
    row_norms,
    uniform_noise,
    unperturbed_maps,
)

__all__ = [
    "avg_sensitivity",
    "consistency",
    "continuity",
    "local_lipschitz_estimate",
    "max_sensitivity",
]


Measure = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def _measured(measure: Measure, maps: Tensor, moved: Tensor, x: Tensor, plan: Tensor) -> Tensor:
    """[N, B]: ``measure(maps, moved[n], x, plan[n])`` for each perturbation n, checked to be [B]."""
    values = []
    for n in range(plan.shape[0]):
        value = torch.as_tensor(measure(maps, moved[n], x, plan[n]), device=x.device)
        if value.shape != (x.shape[0],):
            raise InvalidInputError(
                f"measure must return one value per input [B] = [{x.shape[0]}], got {list(value.shape)}"
            )
        values.append(value.double())
    return torch.stack(values)


def _sensitivity(
    explainer: Explain, x: Tensor, target: Target, how: str, *, model: nn.Module | None, maps: Tensor | None,
    samples: int, radius: float, perturbed: Tensor | None, skip_changed: bool, generator: torch.Generator | None,
    chunk_size: int, output: OutputSelector, measure: Measure | None,
) -> Tensor:  # fmt: skip
    target, maps = unperturbed_maps(explainer, model, x, target, maps, chunk_size, output)
    plan = perturbed_inputs(x, perturbed, samples, uniform_noise(-radius, radius, generator))
    moved = reexplained(explainer, plan, target, chunk_size, maps)
    if measure is not None:
        ratio = _measured(measure, maps, moved, x, plan)
    else:
        base = row_norms(maps[None])
        ratio = row_norms(moved - maps[None]) / torch.where(base == 0, torch.ones_like(base), base)
        ratio = torch.where(base == 0, torch.full_like(ratio, float("nan")), ratio)
    skip = prediction_changed(model, x, plan, chunk_size, output) if skip_changed else None
    return reduce_copies(ratio, skip, how)


def avg_sensitivity(
    explainer: Explain,
    x: Tensor,
    target: Target = None,
    *,
    model: nn.Module | None = None,
    maps: Tensor | None = None,
    samples: int = 200,
    radius: float = 0.2,
    perturbed: Tensor | None = None,
    skip_changed: bool = False,
    generator: torch.Generator | None = None,
    chunk_size: int = 64,
    output: OutputSelector = None,
    measure: Measure | None = None,
) -> Tensor:
    """Average sensitivity (Yeh et al. 2019): the mean relative change of the map under small noise.

    ``mean_n ||e(x + d_n) - e(x)||_2 / ||e(x)||_2`` with ``d_n ~ U(-radius, radius)`` on every
    value of the input (Quantus's ``AvgSensitivity`` with its default ``lower_bound=0.2``).
    Needs re-explanation (and the model for ``target=None`` or ``skip_changed``); costs
    ``samples`` explanations of the batch, ``chunk_size`` inputs per explainer call.

    Args:
        explainer: called as ``explainer(inputs, target)``, returns maps [B, *S] (or ``.maps``), or
            maps with a channel axis [B, K, *S] (per-channel attributions), compared whole:
            the norms run over every value, channels included.
        x: inputs [B, C, *S] ([B, C, T], [B, C, H, W] or [B, C, D, H, W]).
        target: ``None`` (the model's top-1 class), an int, B ints or a callable; the same
            target explains every perturbed copy of an input.
        model: the model, for ``target=None`` and ``skip_changed``.
        maps: the maps of ``x`` [B, *S] (or [B, K, *S], in the explainer's layout); ``None``
            explains them.
        samples: perturbations N.
        radius: half-width of the uniform noise.
        perturbed: a plan of perturbed inputs [N, B, C, *S] instead of drawing.
        skip_changed: leave out the perturbations that change the top-1 class (NaN if all do).
        generator: the source of the draws.
        chunk_size: inputs per explainer (and model) call.
        output: what to read when the model does not return a tensor.
        measure: the change of one perturbation, ``measure(maps, moved, x, perturbed) -> [B]`` (maps
            and ``moved`` [B, *S] or [B, K, *S], ``x`` and ``perturbed`` [B, C, *S]), called once
            per perturbation;
            ``None``: ``||moved - maps||_2 / ||maps||_2``, computed for all perturbations at once.

    Returns:
        Float tensor [B]; NaN for a map that is all zero.

    Example:
        >>> import torch
        >>> from camkit.metrics import avg_sensitivity
        >>> x = torch.ones(1, 1, 4)
        >>> square = lambda inputs, target: inputs[:, 0] ** 2  # an 'explainer' whose map is x squared
        >>> plan = torch.stack([x + 0.1, x - 0.1])  # two perturbations, given as a plan
        >>> avg_sensitivity(square, x, 0, perturbed=plan)  # (||1.21 - 1|| + ||0.81 - 1||) / 2 / ||1||
        tensor([0.2000])
        >>> squared = lambda maps, moved, x, p: (moved - maps).square().sum(1) / maps.square().sum(1)
        >>> avg_sensitivity(square, x, 0, perturbed=plan, measure=squared)  # (0.21 ** 2 + 0.19 ** 2) / 2
        tensor([0.0401])
    """
    return _sensitivity(
        explainer, x, target, "mean", model=model, maps=maps, samples=samples, radius=radius, perturbed=perturbed,
        skip_changed=skip_changed, generator=generator, chunk_size=chunk_size, output=output, measure=measure,
    )  # fmt: skip


def max_sensitivity(
    explainer: Explain,
    x: Tensor,
    target: Target = None,
    *,
    model: nn.Module | None = None,
    maps: Tensor | None = None,
    samples: int = 200,
    radius: float = 0.2,
    perturbed: Tensor | None = None,
    skip_changed: bool = False,
    generator: torch.Generator | None = None,
    chunk_size: int = 64,
    output: OutputSelector = None,
    measure: Measure | None = None,
) -> Tensor:
    """Max sensitivity (Yeh et al. 2019): the largest relative change of the map under small noise.

    ``max_n ||e(x + d_n) - e(x)||_2 / ||e(x)||_2``, ``d_n ~ U(-radius, radius)``: Quantus's
    ``MaxSensitivity`` and captum's ``sensitivity_max`` (which draws ``U(-0.02, 0.02)`` by default:
    pass ``radius=0.02``; captum divides by 1 where ``||e(x)|| = 0``, camkit returns NaN).
    Needs and costs as :func:`avg_sensitivity`, whose arguments it takes.

    Args:
        explainer, x, target, model, maps, samples, radius, perturbed, skip_changed, generator, chunk_size, output, measure: see :func:`avg_sensitivity`.

    Returns:
        Float tensor [B]; NaN for a map that is all zero.

    Example:
        >>> import torch
        >>> from camkit.metrics import max_sensitivity
        >>> x = torch.ones(1, 1, 4)
        >>> square = lambda inputs, target: inputs[:, 0] ** 2
        >>> max_sensitivity(square, x, 0, perturbed=torch.stack([x + 0.1, x - 0.1]))  # ||1.21 - 1|| / ||1||
        tensor([0.2100])
    """
    return _sensitivity(
        explainer, x, target, "max", model=model, maps=maps, samples=samples, radius=radius, perturbed=perturbed,
        skip_changed=skip_changed, generator=generator, chunk_size=chunk_size, output=output, measure=measure,
    )  # fmt: skip


def local_lipschitz_estimate(
    explainer: Explain,
    x: Tensor,
    target: Target = None,
    *,
    model: nn.Module | None = None,
    maps: Tensor | None = None,
    samples: int = 200,
    mean: float = 0.0,
    std: float = 0.1,
    perturbed: Tensor | None = None,
    skip_changed: bool = False,
    generator: torch.Generator | None = None,
    chunk_size: int = 64,
    output: OutputSelector = None,
    measure: Measure | None = None,
) -> Tensor:
    """Local Lipschitz estimate (Alvarez-Melis and Jaakkola 2018): the steepest change of the map.

    ``max_n ||e(x) - e(x_n)||_2 / ||x - x_n||_2`` with ``x_n = x + N(mean, std^2)`` on every
    value. Needs and costs as :func:`avg_sensitivity` (``samples`` explanations of the batch).

    Args:
        explainer, x, target, model, maps, samples, perturbed, skip_changed, generator, chunk_size, output: see :func:`avg_sensitivity`.
        measure: the change of one perturbation, as in :func:`avg_sensitivity`; ``None``:
            ``||moved - maps||_2 / ||perturbed - x||_2``.
        mean, std: the Gaussian noise.

    Returns:
        Float tensor [B].

    Example:
        >>> import torch
        >>> from camkit.metrics import local_lipschitz_estimate
        >>> x = torch.ones(1, 1, 4)
        >>> double = lambda inputs, target: 2 * inputs[:, 0]  # a linear 'explainer': Lipschitz constant 2
        >>> local_lipschitz_estimate(double, x, 0, samples=5, generator=torch.Generator().manual_seed(0))
        tensor([2.])
    """
    target, maps = unperturbed_maps(explainer, model, x, target, maps, chunk_size, output)
    if not std >= 0:
        raise InvalidInputError(f"std must be >= 0, got {std!r}")
    plan = perturbed_inputs(
        x, perturbed, samples, lambda shape: torch.randn(shape, generator=generator, dtype=torch.float64) * std + mean
    )
    moved = reexplained(explainer, plan, target, chunk_size, maps)
    if measure is not None:
        ratio = _measured(measure, maps, moved, x, plan)
    else:
        ratio = row_norms(moved - maps[None]) / row_norms(plan - x[None])
    skip = prediction_changed(model, x, plan, chunk_size, output) if skip_changed else None
    return reduce_copies(ratio, skip, "max")


def _translate(x: Tensor, shift: int, fill: Tensor) -> Tensor:
    """x [B, C, *S] moved by ``shift`` positions along its last axis, the gap filled with ``fill`` [B]."""
    width = x.shape[-1]
    pad = fill.view(-1, *(1,) * (x.dim() - 1)).expand(*x.shape[:-1], min(abs(shift), width))
    if shift >= 0:
        return torch.cat([pad, x], dim=-1)[..., :width]
    return torch.cat([x, pad], dim=-1)[..., -width:]


def continuity(
    explainer: Explain,
    x: Tensor,
    target: Target = None,
    *,
    model: nn.Module | None = None,
    maps: Tensor | None = None,
    steps: int = 28,
    fill: float | None = None,
    perturbed: Tensor | None = None,
    skip_changed: bool = False,
    chunk_size: int = 64,
    output: OutputSelector = None,
) -> Tensor:
    """Continuity (Montavon et al. 2018): the steepest change of the map as the input slides sideways.

    The input is translated along its last axis (an image's width, a signal's time, a
    volume's W) by ``k * dx`` positions for ``k = 1..steps`` starting from ``-W``, with
    ``dx = (2 W + 1) // steps`` (Quantus's schedule), the gap filled with ``fill`` (``None``:
    each input's minimum, Quantus's ``"black"``); the score is
    ``max_k ||e(x) - e(x_k)||_1 / ||x - x_k||_2``. Deterministic. Needs re-explanation; costs
    ``steps`` explanations of the batch.

    Args:
        explainer, x, target, model, maps, skip_changed, chunk_size, output: see :func:`avg_sensitivity`.
        steps: translations.
        fill: the value shifted in.
        perturbed: a plan of perturbed inputs [N, B, C, *S] instead of the translations (``steps``
            and ``fill`` are then unused): another fill, another direction, another library's.

    Returns:
        Float tensor [B]; translations that leave the input unchanged are left out.

    Example:
        >>> import torch
        >>> from camkit.metrics import continuity
        >>> x = torch.tensor([[[0.0, 1.0, 0.0, 0.0]]])
        >>> identity = lambda inputs, target: inputs[:, 0]
        >>> continuity(identity, x, 0, steps=3)  # shifts -1, 2, 5 (dx = 3): ||d||_1 / ||d||_2 at most sqrt(2)
        tensor([1.4142])
    """
    target, maps = unperturbed_maps(explainer, model, x, target, maps, chunk_size, output)
    if perturbed is not None:
        plan = perturbed_inputs(x, perturbed, 1, lambda shape: torch.zeros(shape))
    else:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InvalidInputError(f"steps must be a positive int, got {steps!r}")
        width = x.shape[-1]
        dx = (2 * width + 1) // steps
        values = x.flatten(1).amin(dim=1) if fill is None else torch.full((x.shape[0],), float(fill), device=x.device)
        plan = torch.stack([_translate(x, -width + dx * k, values) for k in range(1, steps + 1)])
    moved = reexplained(explainer, plan, target, chunk_size, maps)
    l1 = (moved - maps[None]).flatten(2).double().abs().sum(dim=2)
    dist = row_norms(plan - x[None])
    ratio = l1 / torch.where(dist == 0, torch.ones_like(dist), dist)
    skip = dist == 0
    if skip_changed:
        skip = skip | prediction_changed(model, x, plan, chunk_size, output)
    return reduce_copies(ratio, skip, "max")


def consistency(maps: Tensor, predictions: Tensor, *, n: int = 5, labels: Tensor | None = None) -> Tensor:
    """Consistency (Dasgupta et al. 2022): do inputs whose maps look alike get the same prediction?

    Each map is reduced to a discrete label (``labels`` [B], or by default the signs of its
    first ``n`` values in row-major order, Quantus's ``top_n_sign``); for input ``i``, among
    the other inputs ``j`` with the same label, the share predicted as ``i`` is. Needs the
    predictions, no model; one pass over the batch, pairwise [B, B].

    Args:
        maps: maps [B, *S] (any rank).
        predictions: predicted classes [B].
        n: values whose signs make the default label.
        labels: discrete labels [B] (ints) instead of the default.

    Returns:
        Float tensor [B]; NaN for an input whose label no other input shares.

    Example:
        >>> import torch
        >>> from camkit.metrics import consistency
        >>> maps = torch.tensor([[1.0, -1.0], [2.0, -3.0], [1.0, 1.0]])
        >>> consistency(maps, torch.tensor([0, 1, 0]), n=2)  # maps 0 and 1 share the signs (+, -), not the class
        tensor([0., 0., nan])
    """
    maps = check_maps(maps) if maps.dim() in (2, 3, 4) else maps
    batch = maps.shape[0]
    if labels is None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidInputError(f"n must be a positive int, got {n!r}")
        signs = torch.sign(maps.flatten(1)[:, :n])
        same_label = (signs[:, None] == signs[None]).all(dim=2)
    else:
        if labels.shape != (batch,):
            raise InvalidInputError(f"labels must be [B] = [{batch}], got {list(labels.shape)}")
        same_label = labels[:, None] == labels[None]
    predictions = predictions.to(maps.device).reshape(-1)
    if predictions.shape != (batch,):
        raise InvalidInputError(f"predictions must be [B] = [{batch}] classes, got {list(predictions.shape)}")
    others = ~torch.eye(batch, dtype=torch.bool, device=maps.device)
    same_label = same_label.to(maps.device) & others
    agree = (same_label & (predictions[:, None] == predictions[None])).sum(dim=1)
    count = same_label.sum(dim=1)
    share = agree / count.clamp(min=1)
    return torch.where(count == 0, torch.full_like(share, float("nan")), share).float()

