"""captum 0.9.0's ``captum.metrics`` on :mod:`camkit.metrics`: ``infidelity`` and ``sensitivity_max``.

The inputs (a tensor or a tuple) are packed into one batch as for the attributions
(:mod:`camkit.compat.captum._pack`); the perturbations are captum's own ``perturb_func``'s.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import wraps
from typing import Any

import torch
from torch import Tensor

from ....metrics import infidelity as _infidelity
from ....metrics import max_sensitivity
from .._pack import Layout, Packed, as_tuple, flat_targets, forward_args
from ..attr._base import NotComputedError, has_tuple

__all__ = ["default_perturb_func", "infidelity", "infidelity_perturb_func_decorator", "sensitivity_max"]


def infidelity_perturb_func_decorator(multiply_by_inputs: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """captum's decorator: a function returning perturbed inputs becomes one returning ``(I, x - I')``."""

    def decorator(pertub_func: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(pertub_func)
        def default_perturb_func(inputs: Any, baselines: Any = None) -> Any:
            xs = as_tuple(inputs)
            moved = pertub_func(inputs) if baselines is None else pertub_func(inputs, baselines)
            moved_t = as_tuple(moved)
            if multiply_by_inputs:
                bases = as_tuple(baselines) if baselines is not None else (0.0,) * len(xs)
                spans = tuple(x - b for x, b in zip(xs, bases))
                shift = tuple((x - m) / torch.where(d == 0, torch.ones_like(d), d) for x, m, d in zip(xs, moved_t, spans))
            else:
                shift = tuple(x - m for x, m in zip(xs, moved_t))
            return (shift, moved) if isinstance(inputs, tuple) else (shift[0], moved_t[0])

        return default_perturb_func

    return decorator


def infidelity(
    forward_func: Callable[..., Any],
    perturb_func: Callable[..., Any],
    inputs: Any,
    attributions: Any,
    baselines: Any = None,
    additional_forward_args: Any = None,
    target: Any = None,
    n_perturb_samples: int = 10,
    max_examples_per_batch: int | None = None,
    normalize: bool = False,
) -> Tensor:
    """captum's ``infidelity`` on :func:`camkit.metrics.infidelity`, with captum's perturbations.

    camkit scores ``f(x - I)``; a ``perturb_func`` whose perturbed inputs are not ``x - I`` (the
    form captum's decorator gives) is refused.
    """
    if baselines is not None:
        raise NotComputedError("infidelity with baselines: camkit's infidelity perturbs the inputs only")
    xs = as_tuple(inputs)
    layout = Layout(Layout.of(xs).shapes, Layout.of(xs).dtypes, False)
    moves, ratio = _draws(perturb_func, inputs, xs, layout, n_perturb_samples)
    dtypes = tuple(x.dtype for x in xs)
    model = Packed(forward_func, layout, forward_args(additional_forward_args), dtypes)
    packed = layout.pack(xs)
    with torch.no_grad():
        row = tuple(forward_func(*(x[:1] for x in xs), *forward_args(additional_forward_args)).shape[1:])
    index = flat_targets(target, row if target is None or has_tuple(target) else (1 << 62,), packed.shape[0])
    maps = layout.pack(as_tuple(attributions)) * ratio
    perturbations = torch.stack(moves, dim=1)
    chunk = max_examples_per_batch or packed.shape[0] * n_perturb_samples
    return _infidelity(model, packed, maps, index, perturbations=perturbations, normalize=normalize, chunk_size=chunk)


def _draws(perturb_func: Callable[..., Any], inputs: Any, xs: tuple[Tensor, ...], layout: Layout,
           count: int) -> tuple[list[Tensor], Tensor]:
    """captum's draws ``(I, x')`` as camkit's: moves ``P = x - x'`` and the factor ``r`` with ``P r = I``.

    camkit scores ``f(x - P)`` against ``P . a``; captum scores ``f(x')`` against ``I . a``, so the
    attributions are scaled by ``r = I / P`` (``1 / x`` for captum's decorator with
    ``multiply_by_inputs=True``), which must be the same for every draw.
    """
    moves, ratios = [], []
    for _ in range(count):
        shift, moved = perturb_func(inputs)
        i = layout.pack([s.expand_as(x) for s, x in zip(as_tuple(shift), xs)])
        p = layout.pack([x - m for x, m in zip(xs, as_tuple(moved))])
        if bool(((p == 0) & (i != 0)).any()):
            raise NotComputedError("infidelity: a perturbation that leaves the input unchanged where captum's I is not 0")
        moves.append(p)
        ratios.append(torch.where(p == 0, torch.full_like(p, float("nan")), i / torch.where(p == 0, torch.ones_like(p), p)))
    stacked = torch.stack(ratios)
    ratio = torch.nanmean(stacked, dim=0).nan_to_num(1.0)
    spread = (stacked - ratio).abs().nan_to_num(0.0)
    if bool((spread > 1e-4 * (1 + ratio.abs())).any()):
        raise NotComputedError(
            "infidelity: the perturb_func's perturbations are not a fixed multiple of inputs - perturbed inputs; "
            "camkit scores f(x - P) against P . a (write it with captum.metrics.infidelity_perturb_func_decorator)"
        )
    return moves, ratio


def default_perturb_func(inputs: Any, perturb_radius: float = 0.02) -> Any:
    """captum's default perturbation for ``sensitivity_max``: uniform noise in ``[-radius, radius]`` on every value."""
    moved = tuple(x + torch.empty_like(x).uniform_(-perturb_radius, perturb_radius) for x in as_tuple(inputs))
    return moved if isinstance(inputs, tuple) else moved[0]


def sensitivity_max(
    explanation_func: Callable[..., Any],
    inputs: Any,
    perturb_func: Callable[..., Any] | None = None,
    perturb_radius: float = 0.02,
    n_perturb_samples: int = 10,
    norm_ord: str = "fro",
    max_examples_per_batch: int | None = None,
    **kwargs: Any,
) -> Tensor:
    """captum's ``sensitivity_max`` on :func:`camkit.metrics.max_sensitivity`.

    Differences: where an example's attribution is all zero, camkit returns NaN (captum divides by 1).
    """
    if norm_ord != "fro":
        raise NotComputedError(f"sensitivity_max(norm_ord={norm_ord!r}): camkit uses the Frobenius norm")
    xs = as_tuple(inputs)
    layout = Layout(Layout.of(xs).shapes, Layout.of(xs).dtypes, False)
    packed = layout.pack(xs)

    def explain(batch: Tensor, target: Any = None) -> Tensor:
        parts = tuple(p.to(x.dtype) for p, x in zip(layout.unpack(batch), xs))
        attr = explanation_func(parts if isinstance(inputs, tuple) else parts[0], **kwargs)
        return layout.pack(as_tuple(attr)).reshape(batch.shape[0], 1, 1, -1)

    perturbed = None
    if perturb_func is not None:
        takes_radius = len(inspect.signature(perturb_func).parameters) > 1  # captum passes the radius when it is taken
        plan = [layout.pack(as_tuple(perturb_func(inputs, perturb_radius) if takes_radius else perturb_func(inputs)))
                for _ in range(n_perturb_samples)]
        perturbed = torch.stack(plan)
    return max_sensitivity(explain, packed, 0, samples=n_perturb_samples, radius=perturb_radius,
                           perturbed=perturbed, chunk_size=packed.shape[0])
