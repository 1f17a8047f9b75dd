"""captum's layer attributions on camkit's layer explainers, and GuidedGradCam composed from two of them."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .... import methods as km
from ....hooks import LayerCapture
from ....methods import Explainer
from .._pack import Layout, baselines_like, forward_args
from ._base import LayerAttribution, NotComputedError, gathered, raw_of
from ._gradient import GuidedBackprop

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


def _refuse_layer_input(attribute_to_layer_input: bool, name: str) -> None:
    if attribute_to_layer_input:
        raise NotComputedError(f"{name}(attribute_to_layer_input=True): camkit attributes to a layer's output only")


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


class _Layered(LayerAttribution):
    """A layer method whose raw attribution comes back in the layer output's own shape."""

    def _layer_shape(self, inputs: Any, additional_forward_args: Any) -> tuple[int, ...]:
        """The layer output's shape on these inputs (one forward, without autograd)."""
        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        with LayerCapture([("layer", self.layer)], gradients=False) as capture:
            self.forward_func(*xs, *forward_args(additional_forward_args))
            recorded = capture.activations()
        if not recorded:
            raise NotComputedError("the layer did not run in the forward pass")
        return tuple(recorded[0].shape)


def _layer_raw(explanations: list[Any], shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    raw = torch.cat([raw_of(e) for e in explanations])
    return raw.reshape(raw.shape[0], *shape[1:]).to(dtype)


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
        _refuse_layer_input(attribute_to_layer_input, "LayerGradCam")
        _check_grad_kwargs(grad_kwargs, "LayerGradCam")
        if not attr_dim_summation:
            raise NotComputedError("LayerGradCam(attr_dim_summation=False): camkit sums over channels")

        def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
            kind = km.GradCAM if relu_attributions else _SignedGradCAM
            return kind(model, self.layer, reshape=_grid(x.dim()))

        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        _, explanations = self._run(inputs, target, additional_forward_args, build, unpack=False)
        shape = self._layer_shape(inputs, additional_forward_args)
        raw = torch.cat([raw_of(e) for e in explanations])
        return raw.reshape(raw.shape[0], 1, *shape[2:]).to(xs[0].dtype)


class LayerActivation(_Layered):
    """captum's ``LayerActivation`` on :class:`camkit.LayerActivation` (a list of layers gives a list)."""

    @property
    def multiplies_by_inputs(self) -> bool:
        return True

    def attribute(self, inputs: Any, additional_forward_args: Any = None, attribute_to_layer_input: bool = False) -> Any:
        _refuse_layer_input(attribute_to_layer_input, "LayerActivation")
        if isinstance(self.layer, list):
            return [LayerActivation(self.forward_func, layer).attribute(inputs, additional_forward_args) for layer in self.layer]

        def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
            return km.LayerActivation(model, self.layer, reshape=_grid(x.dim()))

        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        shape = self._layer_shape(inputs, additional_forward_args)
        _, explanations = self._run(inputs, 0 if len(shape) > 1 else None, additional_forward_args, build, unpack=False)
        return _layer_raw(explanations, shape, xs[0].dtype)


class LayerGradientXActivation(_Layered):
    """captum's ``LayerGradientXActivation`` on :class:`camkit.LayerGradientXActivation`."""

    def __init__(self, forward_func: Callable[..., Any], layer: nn.Module, device_ids: Any = None,
                 multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._multiply = multiply_by_inputs

    @property
    def multiplies_by_inputs(self) -> bool:
        return self._multiply

    def attribute(self, inputs: Any, target: Any = None, additional_forward_args: Any = None,
                  attribute_to_layer_input: bool = False, grad_kwargs: Any = None) -> Any:
        _refuse_layer_input(attribute_to_layer_input, "LayerGradientXActivation")
        _check_grad_kwargs(grad_kwargs, "LayerGradientXActivation")

        def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
            return km.LayerGradientXActivation(model, self.layer, multiply_by_inputs=self._multiply, reshape=_grid(x.dim()))

        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        shape = self._layer_shape(inputs, additional_forward_args)
        _, explanations = self._run(inputs, target, additional_forward_args, build, unpack=False)
        return _layer_raw(explanations, shape, xs[0].dtype)


class _LayerPath(_Layered):
    def has_convergence_delta(self) -> bool:
        return True

    @property
    def multiplies_by_inputs(self) -> bool:
        return True

    def _path(self, inputs: Any, baselines: Any, target: Any, extra: Any, make: Any, delta: bool) -> Any:
        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        bases = Layout.of(xs).pack(baselines_like(baselines, xs))

        def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
            return make(model, bases if example < 0 else bases[example : example + 1], x.dim())

        shape = self._layer_shape(inputs, extra)
        _, explanations = self._run(inputs, target, extra, build, unpack=False)
        raw = _layer_raw(explanations, shape, xs[0].dtype)
        return (raw, gathered(explanations, "completeness_gap", xs[0].dtype)) if delta else raw


class LayerIntegratedGradients(_LayerPath):
    """captum's ``LayerIntegratedGradients`` on :class:`camkit.LayerIntegratedGradients`."""

    def __init__(self, forward_func: Callable[..., Any], layer: nn.Module, device_ids: Any = None,
                 multiply_by_inputs: bool = True) -> None:
        if isinstance(layer, list):
            raise NotComputedError("LayerIntegratedGradients with several layers: camkit attributes to one layer at a time")
        super().__init__(forward_func, layer, device_ids)
        self._multiply = multiply_by_inputs

    @property
    def multiplies_by_inputs(self) -> bool:
        return self._multiply

    def attribute(self, inputs: Any, baselines: Any = None, target: Any = None, additional_forward_args: Any = None,
                  n_steps: int = 50, method: str = "gausslegendre", internal_batch_size: int | None = None,
                  return_convergence_delta: bool = False, attribute_to_layer_input: bool = False,
                  grad_kwargs: Any = None) -> Any:
        from ._gradient import RULES

        _refuse_layer_input(attribute_to_layer_input, "LayerIntegratedGradients")
        _check_grad_kwargs(grad_kwargs, "LayerIntegratedGradients")
        if method not in RULES:
            raise NotComputedError(f"LayerIntegratedGradients(method={method!r}): camkit integrates with {sorted(RULES)}")

        def make(model: nn.Module, base: Tensor, rank: int) -> Explainer:
            return km.LayerIntegratedGradients(model, self.layer, steps=n_steps, rule=RULES[method],  # type: ignore[arg-type]
                                               baseline=base, max_batch=internal_batch_size or 10**9, reshape=_grid(rank),
                                               multiply_by_inputs=self._multiply)

        return self._path(inputs, baselines, target, additional_forward_args, make, return_convergence_delta)


class LayerConductance(_LayerPath):
    """captum's ``LayerConductance`` (every ``method``: the path's points) on :class:`camkit.LayerConductance`."""

    def attribute(self, inputs: Any, baselines: Any = None, target: Any = None, additional_forward_args: Any = None,
                  n_steps: int = 50, method: str = "gausslegendre", internal_batch_size: int | None = None,
                  return_convergence_delta: bool = False, attribute_to_layer_input: bool = False,
                  grad_kwargs: Any = None) -> Any:
        _refuse_layer_input(attribute_to_layer_input, "LayerConductance")
        from ._gradient import RULES

        _check_grad_kwargs(grad_kwargs, "LayerConductance")
        if method not in RULES:
            raise NotComputedError(f"LayerConductance(method={method!r}): camkit's path points are {sorted(RULES)}")

        def make(model: nn.Module, base: Tensor, rank: int) -> Explainer:
            return km.LayerConductance(model, self.layer, steps=n_steps, rule=RULES[method], baseline=base,  # type: ignore[arg-type]
                                       max_batch=internal_batch_size or 10**9, reshape=_grid(rank))

        return self._path(inputs, baselines, target, additional_forward_args, make, return_convergence_delta)


class GuidedGradCam(LayerAttribution):
    """captum's ``GuidedGradCam``: camkit's guided backprop times its ReLU'd Grad-CAM resized to each input."""

    def __init__(self, model: nn.Module, layer: nn.Module, device_ids: Any = None) -> None:
        super().__init__(model, layer, device_ids)
        self.grad_cam = LayerGradCam(model, layer)
        self.guided_backprop = GuidedBackprop(model)

    def attribute(self, inputs: Any, target: Any = None, additional_forward_args: Any = None,
                  interpolate_mode: str = "nearest", attribute_to_layer_input: bool = False) -> Any:
        _refuse_layer_input(attribute_to_layer_input, "GuidedGradCam")
        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        cam = self.grad_cam.attribute(xs, target, additional_forward_args, relu_attributions=True)
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
