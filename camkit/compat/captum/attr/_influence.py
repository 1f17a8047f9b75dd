"""captum's InternalInfluence, LayerGradientShap and NeuronConductance on camkit's gradients at a layer.

Each evaluates camkit's gradient of the score at the layer (:class:`camkit.LayerGradientXActivation`
without the activation factor) on captum's points: the straight path from the baseline to the
input (InternalInfluence, NeuronConductance) or captum's GradientShap draws (LayerGradientShap, drawn
as captum draws them, see :mod:`._shap`). The integration weights are camkit's
(:func:`camkit.functional.integration_points`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ....functional import integration_points
from ....hooks import HookScope
from .._pack import CaptumTargetError, Layout, as_tuple, baselines_like, forward_args
from ._base import LayerAttribution, NeuronAttribution, NotComputedError
from ._gradient import RULES, Saliency
from ._layer import LayerActivation, _check_grad_kwargs
from ._paths import layer_gradients, on_path, repeat_extra, repeat_target
from ._shap import baseline_distribution, captum_draws, path_alpha

__all__ = ["InternalInfluence", "LayerGradientShap", "LayerInputBaselineXGradient", "NeuronConductance"]


def _nodes(method: str, n_steps: int, name: str) -> tuple[Tensor, Tensor]:
    if method not in RULES:
        raise NotComputedError(f"{name}(method={method!r}): camkit integrates with {sorted(RULES)}")
    return integration_points(n_steps, RULES[method], dtype=torch.float64)  # type: ignore[arg-type]


def _answer(parts: tuple[Tensor, ...], several: bool) -> Any:
    return parts if several else parts[0]


class InternalInfluence(LayerAttribution):
    """captum's ``InternalInfluence``: the layer's gradient integrated along the input path, ``sum_i w_i dS/da(x_i)``."""

    def attribute(self, inputs: Any, baselines: Any = None, target: Any = None, additional_forward_args: Any = None,
                  n_steps: int = 50, method: str = "gausslegendre", internal_batch_size: int | None = None,
                  attribute_to_layer_input: bool = False, grad_kwargs: Any = None) -> Any:
        _check_grad_kwargs(grad_kwargs, "InternalInfluence")
        alphas, weights = _nodes(method, n_steps, "InternalInfluence")
        xs = as_tuple(inputs)
        several = [False]

        def run(points: tuple[Tensor, ...], tgt: Any, extra: Any, w: Tensor) -> tuple[Tensor, ...]:
            grads, several[0] = layer_gradients(self, points, tgt, extra, attribute_to_layer_input)
            return tuple(g.reshape(len(w), -1, *g.shape[1:]).mul(w.to(g.dtype).view(-1, *([1] * g.dim()))).sum(dim=0)
                         for g in grads)

        total = on_path(run, xs, baselines_like(baselines, xs), target, additional_forward_args, alphas, weights,
                        internal_batch_size)
        return _answer(total, several[0])


class LayerGradientShap(LayerAttribution):
    """captum's ``LayerGradientShap``: ``dS/da`` at GradientShap's draws times the layer's change ``a(x') - a(b)``.

    The baselines, the noise and the points on the path are captum's draws, from numpy's and
    torch's global generators in captum's order (:func:`~._shap.captum_draws`), so a seeded call
    returns captum's attribution; the gradients and activations at them are camkit's.
    """

    def __init__(self, forward_func: Callable[..., Any], layer: nn.Module, device_ids: Any = None,
                 multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._multiply = multiply_by_inputs

    def has_convergence_delta(self) -> bool:
        return True

    def _between(self, ends: tuple[Tensor, ...], starts: tuple[Tensor, ...], alpha: Tensor, target: Any, extra: Any,
                 to_input: bool) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], bool]:
        """Per row: ``(dS/da(p) * (a(end) - a(start)), dS/da(p), several)`` at ``p = start + alpha (end - start)``."""
        points = tuple(s + alpha.to(s.dtype).view(-1, *([1] * (s.dim() - 1))) * (e - s) for s, e in zip(starts, ends))
        grads, several = layer_gradients(self, points, target, extra, to_input)
        acts = LayerActivation(self.forward_func, self.layer)
        at_end = as_tuple(acts.attribute(ends, extra, to_input))
        at_start = as_tuple(acts.attribute(starts, extra, to_input))
        return tuple(g * (a - b) for g, a, b in zip(grads, at_end, at_start)), grads, several

    def attribute(self, inputs: Any, baselines: Any, n_samples: int = 5, stdevs: Any = 0.0, target: Any = None,
                  additional_forward_args: Any = None, return_convergence_delta: bool = False,
                  attribute_to_layer_input: bool = False) -> Any:
        xs = as_tuple(inputs)
        Layout.of(xs)  # inputs checked before anything is drawn
        drawn = captum_draws(xs, baseline_distribution(baselines, inputs), n_samples, stdevs)
        ends, starts, alpha = drawn.ends, drawn.starts, drawn.alpha
        tgt = repeat_target(target, n_samples, interleave=True)
        extra = repeat_extra(additional_forward_args, n_samples, interleave=True)
        rows, grads, several = self._between(ends, starts, alpha, tgt, extra, attribute_to_layer_input)
        chosen = rows if self._multiply else grads
        mean = tuple(r.reshape(xs[0].shape[0], n_samples, *r.shape[1:]).mean(dim=1) for r in chosen)
        if not return_convergence_delta:
            return _answer(mean, several)
        delta = self.compute_convergence_delta(rows, starts, ends, tgt, extra)
        return _answer(mean, several), delta


class LayerInputBaselineXGradient(LayerGradientShap):
    """captum's ``LayerInputBaselineXGradient`` (LayerGradientShap's one draw): one point per example, drawn
    uniformly on the path from its baseline (numpy's global generator, as captum draws it), ``dS/da`` there
    times ``a(x) - a(b)``."""

    def attribute(self, inputs: Any, baselines: Any, target: Any = None,  # type: ignore[override]
                  additional_forward_args: Any = None, return_convergence_delta: bool = False,
                  attribute_to_layer_input: bool = False, grad_kwargs: Any = None) -> Any:
        _check_grad_kwargs(grad_kwargs, "LayerInputBaselineXGradient")
        xs = as_tuple(inputs)
        pairs = [torch.broadcast_tensors(x, b) for x, b in zip(xs, baselines_like_rows(baselines, xs))]
        ends, starts = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
        alpha = path_alpha(ends[0].shape[0], ends[0])
        rows, grads, several = self._between(ends, starts, alpha, target, additional_forward_args,
                                             attribute_to_layer_input)
        out = _answer(rows if self._multiply else grads, several)
        if not return_convergence_delta:
            return out
        return out, self.compute_convergence_delta(rows, starts, ends, target, additional_forward_args)


def baselines_like_rows(baselines: Any, xs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """captum's baselines for LayerInputBaselineXGradient: numbers as full tensors, tensors as they are (any rows)."""
    items = baselines if isinstance(baselines, tuple) else (baselines,)
    return tuple(b.detach().to(x.dtype) if isinstance(b, Tensor) else baselines_like(b, (x,))[0]
                 for b, x in zip(items, xs))


def _neuron_of(forward_func: Callable[..., Any], layer: nn.Module, selector: Any, to_input: bool) -> Callable[..., Tensor]:
    """The model with the selected neuron of ``layer`` (its output, or its inputs) as its output, one value per row.

    The selector reads the layer's tensors when the layer runs (a tuple for a layer of several), before
    any later in-place operation can change them.
    """

    def pick(value: Any) -> Tensor:
        items = value if isinstance(value, (tuple, list)) else (value,)
        tensors = tuple(v for v in items if isinstance(v, Tensor))
        several = len(tensors) > 1 or (not to_input and not isinstance(value, Tensor))
        if callable(selector):
            picked = selector(tensors if several else tensors[0])
        else:
            if several:
                raise CaptumTargetError("a layer with several tensors needs a callable neuron_selector")
            picked = tensors[0][(slice(None), *((selector,) if isinstance(selector, int) else tuple(selector)))]
        return picked.reshape(picked.shape[0], -1).sum(dim=1)

    def forward(*args: Any) -> Tensor:
        found: list[Tensor] = []
        with HookScope() as scope:
            if to_input:
                scope.forward_pre(layer, lambda module, inputs: found.append(pick(inputs)))
            else:
                scope.forward(layer, lambda module, inputs, out: found.append(pick(out)))
            forward_func(*args)
        if not found:
            raise CaptumTargetError("the layer did not run in the forward pass")
        return found[-1]

    return forward


class NeuronConductance(NeuronAttribution):
    """captum's ``NeuronConductance``: ``(x - x0) sum_i w_i dS/dn(x_i) dn/dx(x_i)`` for the neuron ``n``.

    Both gradients are camkit's: the score's at the layer (whose entry at the neuron is
    ``dS/dn``) and the neuron's at the input (:class:`camkit.Saliency` of the neuron, read as the
    layer runs, so that a layer of several tensors takes captum's callable selectors).
    """

    def __init__(self, forward_func: Callable[..., Any], layer: nn.Module, device_ids: Any = None,
                 multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._multiply = multiply_by_inputs

    @staticmethod
    def _at_neuron(grads: tuple[Tensor, ...], selector: Any, several: bool) -> Tensor:
        """``dS/dn`` per row: the layer gradient's entry at the neuron (or the selector applied to the gradient)."""
        rows = grads[0].shape[0]
        if callable(selector):
            picked = selector(grads if several else grads[0])
        else:
            if several:
                raise CaptumTargetError("a layer with several tensors needs a callable neuron_selector")
            index = (selector,) if isinstance(selector, int) else tuple(selector)
            picked = grads[0][(slice(None), *index)]
        if not isinstance(picked, Tensor) or picked.numel() != rows:
            raise CaptumTargetError(f"neuron_selector must pick one neuron (one value per example, {rows}); got "
                                    f"{list(picked.shape) if isinstance(picked, Tensor) else type(picked).__name__}")
        return picked.reshape(rows)

    def attribute(self, inputs: Any, neuron_selector: Any, baselines: Any = None, target: Any = None,
                  additional_forward_args: Any = None, n_steps: int = 50, method: str = "riemann_trapezoid",
                  internal_batch_size: int | None = None, attribute_to_neuron_input: bool = False,
                  grad_kwargs: Any = None) -> Any:
        _check_grad_kwargs(grad_kwargs, "NeuronConductance")
        alphas, weights = _nodes(method, n_steps, "NeuronConductance")
        xs = as_tuple(inputs)
        bases = baselines_like(baselines, xs)
        neuron = Saliency(_neuron_of(self.forward_func, self.layer, neuron_selector, attribute_to_neuron_input))

        def run(points: tuple[Tensor, ...], tgt: Any, extra: Any, w: Tensor) -> tuple[Tensor, ...]:
            grads, several = layer_gradients(self, points, tgt, extra, attribute_to_neuron_input)
            mid = self._at_neuron(grads, neuron_selector, several)
            inner = as_tuple(neuron.attribute(points, abs=False, additional_forward_args=extra))
            scale = mid * w.to(mid.dtype).repeat_interleave(mid.shape[0] // len(w))
            return tuple((g * scale.to(g.dtype).view(-1, *([1] * (g.dim() - 1))))
                         .reshape(len(w), -1, *g.shape[1:]).sum(dim=0) for g in inner)

        total = on_path(run, xs, bases, target, forward_args(additional_forward_args) or None, alphas, weights,
                        internal_batch_size)
        out = tuple(t * (x - b) for t, x, b in zip(total, xs, bases)) if self._multiply else total
        return out if isinstance(inputs, tuple) else out[0]
