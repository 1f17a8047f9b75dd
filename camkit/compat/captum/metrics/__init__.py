"""captum 0.9.0's ``captum.metrics`` on :mod:`camkit.metrics`: ``infidelity`` and ``sensitivity_max``.

The inputs (a tensor or a tuple) are packed into one batch as for the attributions
(:mod:`camkit.compat.captum._pack`); the perturbations are captum's own ``perturb_func``'s, drawn as captum draws them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import replace
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

    ``perturb_func`` is called as captum calls it: on the inputs (and baselines) with each example
    repeated ``n_perturb_samples`` times (fewer per call under ``max_examples_per_batch``), and
    returns the perturbations ``I`` and the perturbed inputs ``x'``. camkit scores ``f(x - P)``
    against ``P . a``; the packed inputs carry a second copy of every position that the model never
    sees, so that ``P`` moves the real positions to ``x'`` while its dot product with the
    attributions, read on the second copy, is ``I . a``.

    Example:
        >>> import torch
        >>> net = torch.nn.Linear(3, 1)
        >>> x = torch.rand(2, 3)
        >>> perturb = lambda inputs: (torch.ones_like(inputs), inputs - 1)   # I = 1, x' = x - 1
        >>> infidelity(net, perturb, x, net.weight.detach().expand(2, 3), target=0).abs().max() < 1e-6
        tensor(True)
    """
    xs = as_tuple(inputs)
    extra = forward_args(additional_forward_args)
    batch = xs[0].shape[0]
    if per_example(extra, batch):
        return torch.cat([
            infidelity(forward_func, perturb_func, _pick(inputs, i), _pick(attributions, i), _pick(baselines, i),
                       example_args(extra, batch, i), _pick_target(target, i, batch), n_perturb_samples,
                       max_examples_per_batch, normalize)
            for i in range(batch)
        ])
    base = Layout(Layout.of(xs).shapes, Layout.of(xs).dtypes, False)
    size = sum(base.sizes)
    layout = replace(base, anchor=size)
    shifts, moved = _draws(perturb_func, inputs, baselines, xs, n_perturb_samples, max_examples_per_batch)
    dtypes = tuple(x.dtype for x in xs)
    model = Packed(forward_func, layout, extra, dtypes)
    packed = base.pack(xs)
    rows = packed.reshape(batch, -1)
    x_aug = torch.cat([rows, torch.zeros_like(rows)], dim=1).reshape(batch, 1, 1, 1, -1)
    attr = base.pack([a.expand_as(x) for a, x in zip(as_tuple(attributions), xs)]).reshape(batch, -1)
    maps = torch.cat([torch.zeros_like(attr), attr], dim=1).reshape(batch, 1, 1, 1, -1)
    moves = torch.cat([rows[:, None] - moved, shifts], dim=2).reshape(batch, n_perturb_samples, 1, 1, 1, -1)
    with torch.no_grad():
        row = tuple(forward_func(*(x[:1] for x in xs), *extra).shape[1:])
    index = flat_targets(target, row if target is None or has_tuple(target) else (1 << 62,), batch)
    return _infidelity(model, x_aug, maps.to(x_aug.dtype), index, perturbations=moves.to(x_aug.dtype),
                       normalize=normalize, chunk_size=batch * n_perturb_samples)


def _pick(arg: Any, i: int) -> Any:
    """Example ``i`` of a tensor or tuple argument (tensors with one row are shared)."""
    if arg is None or not isinstance(arg, (Tensor, tuple)):
        return arg
    items = tuple(a[i : i + 1] if isinstance(a, Tensor) and a.dim() > 0 and a.shape[0] > 1 else a for a in as_tuple(arg))
    return items if isinstance(arg, tuple) else items[0]


def _pick_target(target: Any, i: int, batch: int) -> Any:
    if isinstance(target, (list, Tensor)) and len(target) == batch and batch > 1:
        return target[i : i + 1]
    return target


def _draws(perturb_func: Callable[..., Any], inputs: Any, baselines: Any, xs: tuple[Tensor, ...], count: int,
           max_examples: int | None) -> tuple[Tensor, Tensor]:
    """captum's draws, ``I`` and ``x'`` packed [B, count, N], from calls on the inputs repeated per draw."""
    batch = xs[0].shape[0]
    step = count if max_examples is None else min(max(max_examples // batch, 1), count)
    layout = Layout(Layout.of(xs).shapes, Layout.of(xs).dtypes, False)
    shifts, moved = [], []
    done = 0
    while done < count:
        n = min(step, count - done)
        done += n
        grown = tuple(x.repeat_interleave(n, dim=0) for x in xs)
        args: list[Any] = [grown if isinstance(inputs, tuple) else grown[0]]
        if baselines is not None:
            bases = tuple(b.repeat_interleave(n, dim=0) if isinstance(b, Tensor) and b.dim() and b.shape[0] == batch > 1
                          else b for b in as_tuple(baselines))
            args.append(bases if isinstance(baselines, tuple) else bases[0])
        shift, pert = perturb_func(*args)
        shifts.append(layout.pack([s.expand_as(x) for s, x in zip(as_tuple(shift), grown)]).reshape(batch, n, -1))
        moved.append(layout.pack([p.expand_as(x) for p, x in zip(as_tuple(pert), grown)]).reshape(batch, n, -1))
    return torch.cat(shifts, dim=1), torch.cat(moved, dim=1)


def default_perturb_func(inputs: Any, perturb_radius: float = 0.02) -> tuple[Tensor, ...]:
    """captum's default perturbation for ``sensitivity_max``: uniform noise in ``[-radius, radius]`` on every value.

    The noise is drawn in float32 from torch's generator, as captum draws it; the result is a tuple.
    """
    return tuple(x + torch.empty(x.shape, dtype=torch.float32).uniform_(-perturb_radius, perturb_radius).to(x.device)
                 for x in as_tuple(inputs))


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

    The perturbed inputs are drawn by ``perturb_func`` (by default uniform noise in
    ``[-perturb_radius, perturb_radius]`` from torch's generator), called as captum calls it: on the
    inputs with each example repeated ``n_perturb_samples`` times (fewer per call under
    ``max_examples_per_batch``), so a seeded call draws captum's perturbations. Where an example's attribution is
    all zero, the change is divided by 1, as captum does (camkit's own metric returns NaN there).

    Example:
        >>> import torch
        >>> explain = lambda x: x ** 2
        >>> x = torch.ones(2, 3)
        >>> s = sensitivity_max(explain, x, perturb_func=lambda inp: inp + 0.1, n_perturb_samples=2)
        >>> torch.allclose(s, torch.full((2,), 0.21), atol=1e-5)   # ||1.21 - 1|| / ||1|| per example
        True
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

    perturbed = _sensitivity_draws(perturb_func or default_perturb_func, xs, layout, perturb_radius,
                                   n_perturb_samples, max_examples_per_batch)
    result = max_sensitivity(explain, packed, 0, samples=n_perturb_samples, radius=perturb_radius,
                             perturbed=perturbed, chunk_size=packed.shape[0])
    return _zero_maps_divided_by_one(result, explain, packed, perturbed)


def _sensitivity_draws(draw: Callable[..., Any], xs: tuple[Tensor, ...], layout: Layout, radius: float, count: int,
                       max_examples: int | None) -> Tensor:
    """Perturbed inputs [count, B, ...packed], drawn as captum draws them: on the inputs repeated per draw."""
    batch = xs[0].shape[0]
    step = count if max_examples is None else min(max(max_examples // batch, 1), count)
    takes_radius = len(inspect.signature(draw).parameters) > 1  # captum passes the radius when it is taken
    parts, done = [], 0
    while done < count:
        n = min(step, count - done)
        done += n
        grown = tuple(x.repeat_interleave(n, dim=0) for x in xs)
        arg = grown if len(grown) > 1 else grown[0]
        moved = as_tuple(draw(arg, radius) if takes_radius else draw(arg))
        parts.append(layout.pack([m.expand_as(x) for m, x in zip(moved, grown)]).reshape(batch, n, -1))
    return torch.cat(parts, dim=1).transpose(0, 1).reshape(count, batch, *layout.pack([x[:1] for x in xs]).shape[1:])


def _zero_maps_divided_by_one(result: Tensor, explain: Callable[..., Tensor], packed: Tensor, perturbed: Tensor) -> Tensor:
    """Where an example's attribution is all zero, captum divides by 1: ``max_n ||e(x_n)||`` there (camkit: NaN)."""
    if not bool(torch.isnan(result).any()):
        return result
    with torch.no_grad():
        zero = explain(packed).reshape(packed.shape[0], -1).abs().amax(dim=1) == 0
        if not bool(zero.any()):
            return result
        norms = torch.stack([explain(p).reshape(p.shape[0], -1).double().norm(dim=1) for p in perturbed])
    return torch.where(zero, norms.amax(dim=0).to(result.dtype), result)
