"""captum's neuron attributions on camkit's explainers with a :class:`camkit.NeuronTarget` as the target.

captum selects the neuron with a tuple index into the layer's output row (``(channel, y, x)``, or
``(unit,)`` for a flat layer); camkit's neuron target takes the channel and the position. Slice
and callable selectors (captum's aggregated neurons) read the same recorded layer output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .... import methods as km
from ....methods import Explainer
from ....targets import NeuronTarget
from .._pack import CaptumTargetError, Layout, baselines_like, fit_to
from ._base import Build, NeuronAttribution, NotComputedError
from ._gradient import RULES
from ._route import Route

__all__ = [
    "NeuronDeconvolution",
    "NeuronGradient",
    "NeuronGuidedBackprop",
    "NeuronIntegratedGradients",
]


class SelectedNeurons(NeuronTarget):
    """captum's slice or callable ``neuron_selector`` as a camkit neuron target on the layer's recorded output.

    A slice selector sums the layer's output over the elements it selects (as captum does); a
    callable one is called with the layer's output and returns one value per example.
    """

    def __init__(self, layer: nn.Module, selector: Any) -> None:
        super().__init__(layer, 0)
        self.selector = selector

    def __call__(self, output: Any) -> Tensor:
        value = self.activation()
        if callable(self.selector):
            scores = self.selector(value)
            if isinstance(scores, Tensor) and scores.dim() == 0:  # one value for the batch: the selector per example
                scores = torch.stack([self.selector(value[i : i + 1]).reshape(()) for i in range(value.shape[0])])
            if not isinstance(scores, Tensor) or scores.shape[0] != value.shape[0]:
                raise CaptumTargetError(
                    f"a callable neuron_selector returned {type(scores).__name__} "
                    f"{list(scores.shape) if isinstance(scores, Tensor) else ''}; return one value per example, [B]"
                )
            return scores.reshape(value.shape[0], -1).sum(dim=1)
        chosen = value[(slice(None), *self.selector)]
        return chosen.reshape(chosen.shape[0], -1).sum(dim=1)


def neuron_target(layer: nn.Module, selector: Any) -> NeuronTarget:
    """captum's ``neuron_selector`` (an int, a tuple of ints and slices, or a callable) as camkit's neuron target."""
    if callable(selector):
        return SelectedNeurons(layer, selector)
    index = (selector,) if isinstance(selector, int) and not isinstance(selector, bool) else selector
    if not isinstance(index, tuple) or not index or not all(
        isinstance(i, slice) or (isinstance(i, int) and not isinstance(i, bool)) for i in index
    ):
        raise CaptumTargetError(f"neuron_selector {selector!r}: give an int, a tuple of ints and slices, or a callable")
    if any(isinstance(i, slice) for i in index):
        return SelectedNeurons(layer, index)
    return NeuronTarget(layer, index[0], index[1:] or None)


def _on_neuron(method: NeuronAttribution, inputs: Any, selector: Any, extra: Any, to_input: bool, make: Build,
               **run: Any) -> Any:
    """camkit's explainer ``make(model, layout, x, example)`` for the selected neuron of the layer's output or input.

    ``run`` goes to :meth:`~._base.Attribution._run` (``one_by_one=True``: an explainer per example).

    A neuron of the layer's input is read from an identity probe the input passes through
    (:class:`~camkit.compat.captum.attr._route.Route`), added to the model camkit explains.
    """
    if not to_input:
        raw, _ = method._run(inputs, neuron_target(method.layer, selector), extra, make, **run)
        return raw
    route = Route(method.layer, to_input=True)
    target = neuron_target(route.probe, selector)

    def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
        model.add_module("probe", route.probe)
        return make(model, layout, x, example)

    with route.active():
        route.survey(method.forward_func, inputs, extra)
        raw, _ = method._run(inputs, target, extra, build, **run)
    return raw


class _Neuron(NeuronAttribution):
    kind: type[Explainer] = km.Saliency

    def attribute(self, inputs: Any, neuron_selector: Any, additional_forward_args: Any = None,
                  attribute_to_neuron_input: bool = False) -> Any:
        kind = type(self).kind

        def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
            return kind(model)

        return _on_neuron(self, inputs, neuron_selector, additional_forward_args, attribute_to_neuron_input, build)


class NeuronGradient(_Neuron):
    """captum's ``NeuronGradient``: the input gradient of one neuron, on :class:`camkit.Saliency` (signed)."""


class NeuronGuidedBackprop(_Neuron):
    """captum's ``NeuronGuidedBackprop`` on :class:`camkit.GuidedBackprop`."""

    kind: type[Explainer] = km.GuidedBackprop

    def __init__(self, model: nn.Module, layer: nn.Module, device_ids: Any = None) -> None:
        super().__init__(model, layer, device_ids)
        self.model = model


class NeuronDeconvolution(NeuronGuidedBackprop):
    """captum's ``NeuronDeconvolution`` on :class:`camkit.Deconvolution`."""

    kind: type[Explainer] = km.Deconvolution


class NeuronIntegratedGradients(NeuronAttribution):
    """captum's ``NeuronIntegratedGradients`` on :class:`camkit.IntegratedGradients`."""

    def __init__(self, forward_func: Callable[..., Any], layer: nn.Module, device_ids: Any = None,
                 multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._multiply = multiply_by_inputs

    def attribute(self, inputs: Any, neuron_selector: Any, baselines: Any = None, additional_forward_args: Any = None,
                  n_steps: int = 50, method: str = "gausslegendre", internal_batch_size: int | None = None,
                  attribute_to_neuron_input: bool = False) -> Any:
        if method not in RULES:
            raise NotComputedError(f"method={method!r}: camkit integrates with {sorted(RULES)} only")
        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        bases = Layout.of(xs).pack(baselines_like(baselines, xs))

        def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
            base = fit_to(bases if example < 0 else bases[example : example + 1], x)
            chunk = internal_batch_size or max(1, x.shape[0] * n_steps)
            return km.IntegratedGradients(model, steps=n_steps, rule=RULES[method], baseline=base, max_batch=chunk,  # type: ignore[arg-type]
                                          multiply_by_inputs=self._multiply)

        return _on_neuron(self, inputs, neuron_selector, additional_forward_args, attribute_to_neuron_input, build)
