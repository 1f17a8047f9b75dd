"""captum's perturbation attributions on camkit's: Occlusion, and the region methods over feature masks.

captum's features are single input elements unless a ``feature_mask`` groups them; camkit's region
methods remove regions of positions. The translation lays every element of the inputs on its own
position (the packed layout of :mod:`camkit.compat.captum._pack`) and passes the feature ids as
camkit's regions, so a region is exactly one of captum's features.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .... import methods as km
from ....methods import Explainer
from .._pack import Layout, baselines_like
from ._ablation import FeatureAblation, Occlusion
from ._base import NotComputedError, PerturbationAttribution
from ._shapley import ShapleyValues, ShapleyValueSampling

__all__ = ["FeatureAblation", "KernelShap", "Lime", "Occlusion", "ShapleyValueSampling", "ShapleyValues"]


def _elementwise(inputs: Any) -> tuple[tuple[Tensor, ...], Layout]:
    xs = inputs if isinstance(inputs, tuple) else (inputs,)
    layout = Layout.of(xs)
    if layout.as_is:  # every element its own position, channels included
        layout = Layout(layout.shapes, layout.dtypes, False)
    return xs, layout


def _feature_ids(feature_mask: Any, xs: tuple[Tensor, ...], layout: Layout) -> Tensor:
    """captum's feature mask (one int tensor per input, ids shared across inputs) as region ids [B, 1, 1, N]."""
    batch = xs[0].shape[0]
    if feature_mask is None:
        total = sum(layout.sizes)
        return torch.arange(total).expand(batch, total).reshape(batch, 1, 1, total)
    masks = feature_mask if isinstance(feature_mask, tuple) else (feature_mask,)
    if len(masks) != len(xs):
        raise NotComputedError(f"{len(masks)} feature masks for {len(xs)} inputs")
    ids = [m.long().expand_as(x) for m, x in zip(masks, xs)]
    return layout.pack(ids, dtype=torch.long).reshape(batch, 1, 1, -1)


class _Regions(PerturbationAttribution):
    """A captum perturbation method that maps onto one of camkit's region explainers."""

    def _region_explainer(self, model: nn.Module, ids: Tensor, base: Tensor, batch: int, **options: Any) -> Explainer:
        raise NotImplementedError

    def _attribute(self, inputs: Any, baselines: Any, target: Any, extra: Any, feature_mask: Any,
                   perturbations_per_eval: int, **options: Any) -> Any:
        xs, layout = _elementwise(inputs)
        ids = _feature_ids(feature_mask, xs, layout)
        bases = layout.pack(baselines_like(baselines, xs))
        state = {"layout": layout}

        def build(model: nn.Module, _layout: Layout, x: Tensor, example: int) -> Explainer:
            rows = ids if example < 0 else ids[example : example + 1]
            base = bases if example < 0 else bases[example : example + 1]
            return self._region_explainer(model, rows, base, max(1, perturbations_per_eval), **options)

        self._layout_override = state["layout"]
        try:
            raw, _ = self._run(inputs, target, extra, build)
        finally:
            del self._layout_override
        return raw


class KernelShap(_Regions):
    """captum's ``KernelShap`` on :class:`camkit.KernelShap` (camkit's own coalitions and regression)."""

    def attribute(self, inputs: Any, baselines: Any = None, target: Any = None, additional_forward_args: Any = None,
                  feature_mask: Any = None, n_samples: int = 25, perturbations_per_eval: int = 1,
                  return_input_shape: bool = True, show_progress: bool = False) -> Any:
        if not return_input_shape:
            raise NotComputedError("KernelShap(return_input_shape=False): camkit returns values at the input's positions")
        return self._attribute(inputs, baselines, target, additional_forward_args, feature_mask,
                               perturbations_per_eval, samples=n_samples)

    def _region_explainer(self, model: nn.Module, ids: Tensor, base: Tensor, batch: int, **options: Any) -> Explainer:
        seed = int(torch.randint(0, 2**31 - 1, ()).item())
        return km.KernelShap(model, regions=ids, baseline=base, batch_size=batch, seed=seed, **options)


class Lime(_Regions):
    """captum's ``Lime`` with its default interpretable model and kernel, on :class:`camkit.Lime`."""

    def __init__(self, forward_func: Any, interpretable_model: Any = None, similarity_func: Any = None,
                 perturb_func: Any = None) -> None:
        if interpretable_model is not None or similarity_func is not None or perturb_func is not None:
            raise NotComputedError("Lime with a custom interpretable model, similarity or perturbation function")
        super().__init__(forward_func)

    def attribute(self, inputs: Any, baselines: Any = None, target: Any = None, additional_forward_args: Any = None,
                  feature_mask: Any = None, n_samples: int = 25, perturbations_per_eval: int = 1,
                  return_input_shape: bool = True, show_progress: bool = False) -> Any:
        if not return_input_shape:
            raise NotComputedError("Lime(return_input_shape=False): camkit returns values at the input's positions")
        return self._attribute(inputs, baselines, target, additional_forward_args, feature_mask,
                               perturbations_per_eval, samples=n_samples)

    def _region_explainer(self, model: nn.Module, ids: Tensor, base: Tensor, batch: int, **options: Any) -> Explainer:
        seed = int(torch.randint(0, 2**31 - 1, ()).item())
        return km.Lime(model, regions=ids, baseline=base, batch_size=batch, seed=seed, **options)
