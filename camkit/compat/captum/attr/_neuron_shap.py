"""captum's NeuronGradientShap, NeuronDeepLift and NeuronDeepLiftShap: camkit's methods with a neuron as the target.

captum computes each as its GradientShap, DeepLift or DeepLiftShap with the gradient of one neuron
of a layer (its output, or its input) in place of the output's. The translation runs camkit's
:class:`camkit.GradientShap` (on captum's draws, see :mod:`._shap`), :class:`camkit.DeepLift` and
:class:`camkit.DeepLiftShap` with captum's ``neuron_selector`` as a :class:`camkit.NeuronTarget`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from .... import methods as km
from ....methods import Explainer
from .._pack import Layout, as_tuple, baselines_like, fit_to
from ._base import NeuronAttribution, NotComputedError
from ._gradient import DeepLift, _distribution
from ._neuron import _on_neuron, neuron_target
from ._shap import baseline_distribution, captum_draws, on_draws

__all__ = ["NeuronDeepLift", "NeuronDeepLiftShap", "NeuronGradientShap"]


class _Multiplying(NeuronAttribution):
    def __init__(self, forward_func: Callable[..., Any], layer: nn.Module, device_ids: Any = None,
                 multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._multiply = multiply_by_inputs


class NeuronGradientShap(_Multiplying):
    """captum's ``NeuronGradientShap``: GradientShap of one neuron, :class:`camkit.GradientShap` on captum's draws.

    After the same ``numpy.random.seed`` and ``torch.manual_seed`` a call returns captum's attribution.
    """

    def attribute(self, inputs: Any, neuron_selector: Any, baselines: Any, n_samples: int = 5,
                  stdevs: float = 0.0, additional_forward_args: Any = None,
                  attribute_to_neuron_input: bool = False) -> Any:
        xs = as_tuple(inputs)
        Layout.of(xs)  # inputs checked before anything is drawn
        drawn = captum_draws(xs, baseline_distribution(baselines, inputs), n_samples, stdevs)
        build = on_draws(drawn, n_samples, stdevs, multiply_by_inputs=self._multiply)
        return _on_neuron(self, inputs, neuron_selector, additional_forward_args, attribute_to_neuron_input, build,
                          one_by_one=True)


class NeuronDeepLift(_Multiplying):
    """captum's ``NeuronDeepLift``: the Rescale rule's multipliers of one neuron, :class:`camkit.DeepLift`."""

    eps = 1e-10

    def __init__(self, model: nn.Module, layer: nn.Module, multiply_by_inputs: bool = True) -> None:
        super().__init__(model, layer, None, multiply_by_inputs)
        self.model = model

    def attribute(self, inputs: Any, neuron_selector: Any, baselines: Any = None, additional_forward_args: Any = None,
                  attribute_to_neuron_input: bool = False, custom_attribution_func: Any = None) -> Any:
        xs = as_tuple(inputs)
        if custom_attribution_func is not None:
            return self._custom(custom_attribution_func, inputs, neuron_selector, [baselines_like(baselines, xs)],
                                additional_forward_args, attribute_to_neuron_input)
        bases = Layout.of(xs).pack(baselines_like(baselines, xs))

        def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
            base = fit_to(bases if example < 0 else bases[example : example + 1], x)
            return km.DeepLift(model, baseline=base, eps=self.eps, multiply_by_inputs=self._multiply)

        return _on_neuron(self, inputs, neuron_selector, additional_forward_args, attribute_to_neuron_input, build)

    def _custom(self, func: Callable[..., Any], inputs: Any, selector: Any, references: list[tuple[Tensor, ...]],
                extra: Any, to_input: bool) -> Any:
        """captum's ``custom_attribution_func`` on the neuron's multipliers (as the translated DeepLift's)."""
        if to_input:
            raise NotComputedError(f"{type(self).__name__}(custom_attribution_func=..., attribute_to_neuron_input=True)")
        return DeepLift(self.model, eps=self.eps)._custom(func, inputs, references, neuron_target(self.layer, selector),
                                                          extra)


class NeuronDeepLiftShap(NeuronDeepLift):
    """captum's ``NeuronDeepLiftShap``: NeuronDeepLift averaged over a baseline distribution, :class:`camkit.DeepLiftShap`."""

    def attribute(self, inputs: Any, neuron_selector: Any, baselines: Any,  # type: ignore[override]
                  additional_forward_args: Any = None, attribute_to_neuron_input: bool = False,
                  custom_attribution_func: Any = None) -> Any:
        xs = as_tuple(inputs)
        dist = _distribution(baselines, xs)
        if custom_attribution_func is not None:
            rows = Layout.of(xs).unpack(dist)
            references = [tuple(r[j : j + 1].expand_as(x) for r, x in zip(rows, xs)) for j in range(dist.shape[0])]
            return self._custom(custom_attribution_func, inputs, neuron_selector, references, additional_forward_args,
                                attribute_to_neuron_input)

        def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
            return km.DeepLiftShap(model, baselines=fit_to(dist, x), eps=self.eps, multiply_by_inputs=self._multiply)

        return _on_neuron(self, inputs, neuron_selector, additional_forward_args, attribute_to_neuron_input, build)
