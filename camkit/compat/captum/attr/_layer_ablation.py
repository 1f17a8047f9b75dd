"""captum's LayerFeatureAblation and NeuronFeatureAblation on the translation's FeatureAblation.

LayerFeatureAblation ablates the layer's own values: camkit's perturbation engine
(:class:`~camkit.compat.captum.attr.FeatureAblation`) runs on a forward function whose inputs are
the layer's tensors, which it puts in place of what the layer computes (the model's inputs ride
along as extra arguments, repeated with each batch of perturbations). NeuronFeatureAblation
ablates the inputs and reads one neuron of the layer instead of the model's output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ....hooks import HookScope
from .._pack import CaptumTargetError, as_tuple, forward_args
from .._support import _forward_layer_eval
from ._ablation import FeatureAblation
from ._base import LayerAttribution, NeuronAttribution, PerturbationAttribution

__all__ = ["LayerFeatureAblation", "NeuronFeatureAblation"]


class LayerFeatureAblation(LayerAttribution, PerturbationAttribution):
    """captum's ``LayerFeatureAblation``: each group of the layer's units (``layer_mask``) set to its baseline in turn."""

    def __init__(self, forward_func: Callable[..., Any], layer: nn.Module, device_ids: Any = None) -> None:
        LayerAttribution.__init__(self, forward_func, layer, device_ids)

    def _substituted(self, count: int, to_input: bool) -> Callable[..., Any]:
        """The model with the layer's tensors given as the first ``count`` arguments, its inputs after them."""

        def forward(*args: Any) -> Any:
            given = args[:count]

            def output(module: nn.Module, inputs: Any, out: Any) -> Any:
                return given[0] if isinstance(out, Tensor) else type(out)(given)

            def before(module: nn.Module, inputs: Any) -> Any:
                return tuple(given)

            with HookScope() as scope:
                if to_input:
                    scope.forward_pre(self.layer, before)
                else:
                    scope.forward(self.layer, output)
                return self.forward_func(*args[count:])

        return forward

    def attribute(self, inputs: Any, layer_baselines: Any = None, target: Any = None,
                  additional_forward_args: Any = None, layer_mask: Any = None, attribute_to_layer_input: bool = False,
                  perturbations_per_eval: int = 1) -> Any:
        xs = as_tuple(inputs)
        extra = forward_args(additional_forward_args)
        with torch.no_grad():
            values = _forward_layer_eval(self.forward_func, xs, self.layer, extra or None,
                                         attribute_to_layer_input=attribute_to_layer_input)
        values = tuple(v.detach() for v in values)
        ablation = FeatureAblation(self._substituted(len(values), attribute_to_layer_input))
        with torch.no_grad():
            found = ablation.attribute(values, baselines=layer_baselines, target=target,
                                       additional_forward_args=xs + extra, feature_mask=layer_mask,
                                       perturbations_per_eval=perturbations_per_eval)
        parts = as_tuple(found)
        return parts if len(parts) > 1 else parts[0]


class NeuronFeatureAblation(NeuronAttribution, PerturbationAttribution):
    """captum's ``NeuronFeatureAblation``: input features ablated in turn, the change of one neuron of the layer."""

    def __init__(self, forward_func: Callable[..., Any], layer: nn.Module, device_ids: Any = None) -> None:
        NeuronAttribution.__init__(self, forward_func, layer, device_ids)

    def _neuron(self, selector: Any, to_input: bool) -> Callable[..., Tensor]:
        def forward(*args: Any) -> Tensor:
            found = _forward_layer_eval(self.forward_func, args, self.layer, attribute_to_layer_input=to_input)
            value = found if len(found) > 1 else found[0]
            if callable(selector):
                picked = selector(value)
            else:
                if len(found) > 1:
                    raise CaptumTargetError("a layer with several tensors needs a callable neuron_selector")
                index = (selector,) if isinstance(selector, int) else tuple(selector)
                shape = tuple(found[0].shape[1:])
                if len(index) > len(shape) or any(
                    isinstance(i, int) and not -size <= i < size for i, size in zip(index, shape)
                ):
                    raise CaptumTargetError(f"neuron_selector {selector!r} is out of range for the layer's output of "
                                            f"shape {list(shape)} (per example)")
                picked = found[0][(slice(None), *index)]
            return picked.reshape(picked.shape[0], -1).sum(dim=1) if picked.dim() > 1 else picked

        return forward

    def attribute(self, inputs: Any, neuron_selector: Any, baselines: Any = None, additional_forward_args: Any = None,
                  feature_mask: Any = None, attribute_to_neuron_input: bool = False,
                  perturbations_per_eval: int = 1) -> Any:
        ablation = FeatureAblation(self._neuron(neuron_selector, attribute_to_neuron_input))
        return ablation.attribute(inputs, baselines=baselines, additional_forward_args=additional_forward_args,
                                  feature_mask=feature_mask, perturbations_per_eval=perturbations_per_eval)
