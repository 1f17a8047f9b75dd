"""captum's layer attributions on camkit's layer explainers, and GuidedGradCam composed from two of them."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

from .... import methods as km
from ....errors import LayerNotReachedError
from ....methods import Explainer
from .._pack import Layout, as_tuple, baselines_like, fit_to, forward_args
from ._base import LayerAttribution, NotComputedError, gathered, raw_of
from ._gradient import GuidedBackprop
from ._route import Route

__all__ = [
    "GuidedGradCam",
    "LayerActivation",
    "LayerConductance",
    "LayerGradCam",
    "LayerGradientXActivation",
    "LayerIntegratedGradients",
]


def _grid(rank: int) -> Callable[[Tensor], Tensor]:
    """camkit's ``reshape=``: a layer output [B, C, *s] of another rank than the input lies on a grid [B, C, 1, .., prod(s)]."""

    def reshape(t: Tensor) -> Tensor:
        if t.dim() == rank:
            return t
        channels = t.shape[1] if t.dim() > 1 else 1  # the channels kept, the positions laid along the last axis
        return t.reshape(t.shape[0], channels, *([1] * (rank - 3)), -1)

    return reshape


def _check_grad_kwargs(grad_kwargs: Any, name: str) -> None:
    """captum's ``grad_kwargs`` for ``torch.autograd.grad``: camkit's gradients are materialised (zeros where unused)."""
    if grad_kwargs and dict(grad_kwargs) != {"materialize_grads": True}:
        raise NotComputedError(
            f"{name}(grad_kwargs={grad_kwargs!r}): camkit takes its gradients itself, with unused parts as zeros "
            "(grad_kwargs={'materialize_grads': True}); other autograd options are not passed on"
        )


class _SignedGradCAM(km.GradCAM):
    """camkit's Grad-CAM, its raw map the channel sum of its contributions before the ReLU (captum's default)."""

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        return self.contributions(acts, grads).sum(dim=1)


class _ChannelGradCAM(km.GradCAM):
    """camkit's Grad-CAM, its raw map each channel's contribution [B, C, *s] (captum's ``attr_dim_summation=False``)."""

    relu = False

    def raw_map(self, acts: Tensor, grads: Tensor) -> Tensor:
        per_channel = self.contributions(acts, grads)
        return per_channel.clamp(min=0) if self.relu else per_channel


class _ChannelGradCAMReLU(_ChannelGradCAM):
    relu = True


Make = Callable[[nn.Module, nn.Module, Tensor, int], Explainer]


class _Layered(LayerAttribution):
    """A layer method: camkit's layer explainer on the layer's output or input, returned in its shapes."""

    def _on_layer(self, inputs: Any, target: Any, extra: Any, make: Make, to_input: bool,
                  each: bool = False) -> tuple[list[tuple[Tensor, tuple[int, ...]]], list[Any], Route]:
        """``make(model, probe, x)`` on the layer's tensors: ``([(raw, shape)], explanations, route)``.

        One run for all the layer's tensors together (flattened side by side), or with ``each``
        one run per tensor; ``raw`` is camkit's attribution [B, ...] to the run's tensor(s),
        ``shape`` the tensor's shape (the first one's for a joint run).
        """
        route = Route(self.layer, to_input)
        results: list[tuple[Tensor, tuple[int, ...]]] = []
        explanations: list[Any] = []
        with route.active():
            count = route.survey(self.forward_func, inputs, extra)
            for element in list(range(count)) if each and count > 1 else [None]:
                route.element = element

                def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
                    model.add_module("probe", route.probe)
                    return make(model, route.probe, x, example)

                _, found = self._run(inputs, target, extra, build, unpack=False)
                results.append((torch.cat([raw_of(e) for e in found]), route.shapes[element or 0]))
                explanations += found
        return results, explanations, route

    def _each_layer(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """captum's list of layers: the method on each layer in turn (a list of its answers)."""
        layers = self.layer
        try:
            out = []
            for layer in cast(list[nn.Module], layers):
                self.layer = layer
                out.append(method(*args, **kwargs))
            return out
        finally:
            self.layer = layers


class LayerGradCam(_Layered):
    """captum's ``LayerGradCam`` on camkit's Grad-CAM: the channel sum of gradient-weighted activations [B, 1, *s]."""

    def attribute(
        self,
        inputs: Any,
        target: Any = None,
        additional_forward_args: Any = None,
        attribute_to_layer_input: bool = False,
        relu_attributions: bool = False,
        attr_dim_summation: bool = True,
        grad_kwargs: Any = None,
    ) -> Any:
        _check_grad_kwargs(grad_kwargs, "LayerGradCam")
        summed = km.GradCAM if relu_attributions else _SignedGradCAM
        kind = summed if attr_dim_summation else _ChannelGradCAMReLU if relu_attributions else _ChannelGradCAM

        def make(model: nn.Module, layer: nn.Module, x: Tensor, example: int) -> Explainer:
            return kind(model, layer, reshape=_grid(x.dim()))

        dtype = as_tuple(inputs)[0].dtype
        try:
            results, _, route = self._on_layer(inputs, target, additional_forward_args, make, attribute_to_layer_input,
                                               each=True)
        except LayerNotReachedError:
            if not grad_kwargs:  # captum's autograd raises too unless the gradients are materialised
                raise
            # the score does not depend on the layer: its gradient, hence every Grad-CAM weight, is zero
            route = Route(self.layer, attribute_to_layer_input)
            route.survey(self.forward_func, inputs, additional_forward_args)
            zeros = tuple(torch.zeros(shape[0], 1, *shape[2:], dtype=dtype) for shape in route.shapes)
            return zeros if route.several else zeros[0]
        maps = tuple(raw.reshape(raw.shape[0], -1 if kind is not summed else 1, *shape[2:]).to(dtype)
                     for raw, shape in results)
        return maps if route.several else maps[0]


class LayerActivation(_Layered):
    """captum's ``LayerActivation`` on :class:`camkit.LayerActivation` (a list of layers gives a list)."""

    _multiply = True

    def attribute(self, inputs: Any, additional_forward_args: Any = None, attribute_to_layer_input: bool = False) -> Any:
        if isinstance(self.layer, list):
            return self._each_layer(self.attribute, inputs, additional_forward_args, attribute_to_layer_input)

        def make(model: nn.Module, layer: nn.Module, x: Tensor, example: int) -> Explainer:
            return km.LayerActivation(model, layer, reshape=_grid(x.dim()))

        results, _, route = self._on_layer(inputs, 0, additional_forward_args, make, attribute_to_layer_input)
        return route.split(results[0][0], as_tuple(inputs)[0].dtype)


class LayerGradientXActivation(_Layered):
    """captum's ``LayerGradientXActivation`` on :class:`camkit.LayerGradientXActivation` (a list of layers gives a list)."""

    def __init__(self, forward_func: Callable[..., Any], layer: nn.Module, device_ids: Any = None,
                 multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._multiply = multiply_by_inputs

    def attribute(self, inputs: Any, target: Any = None, additional_forward_args: Any = None,
                  attribute_to_layer_input: bool = False, grad_kwargs: Any = None) -> Any:
        _check_grad_kwargs(grad_kwargs, "LayerGradientXActivation")
        if isinstance(self.layer, list):
            return self._each_layer(self.attribute, inputs, target, additional_forward_args, attribute_to_layer_input)

        def make(model: nn.Module, layer: nn.Module, x: Tensor, example: int) -> Explainer:
            return km.LayerGradientXActivation(model, layer, multiply_by_inputs=self._multiply, reshape=_grid(x.dim()))

        results, _, route = self._on_layer(inputs, target, additional_forward_args, make, attribute_to_layer_input)
        return route.split(results[0][0], as_tuple(inputs)[0].dtype)


class _LayerPath(_Layered):
    delta_key = "completeness_gap"

    def has_convergence_delta(self) -> bool:
        return True

    _multiply = True

    def _path(self, inputs: Any, baselines: Any, target: Any, extra: Any, make: Any, delta: bool, to_input: bool) -> Any:
        xs = as_tuple(inputs)
        bases = Layout.of(xs).pack(baselines_like(baselines, xs))

        def build(model: nn.Module, layer: nn.Module, x: Tensor, example: int) -> Explainer:
            return make(model, layer, fit_to(bases if example < 0 else bases[example : example + 1], x), x.dim())

        results, explanations, route = self._on_layer(inputs, target, extra, build, to_input)
        raw = route.split(results[0][0], xs[0].dtype)
        kind = (raw[0] if isinstance(raw, tuple) else raw).dtype  # the layer's: integer inputs have float embeddings
        return (raw, gathered(explanations, self.delta_key, kind)) if delta else raw


class LayerIntegratedGradients(_LayerPath):
    """captum's ``LayerIntegratedGradients`` on :class:`camkit.LayerIntegratedGradients` (all the layer's tensors on one path)."""

    def __init__(self, forward_func: Callable[..., Any], layer: nn.Module, device_ids: Any = None,
                 multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._multiply = multiply_by_inputs

    def attribute(self, inputs: Any, baselines: Any = None, target: Any = None, additional_forward_args: Any = None,
                  n_steps: int = 50, method: str = "gausslegendre", internal_batch_size: int | None = None,
                  return_convergence_delta: bool = False, attribute_to_layer_input: bool = False,
                  grad_kwargs: Any = None) -> Any:
        from ._gradient import RULES

        _check_grad_kwargs(grad_kwargs, "LayerIntegratedGradients")
        if method not in RULES:
            raise NotComputedError(f"LayerIntegratedGradients(method={method!r}): camkit integrates with {sorted(RULES)}")

        if isinstance(self.layer, list):
            return self._layers_at_once(inputs, baselines, target, additional_forward_args, n_steps, method,
                                        internal_batch_size, return_convergence_delta, attribute_to_layer_input)

        def make(model: nn.Module, layer: nn.Module, base: Tensor, rank: int) -> Explainer:
            return km.LayerIntegratedGradients(model, layer, steps=n_steps, rule=RULES[method],  # type: ignore[arg-type]
                                               baseline=base, max_batch=internal_batch_size or 10**9, reshape=_grid(rank),
                                               multiply_by_inputs=self._multiply)

        return self._path(inputs, baselines, target, additional_forward_args, make, return_convergence_delta,
                          attribute_to_layer_input)


    def _layers_at_once(self, inputs: Any, baselines: Any, target: Any, extra: Any, n_steps: int, method: str,
                        internal_batch_size: int | None, delta: bool, to_input: bool) -> Any:
        """captum's list of layers: every layer's tensors on one path, camkit's integrated gradients of the model
        as a function of them (each layer computing the values given), a list of each layer's answer."""
        from ._gradient import IntegratedGradients
        from ._layer_values import layer_values, substituted

        layers = cast(list[nn.Module], self.layer)
        xs = as_tuple(inputs)
        at_x = layer_values(self.forward_func, layers, xs, extra, to_input)
        at_b = layer_values(self.forward_func, layers, baselines_like(baselines, xs), extra, to_input)
        slots = [s for _, s in at_x]
        ig = IntegratedGradients(substituted(self.forward_func, layers, slots, to_input), multiply_by_inputs=self._multiply)
        found = ig.attribute(tuple(t for v, _ in at_x for t in v), tuple(t for v, _ in at_b for t in v), target,
                             xs + forward_args(extra), n_steps, method, internal_batch_size, delta)
        parts = as_tuple(found[0] if delta else found)
        out, start = [], 0
        for slot in slots:
            chunk = parts[start : start + len(slot.positions)]
            start += len(slot.positions)
            out.append(chunk if slot.several else chunk[0])
        return (out, found[1]) if delta else out


class LayerConductance(_LayerPath):
    """captum's ``LayerConductance`` (every ``method``: the path's points) on :class:`camkit.LayerConductance`."""

    def attribute(self, inputs: Any, baselines: Any = None, target: Any = None, additional_forward_args: Any = None,
                  n_steps: int = 50, method: str = "gausslegendre", internal_batch_size: int | None = None,
                  return_convergence_delta: bool = False, attribute_to_layer_input: bool = False,
                  grad_kwargs: Any = None) -> Any:
        from ._gradient import RULES

        _check_grad_kwargs(grad_kwargs, "LayerConductance")
        if method not in RULES:
            raise NotComputedError(f"LayerConductance(method={method!r}): camkit's path points are {sorted(RULES)}")

        def make(model: nn.Module, layer: nn.Module, base: Tensor, rank: int) -> Explainer:
            return km.LayerConductance(model, layer, steps=n_steps, rule=RULES[method], baseline=base,  # type: ignore[arg-type]
                                       max_batch=internal_batch_size or 10**9, reshape=_grid(rank))

        return self._path(inputs, baselines, target, additional_forward_args, make, return_convergence_delta,
                          attribute_to_layer_input)


class GuidedGradCam(LayerAttribution):
    """captum's ``GuidedGradCam``: camkit's guided backprop times its ReLU'd Grad-CAM resized to each input."""

    def __init__(self, model: nn.Module, layer: nn.Module, device_ids: Any = None) -> None:
        super().__init__(model, layer, device_ids)
        self.grad_cam = LayerGradCam(model, layer)
        self.guided_backprop = GuidedBackprop(model)

    def attribute(self, inputs: Any, target: Any = None, additional_forward_args: Any = None,
                  interpolate_mode: str = "nearest", attribute_to_layer_input: bool = False) -> Any:
        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        cam = self.grad_cam.attribute(xs, target, additional_forward_args, attribute_to_layer_input=attribute_to_layer_input,
                                      relu_attributions=True)
        guided = self.guided_backprop.attribute(xs, target, additional_forward_args)
        out = []
        for i, (x, g) in enumerate(zip(xs, guided)):
            try:
                if x.dim() != cam.dim():
                    raise NotComputedError(f"the layer's map {list(cam.shape)} does not fit input {list(x.shape)}")
                out.append(g * LayerAttribution.interpolate(cam, tuple(x.shape[2:]), interpolate_mode))
            except (NotComputedError, RuntimeError, ValueError) as error:
                # captum's contract: such an input gets an empty attribution, with a warning
                warnings.warn(f"GuidedGradCam: no attribution for input {i} ({error}); an empty tensor is returned",
                              stacklevel=2)
                out.append(torch.empty(0))
        return tuple(out) if isinstance(inputs, tuple) else out[0]
