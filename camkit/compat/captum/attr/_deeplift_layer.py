"""captum's LayerDeepLift and LayerDeepLiftShap on :class:`camkit.LayerDeepLift` and :class:`camkit.LayerDeepLiftShap`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .... import methods as km
from ....methods import Explainer
from .._pack import CaptumInputError, Layout, as_tuple, baselines_like, fit_to
from ._gradient import _distribution
from ._layer import LayerActivation, _check_grad_kwargs, _grid, _LayerPath

__all__ = ["LayerDeepLift", "LayerDeepLiftShap"]


def _custom(func: Callable[..., Any], multipliers: Any, at_inputs: Any, at_baselines: Any) -> Any:
    """captum's ``custom_attribution_func`` called with as many of (multipliers, inputs, baselines) as it takes."""
    takes = len(inspect.signature(func).parameters)
    args = (as_tuple(multipliers), as_tuple(at_inputs), as_tuple(at_baselines))[: max(1, min(takes, 3))]
    out = as_tuple(func(*args))
    return out if isinstance(multipliers, tuple) else out[0]


class LayerDeepLift(_LayerPath):
    """captum's ``LayerDeepLift`` (Rescale rule) on :class:`camkit.LayerDeepLift`."""

    delta_key = "delta"

    def __init__(self, model: nn.Module, layer: nn.Module, multiply_by_inputs: bool = True) -> None:
        super().__init__(model, layer)
        self.model = model
        self._multiply = multiply_by_inputs

    def _local(self, inputs: Any, baselines: Any, target: Any, extra: Any, delta: bool, to_input: bool,
               make: Callable[..., Explainer]) -> Any:
        """The attribution in captum's local form (delta measured on what is returned, as captum does)."""
        raw = self._path(inputs, baselines, target, extra, make, False, to_input)
        if not delta:
            return raw
        return raw, self.compute_convergence_delta(raw, baselines, inputs, target, extra)

    def attribute(self, inputs: Any, baselines: Any = None, target: Any = None, additional_forward_args: Any = None,
                  return_convergence_delta: bool = False, attribute_to_layer_input: bool = False,
                  custom_attribution_func: Any = None, grad_kwargs: Any = None) -> Any:
        _check_grad_kwargs(grad_kwargs, "LayerDeepLift")
        multiply = self._multiply and custom_attribution_func is None

        def make(model: nn.Module, layer: nn.Module, base: Tensor, rank: int) -> Explainer:
            return km.LayerDeepLift(model, layer, baseline=base, multiply_by_inputs=multiply, reshape=_grid(rank))

        if custom_attribution_func is not None:
            xs = as_tuple(inputs)
            multipliers = self._path(inputs, baselines, target, additional_forward_args, make, False,
                                     attribute_to_layer_input)
            acts = LayerActivation(self.forward_func, self.layer)
            at_x = acts.attribute(inputs, additional_forward_args, attribute_to_layer_input)
            at_b = acts.attribute(baselines_like(baselines, xs), additional_forward_args, attribute_to_layer_input)
            raw = _custom(custom_attribution_func, multipliers, at_x, at_b)
            if not return_convergence_delta:
                return raw
            return raw, self.compute_convergence_delta(raw, baselines, inputs, target, additional_forward_args)
        if not multiply:
            return self._local(inputs, baselines, target, additional_forward_args, return_convergence_delta,
                               attribute_to_layer_input, make)
        return self._path(inputs, baselines, target, additional_forward_args, make, return_convergence_delta,
                          attribute_to_layer_input)


class LayerDeepLiftShap(LayerDeepLift):
    """captum's ``LayerDeepLiftShap`` on :class:`camkit.LayerDeepLiftShap`: LayerDeepLift averaged over a distribution."""

    delta_key = "pair_deltas"  # captum's delta: one per example and baseline, example-major

    def attribute(  # type: ignore[override]
        self, inputs: Any, baselines: Any, target: Any = None, additional_forward_args: Any = None,
        return_convergence_delta: bool = False, attribute_to_layer_input: bool = False,
        custom_attribution_func: Any = None,
    ) -> Any:
        xs = as_tuple(inputs)
        dist = _distribution(baselines, xs)
        if dist.shape[0] < 2:
            raise CaptumInputError("LayerDeepLiftShap needs a distribution of two or more baselines; for one baseline "
                                   "use LayerDeepLift")
        if custom_attribution_func is not None:
            return self._custom_mean(xs, Layout.of(xs).unpack(dist), target, additional_forward_args,
                                     attribute_to_layer_input, custom_attribution_func, return_convergence_delta)

        def make(model: nn.Module, layer: nn.Module, base: Tensor, rank: int) -> Explainer:
            return km.LayerDeepLiftShap(model, layer, fit_to(dist, base), multiply_by_inputs=self._multiply,
                                        reshape=_grid(rank))

        if not self._multiply and return_convergence_delta:
            raw = self._path(inputs, None, target, additional_forward_args, make, False, attribute_to_layer_input)
            return raw, self._pair_deltas(raw, xs, Layout.of(xs).unpack(dist), target, additional_forward_args)
        return self._path(inputs, None, target, additional_forward_args, make, return_convergence_delta,
                          attribute_to_layer_input)

    def _pair_deltas(self, raw: Any, xs: tuple[Tensor, ...], rows: tuple[Tensor, ...], target: Any,
                     extra: Any) -> Tensor:
        """captum's delta of the returned attribution against each baseline, example-major [B * N]."""
        count = rows[0].shape[0]
        each = [self.compute_convergence_delta(raw, tuple(r[j : j + 1].expand_as(x) for r, x in zip(rows, xs)),
                                               xs, target, extra) for j in range(count)]
        return torch.stack(each, dim=1).reshape(-1)

    def _custom_mean(self, xs: tuple[Tensor, ...], rows: tuple[Tensor, ...], target: Any, extra: Any, to_input: bool,
                     func: Callable[..., Any], delta: bool) -> Any:
        """captum's custom function per (example, baseline) pair, averaged over the baselines."""
        plain = LayerDeepLift(self.model, self.layer, multiply_by_inputs=self._multiply)
        found = [as_tuple(plain.attribute(xs, tuple(r[j : j + 1].expand_as(x) for r, x in zip(rows, xs)), target,
                                          extra, attribute_to_layer_input=to_input, custom_attribution_func=func))
                 for j in range(rows[0].shape[0])]
        means = tuple(torch.stack([f[i] for f in found]).mean(dim=0) for i in range(len(found[0])))
        out = means if len(means) > 1 else means[0]
        if not delta:
            return out
        return out, self._pair_deltas(out, xs, rows, target, extra)
