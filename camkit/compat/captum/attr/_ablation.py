"""captum's ``FeatureAblation`` and ``Occlusion``: ``f(x) - f(x with a feature at its baseline)``.

A feature is a 0/1 mask per input (the positions of one id of a feature mask, or one placement of
an occlusion window). Each feature's score drop is spread over its positions; every output value
(one per example, or each value of an output that does not grow with the batch) gets its own
attribution, ``[n_outputs, *input.shape[1:]]``, as in captum. Occlusion's windows overlap, so
each position's sum is divided by the number of windows covering it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .._pack import CaptumInputError
from ._base import NotComputedError
from ._engine import Perturbation, Progress, expand_args, expand_target, prepare, replaced

__all__ = ["FeatureAblation", "Occlusion"]

#: a feature's mask on input ``i`` ([1 or B, *shape]), or None where the feature does not touch it
FeatureMask = Callable[[int, int], "Tensor | None"]


class FeatureAblation(Perturbation):
    """captum's ``FeatureAblation``: each feature (group of a ``feature_mask``) replaced by its baseline in turn.

    Example:
        >>> import torch
        >>> from camkit.compat.captum.attr import FeatureAblation
        >>> net = torch.nn.Linear(3, 1)
        >>> FeatureAblation(net).attribute(torch.ones(2, 3), target=0).shape
        torch.Size([2, 3])
    """

    use_weights = False

    def attribute(self, inputs: Any, baselines: Any = None, target: Any = None, additional_forward_args: Any = None,
                  feature_mask: Any = None, perturbations_per_eval: int = 1, show_progress: bool = False,
                  **kwargs: Any) -> Any:
        if kwargs:
            raise NotComputedError(f"FeatureAblation options {sorted(kwargs)}: not translated")
        xs, bases, extra, masks = prepare(inputs, baselines, additional_forward_args, feature_mask)
        ids: dict[int, list[int]] = {}
        for i, m in enumerate(masks):
            for value in torch.unique(m).tolist():
                ids.setdefault(int(value), []).append(i)
        features = [f for f, where in ids.items() if any(xs[i].numel() for i in where)]

        def mask_of(feature: int, i: int) -> Tensor | None:
            return (masks[i] == features[feature]).long() if i in ids[features[feature]] else None

        out = self._ablate(xs, bases, target, extra, len(features), mask_of, perturbations_per_eval, show_progress)
        return out if isinstance(inputs, tuple) else out[0]

    def _ablate(self, xs: tuple[Tensor, ...], bases: tuple[Any, ...], target: Any, extra: tuple[Any, ...],
                count: int, mask_of: FeatureMask, per_eval: int, show: bool) -> tuple[Tensor, ...]:
        """Sum each feature's drop ``f(x) - f(x ablated)`` over its positions, per output value."""
        if not isinstance(per_eval, int) or per_eval < 1:
            raise CaptumInputError(f"perturbations_per_eval must be an integer >= 1, got {per_eval!r}")
        progress = Progress(self.get_name(), math.ceil(count / per_eval) + 1, show)
        with torch.no_grad():
            initial = self.evaluate(xs, target, extra)
            progress.update()
            outputs = initial.numel()
            totals = [torch.zeros(outputs, *x.shape[1:], dtype=initial.dtype, device=x.device) for x in xs]
            weights = [torch.zeros(outputs, *x.shape[1:], device=x.device) for x in xs]
            checked = False
            for start in range(0, count, per_eval):
                chunk = range(start, min(count, start + per_eval))
                made = self._perturbed(xs, bases, chunk, mask_of)
                if made is None:  # a chunk the method skips
                    continue
                batch, chunk_masks = made
                k = len(chunk)
                modified = self.evaluate(batch, expand_target(target, k), expand_args(extra, k))
                if not checked:
                    _check_grows(initial, modified, k, xs[0].shape[0], per_eval)
                    checked = True
                drop = (initial.reshape(1, -1) - modified.reshape(-1, outputs)).reshape(k, outputs)
                for total, weight, masks, x in zip(totals, weights, chunk_masks, xs):
                    if masks is None or x.numel() == 0:
                        continue
                    total += (drop.reshape(k, outputs, *(1,) * (x.dim() - 1)).to(total.device) * masks.to(total.dtype)).sum(0)
                    weight += masks.float().sum(0)
                progress.update()
        progress.close()
        if self.use_weights:
            return tuple(t / w.to(t.dtype if t.is_floating_point() else torch.float32) for t, w in zip(totals, weights))
        return tuple(totals)

    def _perturbed(self, xs: tuple[Tensor, ...], bases: tuple[Any, ...], chunk: Sequence[int],
                   mask_of: FeatureMask) -> tuple[tuple[Tensor, ...], list[Tensor | None]] | None:
        """The perturbed copies of the inputs for the features of ``chunk`` and their masks (None: skip the chunk)."""
        return _ablated(xs, bases, chunk, mask_of)


def _ablated(xs: tuple[Tensor, ...], bases: tuple[Any, ...], chunk: Sequence[int],
             mask_of: FeatureMask) -> tuple[tuple[Tensor, ...], list[Tensor | None]]:
    """The inputs repeated once per feature of ``chunk``, each copy with its feature at the baseline."""
    batch: list[Tensor] = []
    chunk_masks: list[Tensor | None] = []
    for i, (x, base) in enumerate(zip(xs, bases)):
        masks = [mask_of(f, i) for f in chunk]
        if all(m is None for m in masks):
            batch.append(torch.cat([x] * len(chunk)) if len(chunk) > 1 else x)
            chunk_masks.append(None)
            continue
        full = [m if m is not None else torch.zeros((1, *x.shape[1:]), dtype=torch.long, device=x.device) for m in masks]
        batch.append(torch.cat([replaced(x, base, m) for m in full]))
        chunk_masks.append(torch.stack(torch.broadcast_tensors(*full)))
    return tuple(batch), chunk_masks


def _check_grows(initial: Tensor, modified: Tensor, copies: int, examples: int, per_eval: int) -> None:
    """With several perturbations per call, the output must grow with the batch (captum's AssertionError)."""
    if per_eval <= 1:
        return
    if initial.dim() == 0 or modified.dim() == 0 or modified.shape[0] != copies * initial.shape[0]:
        raise CaptumInputError(
            f"perturbations_per_eval={per_eval} needs an output whose first axis grows with the batch: "
            f"{list(initial.shape)} for {examples} examples, {list(modified.shape)} for {copies * examples}; "
            "pass perturbations_per_eval=1 for a forward function that returns one value for the whole batch"
        )


def _per_input(value: Any, xs: tuple[Tensor, ...], name: str) -> tuple[tuple[int, ...], ...]:
    """Window shapes or strides: one tuple per input (a single tuple or int for a single input)."""
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        items = value
    elif len(xs) == 1:
        items = (value,)
    else:
        items = (value,) * len(xs) if isinstance(value, int) else tuple(value)
    if len(items) != len(xs):
        raise CaptumInputError(f"{name}: {len(items)} entries for {len(xs)} inputs; give one per input")
    out = []
    for item, x in zip(items, xs):
        shape = tuple(x.shape[1:])
        entry = (item,) * len(shape) if isinstance(item, int) else tuple(item)
        if len(entry) != len(shape):
            raise CaptumInputError(f"{name} {entry} must have one entry per axis of the input's example {list(shape)}")
        out.append(entry)
    return tuple(out)


class Occlusion(FeatureAblation):
    """captum's ``Occlusion``: a window of the baseline slid over every axis of each input (channels included).

    The window moves by ``strides`` from the first position; a last placement may reach past the
    far edge (captum's placements), and each position's attribution is the mean drop of the
    windows that cover it.

    Example:
        >>> import torch
        >>> from camkit.compat.captum.attr import Occlusion
        >>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
        >>> Occlusion(net).attribute(torch.ones(1, 1, 4, 4), sliding_window_shapes=(1, 2, 2), target=1).shape
        torch.Size([1, 1, 4, 4])
    """

    use_weights = True

    def attribute(self, inputs: Any, sliding_window_shapes: Any, strides: Any = None,  # type: ignore[override]
                  baselines: Any = None, target: Any = None, additional_forward_args: Any = None,
                  perturbations_per_eval: int = 1, show_progress: bool = False) -> Any:
        xs, bases, extra, _ = prepare(inputs, baselines, additional_forward_args, None)
        windows = _per_input(sliding_window_shapes, xs, "sliding_window_shapes")
        steps = _per_input(1 if strides is None else strides, xs, "strides")
        grids = []
        for x, window, stride in zip(xs, windows, steps):
            room = [n - w for n, w in zip(x.shape[1:], window)]
            if any(r < 0 for r in room):
                raise CaptumInputError(f"Sliding window dimensions {window} cannot exceed input dimensions {tuple(x.shape[1:])}")
            if any(r > 0 and s > w for r, s, w in zip(room, stride, window)):
                raise CaptumInputError(f"Stride dimension {stride} cannot be larger than sliding window shape dimension {window}")
            grids.append([math.ceil(r / s) + 1 for r, s in zip(room, stride)])
        owner = [i for i, grid in enumerate(grids) for _ in range(math.prod(grid))]
        first = [sum(math.prod(g) for g in grids[:i]) for i in range(len(grids))]

        def mask_of(feature: int, i: int) -> Tensor | None:
            if owner[feature] != i:
                return None
            return _window(xs[i], feature - first[i], windows[i], steps[i], grids[i])

        out = self._ablate(xs, bases, target, extra, len(owner), mask_of, perturbations_per_eval, show_progress)
        return out if isinstance(inputs, tuple) else out[0]

    def attribute_future(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("attribute_future is not implemented for Occlusion")


def _window(x: Tensor, number: int, window: tuple[int, ...], stride: tuple[int, ...], grid: list[int]) -> Tensor:
    """The mask [1, *x.shape[1:]] of window placement ``number`` (the first axis counting fastest)."""
    mask = torch.zeros((1, *x.shape[1:]), dtype=torch.long, device=x.device)
    index: list[slice] = [slice(None)]
    for count, step, size in zip(grid, stride, window):
        offset = (number % count) * step
        number //= count
        index.append(slice(offset, offset + size))
    mask[tuple(index)] = 1
    return mask
