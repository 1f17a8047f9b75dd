"""captum's ``ShapleyValueSampling`` and ``ShapleyValues``: features added to the baseline in random (or every) order.

Each order's prefixes are scored from the baseline (no feature) to the inputs (every feature); a
feature's value is the mean of its score gain over the orders
(:func:`camkit.functional.regions.shapley_from_permutations`). The orders are drawn as captum
draws them, one ``torch.randperm`` of the feature count per sample from torch's global generator,
so a seeded call reproduces captum's estimate; ``ShapleyValues`` takes every order.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import Tensor

from ....functional.regions import shapley_from_permutations
from .._pack import CaptumInputError
from ._base import NotComputedError
from ._engine import Perturbation, Progress, expand_args, expand_target, prepare

__all__ = ["ShapleyValueSampling", "ShapleyValues", "spread"]


def _strict(out: Tensor) -> Tensor:
    return out.reshape(1) if out.dim() == 0 else out


def _aggregated(initial: Tensor, examples: int, per_eval: int, masks: tuple[Tensor, ...]) -> bool:
    """Whether the output is one value for the whole batch (then every example is perturbed at once)."""
    if initial.numel() == 1 and examples > 1:
        if per_eval != 1:
            raise CaptumInputError("Cannot have perturbations_per_eval > 1 when function returns scalar.")
        if any(m.shape[0] != 1 for m in masks):
            raise CaptumInputError("Cannot provide different masks for each example when function returns a scalar.")
        return True
    return per_eval == 1


def spread(values: Tensor, mask: Tensor, x: Tensor, out_shape: tuple[int, ...]) -> Tensor:
    """Feature values [M, *out_shape] laid on one input's positions: [*out_shape, *x.shape[1:]].

    ``mask`` [1 or B, ...] holds each position's feature id; with one mask per example, row ``b``
    of the output reads example ``b``'s mask.
    """
    mask = mask.expand(mask.shape[0], *x.shape[1:]).long()
    flat = values.reshape(values.shape[0], -1)  # [M, K]
    if mask.shape[0] == 1:
        gathered = flat[mask[0]]  # [*s, K]
        return gathered.movedim(-1, 0).reshape(*out_shape, *x.shape[1:])
    if mask.shape[0] != out_shape[0]:
        raise CaptumInputError(f"one feature mask per example ({mask.shape[0]}) for an output {list(out_shape)}")
    per_row = flat.reshape(flat.shape[0], out_shape[0], -1)  # [M, B, R]
    rows = torch.arange(mask.shape[0], device=mask.device).reshape(-1, *(1,) * (mask.dim() - 1))
    gathered = per_row[mask, rows.expand_as(mask)]  # [B, *s, R]
    return gathered.movedim(-1, 1).reshape(*out_shape, *x.shape[1:])


class ShapleyValueSampling(Perturbation):
    """captum's ``ShapleyValueSampling``: the mean marginal gain of each feature over ``n_samples`` random orders.

    Example:
        >>> import torch
        >>> from camkit.compat.captum.attr import ShapleyValueSampling
        >>> net = torch.nn.Linear(3, 2)
        >>> x = torch.tensor([[1.0, 2.0, 3.0]])
        >>> torch.allclose(ShapleyValueSampling(net).attribute(x, target=0, n_samples=4), x * net.weight[0])
        True
    """

    def attribute(self, inputs: Any, baselines: Any = None, target: Any = None, additional_forward_args: Any = None,
                  feature_mask: Any = None, n_samples: int = 25, perturbations_per_eval: int = 1,
                  show_progress: bool = False) -> Any:
        if not isinstance(perturbations_per_eval, int) or perturbations_per_eval < 1:
            raise CaptumInputError(f"perturbations_per_eval must be an integer >= 1, got {perturbations_per_eval!r}")
        xs, bases, extra, masks = prepare(inputs, baselines, additional_forward_args, feature_mask)
        count = int(max(int(m.max()) for m in masks if m.numel())) + 1
        orders = self._orders(count, n_samples)
        progress = Progress(self.get_name(), math.ceil(count / perturbations_per_eval) * orders.shape[0] + 1,
                            show_progress)
        start = tuple(_filled(b, x) for b, x in zip(bases, xs))
        with torch.no_grad():
            initial = _strict(self.evaluate(start, target, extra))
            progress.update()
            aggregated = _aggregated(initial, xs[0].shape[0], perturbations_per_eval, masks)
            values = [self._prefix_scores(order, xs, start, masks, initial, target, extra, perturbations_per_eval,
                                          aggregated, progress) for order in orders.tolist()]
        progress.close()
        scores = torch.stack(values)  # [P, M + 1, *out]
        dtype = scores.dtype if scores.is_floating_point() else torch.float32
        phi = shapley_from_permutations(orders, scores.reshape(*scores.shape[:2], -1).to(dtype))
        out = tuple(spread(phi, m, x, tuple(initial.shape)) for m, x in zip(masks, xs))
        return out if isinstance(inputs, tuple) else out[0]

    def _orders(self, count: int, samples: int) -> Tensor:
        return torch.stack([torch.randperm(count) for _ in range(samples)])

    def _prefix_scores(self, order: list[int], xs: tuple[Tensor, ...], start: tuple[Tensor, ...],
                       masks: tuple[Tensor, ...], initial: Tensor, target: Any, extra: tuple[Any, ...],
                       per_eval: int, aggregated: bool, progress: Progress) -> Tensor:
        """Scores [M + 1, *out] of the prefixes of one order: the baseline first, then one feature more each."""
        prefixes, current = [], start
        for feature in order:
            current = tuple(torch.where(m == feature, x, c) if bool((m == feature).any()) else c
                            for m, x, c in zip(masks, xs, current))
            prefixes.append(current)
        scores = [initial]
        for i in range(0, len(prefixes), per_eval):
            chunk = prefixes[i : i + per_eval]
            batch = tuple(torch.cat(parts) for parts in zip(*chunk)) if len(chunk) > 1 else chunk[0]
            out = _strict(self.evaluate(batch, expand_target(target, len(chunk)), expand_args(extra, len(chunk))))
            if not aggregated and len(chunk) > 1 and out.shape[0] != len(chunk) * initial.shape[0]:
                raise CaptumInputError(f"perturbations_per_eval > 1 needs an output that grows with the batch, got {list(out.shape)}")
            scores.extend(out.reshape(len(chunk), *initial.shape).unbind(0))
            progress.update()
        return torch.stack(scores)


class ShapleyValues(ShapleyValueSampling):
    """captum's exact ``ShapleyValues``: every order of the features (M! orders; for a few features only).

    Example:
        >>> import torch
        >>> from camkit.compat.captum.attr import ShapleyValues
        >>> f = lambda x: (x[:, 0] * x[:, 1])[:, None]  # v({0,1}) = 6, alone 0: 3 each
        >>> ShapleyValues(f).attribute(torch.tensor([[2.0, 3.0]]), target=0).tolist()
        [[3.0, 3.0]]
    """

    def attribute(self, inputs: Any, baselines: Any = None, target: Any = None,  # type: ignore[override]
                  additional_forward_args: Any = None, feature_mask: Any = None, perturbations_per_eval: int = 1,
                  show_progress: bool = False) -> Any:
        return super().attribute(inputs, baselines, target, additional_forward_args, feature_mask, 0,
                                 perturbations_per_eval, show_progress)

    def _orders(self, count: int, samples: int) -> Tensor:
        if count > 10:
            raise NotComputedError(f"ShapleyValues over {count} features: camkit enumerates every order for at most 10 "
                                   f"features ({math.factorial(count)} orders here); use ShapleyValueSampling or "
                                   "group features with a feature_mask")
        return torch.tensor(list(itertools.permutations(range(count))), dtype=torch.long)


def _filled(base: Any, x: Tensor) -> Tensor:
    """The baseline as a tensor like ``x`` (captum's ``_tensorize_baseline``)."""
    if isinstance(base, Tensor):
        return base.expand(x.shape[0], *base.shape[1:]).clone() if base.dim() == x.dim() and base.shape[0] == 1 < x.shape[0] else base
    return torch.full_like(x, base)
