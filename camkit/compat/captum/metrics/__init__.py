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
from .._pack import Layout, Packed, as_tuple, example_args, flat_targets, forward_args, per_example
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

    As in captum, ``perturb_func`` is called on the inputs (and baselines) repeated sample by
    sample (``repeat_interleave``), ``max_examples_per_batch // batch`` samples at a time. camkit
    scores ``f(x - P)``; a ``perturb_func`` whose perturbed inputs are not ``x - I`` times a fixed
    factor (the form captum's decorator gives) is refused. Extra arguments with one row per
    example, and per-example targets, are scored one example at a time.
    """
    xs = as_tuple(inputs)
    layout = Layout(Layout.of(xs).shapes, Layout.of(xs).dtypes, False)
    batch = xs[0].shape[0]
    moves, ratio, lost = _draws(perturb_func, inputs, baselines, xs, layout, n_perturb_samples, max_examples_per_batch)
    dtypes = tuple(x.dtype for x in xs)
    extra = forward_args(additional_forward_args)
    with torch.no_grad():
        row = tuple(forward_func(*(x[:1] for x in xs), *example_args(extra, batch, 0)).shape[1:])
    index = flat_targets(target, row if target is None or has_tuple(target) else (1 << 62,), batch)
    packed = layout.pack(xs)
    maps = layout.pack(as_tuple(attributions)) * ratio
    if bool((lost & (maps != 0)).any()):
        raise NotComputedError(
            "infidelity: a perturbation leaves an input value unchanged where captum's I is not 0 and the attribution "
            "is not 0 (camkit scores f(x - P) against P . a)"
        )
    perturbations = torch.stack(moves, dim=1)
    chunk = max_examples_per_batch or batch * n_perturb_samples
    if not per_example(extra, batch):
        model = Packed(forward_func, layout, extra, dtypes)
        return _infidelity(model, packed, maps, index, perturbations=perturbations, normalize=normalize, chunk_size=chunk)
    scores = []
    for i in range(batch):  # each example with its own rows of the extra arguments
        model = Packed(forward_func, layout, example_args(extra, batch, i), dtypes)
        one = slice(i, i + 1)
        scores.append(_infidelity(model, packed[one], maps[one], index[one], perturbations=perturbations[one],
                                  normalize=normalize, chunk_size=chunk))
    return torch.cat(scores)


def _draws(perturb_func: Callable[..., Any], inputs: Any, baselines: Any, xs: tuple[Tensor, ...], layout: Layout,
           count: int, per_batch: int | None) -> tuple[list[Tensor], Tensor, Tensor]:
    """captum's draws ``(I, x')`` as camkit's: moves ``P = x - x'`` and the factor ``r`` with ``P r = I``.

    captum calls ``perturb_func`` on the inputs repeated ``k`` times each (example-major), ``k``
    samples per call. camkit scores ``f(x - P)`` against ``P . a``; captum scores ``f(x')`` against
    ``I . a``, so the attributions are scaled by ``r = I / P`` (``1 / x`` for captum's decorator
    with ``multiply_by_inputs=True``), which must be the same for every draw of an example.
    Also returns where some draw has ``P = 0`` and ``I != 0`` (allowed where the attribution is 0).
    """
    batch = xs[0].shape[0]
    step = count if per_batch is None else min(max(per_batch // batch, 1), count)
    shifts, moved_all = [], []
    done = 0
    while done < count:
        k = min(step, count - done)
        many = tuple(x.repeat_interleave(k, dim=0) for x in xs)
        call = many if isinstance(inputs, tuple) else many[0]
        if baselines is None:
            shift, moved = perturb_func(call)
        else:
            bases = tuple(b.repeat_interleave(k, dim=0) if isinstance(b, Tensor) and b.dim() > 0 and b.shape[0] == batch
                          and batch > 1 else b for b in as_tuple(baselines))
            shift, moved = perturb_func(call, bases if isinstance(baselines, tuple) else bases[0])
        i = layout.pack([s.expand_as(x) for s, x in zip(as_tuple(shift), many)])
        p = layout.pack([x - m for x, m in zip(many, as_tuple(moved))])
        shifts.append(i.reshape(batch, k, -1))
        moved_all.append(p.reshape(batch, k, -1))
        done += k
    drawn, moves = torch.cat(shifts, dim=1), torch.cat(moved_all, dim=1)
    lost = ((moves == 0) & (drawn != 0)).any(dim=1)  # captum's I . a reads these values, camkit's P . a cannot
    safe = torch.where(moves == 0, torch.ones_like(moves), moves)
    stacked = torch.where(moves == 0, torch.full_like(moves, float("nan")), drawn / safe)
    ratio = torch.nanmean(stacked, dim=1).nan_to_num(1.0)
    spread = (stacked - ratio[:, None]).abs().nan_to_num(0.0)
    if bool((spread > 1e-4 * (1 + ratio[:, None].abs())).any()):
        raise NotComputedError(
            "infidelity: the perturb_func's perturbations are not a fixed multiple of inputs - perturbed inputs; "
            "camkit scores f(x - P) against P . a (write it with captum.metrics.infidelity_perturb_func_decorator)"
        )
    row = layout.pack(xs).shape[1:]
    return list(moves.reshape(batch, count, *row).unbind(dim=1)), ratio.reshape(batch, *row), lost.reshape(batch, *row)


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

    Where an example's attribution is all zero, camkit's relative change is undefined (NaN);
    captum divides by 1 there, giving the largest absolute change of the attribution (0 when it
    stays zero), and so does this translation.
    """
    if norm_ord != "fro":
        raise NotComputedError(f"sensitivity_max(norm_ord={norm_ord!r}): camkit uses the Frobenius norm")
    xs = as_tuple(inputs)
    layout = Layout(Layout.of(xs).shapes, Layout.of(xs).dtypes, False)
    packed = layout.pack(xs)
    seen: list[Tensor] = []  # every map explained, one whole copy of the batch per call

    def explain(batch: Tensor, target: Any = None) -> Tensor:
        parts = tuple(p.to(x.dtype) for p, x in zip(layout.unpack(batch), xs))
        attr = explanation_func(parts if isinstance(inputs, tuple) else parts[0], **kwargs)
        seen.append(layout.pack(as_tuple(attr)).reshape(batch.shape[0], 1, 1, -1))
        return seen[-1]

    perturbed = None
    if perturb_func is not None:
        takes_radius = len(inspect.signature(perturb_func).parameters) > 1  # captum passes the radius when it is taken
        plan = [layout.pack(as_tuple(perturb_func(inputs, perturb_radius) if takes_radius else perturb_func(inputs)))
                for _ in range(n_perturb_samples)]
        perturbed = torch.stack(plan)
    maps = explain(packed).float()  # as camkit reads maps (explain_maps)
    scores = max_sensitivity(explain, packed, 0, maps=maps, samples=n_perturb_samples, radius=perturb_radius,
                             perturbed=perturbed, chunk_size=packed.shape[0])
    zero = maps.reshape(maps.shape[0], -1).abs().sum(dim=1) == 0
    if bool(zero.any()):  # captum's denominator 1: the largest change itself
        moved = torch.stack([m.reshape(m.shape[0], -1) for m in seen[1:]])
        largest = (moved - maps.reshape(1, maps.shape[0], -1)).norm(dim=2).amax(dim=0).to(scores.dtype)
        scores = torch.where(zero, largest, scores)
    return scores
