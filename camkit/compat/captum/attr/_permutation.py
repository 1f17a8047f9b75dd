"""captum's ``FeaturePermutation`` and ``LayerFeaturePermutation``: ``f(x) - f(x with a feature shuffled across the batch)``.

Permutation feature importance runs on :class:`~._ablation.FeatureAblation`'s loop: instead of
putting a feature at its baseline, each perturbed copy of the batch has the feature's values
permuted among the examples (one random order per copy and input, drawn from torch's generator in
captum's order, so a seeded call gives captum's values). A feature whose inputs have fewer than
two examples cannot be permuted and keeps attribution 0, with a logged warning, as in captum.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ....hooks import HookScope
from .._pack import as_tuple, forward_args
from ._ablation import FeatureAblation, FeatureMask
from ._base import LayerAttribution, NotComputedError, PerturbationAttribution
from ._engine import prepare

__all__ = ["FeaturePermutation", "LayerFeaturePermutation", "_permute_feature"]

_log = logging.getLogger(__name__)


def _permute_feature(x: Tensor, feature_mask: Tensor) -> Tensor:
    """``x`` [B, ...] with the positions of ``feature_mask`` (bool, broadcasting to ``x[0]``) in a random order of the batch.

    The order is drawn with ``torch.randperm(B)``, drawn again while it is the identity (captum's
    default ``perm_func``); ``B`` must be at least 2.

    Example:
        >>> import torch
        >>> x = torch.tensor([[1.0, 10.0], [2.0, 20.0]])
        >>> _permute_feature(x, torch.tensor([True, False])).tolist()  # the only other order of two rows
        [[2.0, 10.0], [1.0, 20.0]]
    """
    rows = x.shape[0]
    if rows < 2:
        raise AssertionError("cannot permute features with batch_size = 1")
    same = torch.arange(rows)
    order = torch.randperm(rows)
    while bool((order == same).all()):
        order = torch.randperm(rows)
    inside = feature_mask.to(x.dtype)
    return x[order] * inside + x * feature_mask.bitwise_not().to(x.dtype)


class FeaturePermutation(FeatureAblation):
    """captum's ``FeaturePermutation``: each feature (group of a ``feature_mask``) shuffled across the batch in turn.

    ``perm_func(x, mask)`` makes each shuffled copy (default :func:`_permute_feature`); the batch
    needs at least two examples (with one, the attribution is 0, as in captum).

    Example:
        >>> import torch
        >>> from camkit.compat.captum.attr import FeaturePermutation
        >>> _ = torch.manual_seed(0)
        >>> x = torch.tensor([[1.0, 5.0], [3.0, 5.0]])
        >>> FeaturePermutation(lambda t: t.sum(dim=1)).attribute(x).tolist()  # the constant feature: 0
        [[-2.0, 0.0], [2.0, 0.0]]
    """

    def __init__(self, forward_func: Callable[..., Any],
                 perm_func: Callable[[Tensor, Tensor], Tensor] = _permute_feature) -> None:
        super().__init__(forward_func)
        self.perm_func = perm_func
        self._min_examples_per_batch_grouped = 2

    def attribute(self, inputs: Any, target: Any = None, additional_forward_args: Any = None,  # type: ignore[override]
                  feature_mask: Any = None, perturbations_per_eval: int = 1, show_progress: bool = False,
                  **kwargs: Any) -> Any:
        kwargs.pop("baselines", None)  # captum drops them too: permutation has none
        if kwargs:
            raise NotComputedError(f"FeaturePermutation options {sorted(kwargs)}: not translated")
        xs, bases, extra, masks = prepare(inputs, None, additional_forward_args, feature_mask)
        ids: dict[int, list[int]] = {}
        for i, m in enumerate(masks):
            for value in torch.unique(m).tolist():
                ids.setdefault(int(value), []).append(i)
        features = list(ids)

        def mask_of(feature: int, i: int) -> Tensor | None:
            return masks[i] == features[feature] if i in ids[features[feature]] else None

        out = self._ablate(xs, bases, target, extra, len(features), mask_of, perturbations_per_eval, show_progress)
        return out if isinstance(inputs, tuple) else out[0]

    def _perturbed(self, xs: tuple[Tensor, ...], bases: tuple[Any, ...], chunk: Sequence[int],
                   mask_of: FeatureMask) -> tuple[tuple[Tensor, ...], list[Tensor | None]] | None:
        """One copy of the inputs per feature of ``chunk``, that feature shuffled; None where captum skips the chunk."""
        touched = [i for i in range(len(xs)) if any(mask_of(f, i) is not None for f in chunk)]
        least = self._min_examples_per_batch_grouped
        if least is not None and any(xs[i].shape[0] < least for i in touched):
            _log.warning("Skipping feature group %s since it contains at least one input tensor with 0th dim less "
                         "than %s", list(chunk), least)
            return None
        if all(xs[i].numel() == 0 for i in touched):
            return None
        batch: list[Tensor] = []
        chunk_masks: list[Tensor | None] = []
        for i, x in enumerate(xs):
            if i not in touched:
                batch.append(torch.cat([x] * len(chunk)) if len(chunk) > 1 else x)
                chunk_masks.append(None)
                continue
            found = [mask_of(f, i) for f in chunk]
            empty = torch.zeros_like(next(m for m in found if m is not None), dtype=torch.bool)
            masks = [empty if m is None else m for m in found]  # captum draws an order for each, even an empty one
            batch.append(torch.cat([self.perm_func(x, m.to(x.device)).to(x.dtype) for m in masks]))
            chunk_masks.append(torch.stack(torch.broadcast_tensors(*masks)))
        return tuple(batch), chunk_masks


class LayerFeaturePermutation(LayerAttribution, PerturbationAttribution):
    """captum's ``LayerFeaturePermutation``: :class:`FeaturePermutation` of a layer's output tensors.

    The model runs with the layer's output replaced by the shuffled copies (the inputs repeated
    alongside when several copies go in one call). ``layer_mask`` groups the layer's values as
    ``feature_mask`` groups the inputs'. A ``target`` is selected once from the model's output
    (captum selects it twice and raises an ``AssertionError``).
    """

    def __init__(self, forward_func: Callable[..., Any], layer: nn.Module, device_ids: Any = None) -> None:
        LayerAttribution.__init__(self, forward_func, layer, device_ids)

    def attribute(self, inputs: Any, target: Any = None, additional_forward_args: Any = None,
                  layer_mask: Any = None, perturbations_per_eval: int = 1) -> Any:
        xs, extra = as_tuple(inputs), forward_args(additional_forward_args)
        seen: list[Any] = []
        with torch.no_grad(), HookScope() as scope:
            scope.forward(self.layer, lambda module, args, out: seen.append(out), own_thread=True)
            self.forward_func(*xs, *extra)
        if not seen:
            raise NotComputedError("the layer did not run in the forward pass")
        several = isinstance(seen[-1], tuple)
        values = as_tuple(seen[-1])
        count = len(values)

        def layer_forward(*args: Any) -> Any:
            replaced = args[:count]
            with HookScope() as hooks:
                hooks.forward(self.layer, lambda module, a, out: replaced if several else replaced[0], own_thread=True)
                return self.forward_func(*args[count:])

        attributions = FeaturePermutation(layer_forward).attribute(
            values, target=target, additional_forward_args=(*xs, *extra), feature_mask=layer_mask,
            perturbations_per_eval=perturbations_per_eval)
        return attributions if count > 1 else attributions[0]
