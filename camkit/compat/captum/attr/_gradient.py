"""captum's gradient attributions on camkit's explainers: Saliency to LRP, and NoiseTunnel around them."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .... import methods as km
from ....methods import Explainer
from .._pack import CaptumInputError, Layout, as_tuple, baselines_like, fit_to
from ._base import GradientAttribution, NotComputedError, gathered

__all__ = [
    "Deconvolution",
    "DeepLift",
    "DeepLiftShap",
    "GuidedBackprop",
    "InputXGradient",
    "IntegratedGradients",
    "Saliency",
]

#: captum's integration methods -> camkit's quadrature rules
RULES = {"gausslegendre": "gausslegendre", "riemann_trapezoid": "trapezoid", "riemann_middle": "midpoint",
         "riemann_left": "left", "riemann_right": "right"}


class _AbsSaliency(km.Saliency):
    """camkit's Saliency, its raw attribution the gradient's absolute value (captum's ``abs=True``)."""

    def combine(self, x: Tensor, grads: Tensor) -> Tensor:
        return grads.abs()


def _no_grad_changes(func: Callable[..., Any]) -> None:
    if not callable(func):
        raise TypeError(f"forward_func must be callable, got {type(func).__name__}")


class _Simple(GradientAttribution):
    """A method whose attribute(inputs, target, additional_forward_args) maps onto one camkit explainer."""

    _whole_batch = True

    def _explainer(self, model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
        raise NotImplementedError

    def attribute(self, inputs: Any, target: Any = None, additional_forward_args: Any = None) -> Any:
        raw, _ = self._run(inputs, target, additional_forward_args, self._explainer)
        return raw


class Saliency(_Simple):
    """captum's ``Saliency`` on :class:`camkit.Saliency`: the input gradient, its absolute value by default."""

    def __init__(self, forward_func: Callable[..., Any]) -> None:
        _no_grad_changes(forward_func)
        super().__init__(forward_func)
        self._abs = True

    def attribute(  # type: ignore[override]
        self, inputs: Any, target: Any = None, abs: bool = True, additional_forward_args: Any = None
    ) -> Any:
        self._abs = abs
        raw, _ = self._run(inputs, target, additional_forward_args, self._explainer)
        return raw

    def _explainer(self, model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
        return _AbsSaliency(model) if self._abs else km.Saliency(model)


class InputXGradient(_Simple):
    """captum's ``InputXGradient`` on :class:`camkit.InputXGradient`."""

    _multiply = True

    def _explainer(self, model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
        return km.InputXGradient(model)


class GuidedBackprop(_Simple):
    """captum's ``GuidedBackprop`` on :class:`camkit.GuidedBackprop` (every ReLU spelling, not only ``nn.ReLU``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.model = model

    def _explainer(self, model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
        return km.GuidedBackprop(model)


class Deconvolution(GuidedBackprop):
    """captum's ``Deconvolution`` on :class:`camkit.Deconvolution`."""

    def _explainer(self, model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
        return km.Deconvolution(model)


class _WithDelta(GradientAttribution):
    """The methods with captum's convergence delta (camkit's completeness gap)."""

    delta_key = "completeness_gap"
    _multiply = True

    def has_convergence_delta(self) -> bool:
        return True

    def _answer(self, inputs: Any, target: Any, extra: Any, build: Any, delta: bool, baselines: Any = (),
                **run: Any) -> Any:
        raw, explanations = self._run(inputs, target, extra, build, **run)
        if not delta:
            return raw
        first = raw[0] if isinstance(raw, tuple) else raw
        if not self._multiply:  # captum's delta of the local form: its sum against f(x) - f(x0), as captum computes it
            if baselines == ():  # a distribution of baselines: no single start point
                raise NotComputedError(f"{type(self).__name__}(multiply_by_inputs=False) with return_convergence_delta=True")
            return raw, self.compute_convergence_delta(raw, baselines, inputs, target, extra).to(first.dtype)
        return raw, gathered(explanations, self.delta_key, first.dtype)


class IntegratedGradients(_WithDelta):
    """captum's ``IntegratedGradients`` on :class:`camkit.IntegratedGradients` (all inputs on one path)."""

    def __init__(self, forward_func: Callable[..., Any], multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func)
        self._multiply = multiply_by_inputs

    def attribute(
        self,
        inputs: Any,
        baselines: Any = None,
        target: Any = None,
        additional_forward_args: Any = None,
        n_steps: int = 50,
        method: str = "gausslegendre",
        internal_batch_size: int | None = None,
        return_convergence_delta: bool = False,
    ) -> Any:
        if method not in RULES:
            raise NotComputedError(f"method={method!r}: camkit integrates with {sorted(RULES)} only")
        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        bases = Layout.of(xs).pack(baselines_like(baselines, xs))

        def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
            base = fit_to(bases if example < 0 else bases[example : example + 1], x)
            chunk = internal_batch_size or max(1, x.shape[0] * n_steps)
            return km.IntegratedGradients(model, steps=n_steps, rule=RULES[method], baseline=base, max_batch=chunk,  # type: ignore[arg-type]
                                          multiply_by_inputs=self._multiply)

        return self._answer(inputs, target, additional_forward_args, build, return_convergence_delta, baselines)


class DeepLift(_WithDelta):
    """captum's ``DeepLift`` (Rescale rule) on :class:`camkit.DeepLift`."""

    delta_key = "delta"

    def __init__(self, model: nn.Module, multiply_by_inputs: bool = True, eps: float = 1e-10) -> None:
        super().__init__(model)
        self._multiply = multiply_by_inputs
        self.model = model
        self.eps = eps

    def attribute(
        self,
        inputs: Any,
        baselines: Any = None,
        target: Any = None,
        additional_forward_args: Any = None,
        return_convergence_delta: bool = False,
        custom_attribution_func: Any = None,
    ) -> Any:
        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        if custom_attribution_func is not None:
            attr = self._custom(custom_attribution_func, inputs, [baselines_like(baselines, xs)], target,
                                additional_forward_args)
            if not return_convergence_delta:
                return attr
            return attr, self.compute_convergence_delta(attr, baselines, inputs, target, additional_forward_args)
        bases = Layout.of(xs).pack(baselines_like(baselines, xs))

        def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
            base = fit_to(bases if example < 0 else bases[example : example + 1], x)
            return km.DeepLift(model, baseline=base, eps=self.eps, multiply_by_inputs=self._multiply)

        return self._answer(inputs, target, additional_forward_args, build, return_convergence_delta, baselines)

    def _custom(self, func: Callable[..., Any], inputs: Any, references: list[tuple[Tensor, ...]], target: Any,
                extra: Any) -> Any:
        """captum's ``custom_attribution_func(multipliers, inputs, baselines)`` on camkit's multipliers.

        The multipliers against each reference (one, or each row of a distribution) are camkit's
        DeepLift without the multiplication; the function sees every (input, reference) pair in
        one batch, example-major, and its answers are averaged over the references, as in captum.
        """
        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        local = DeepLift(self.model, multiply_by_inputs=False, eps=self.eps)
        found = [local.attribute(xs, ref, target, extra) for ref in references]
        count = len(references)

        def pairs(parts: list[tuple[Tensor, ...]], i: int) -> Tensor:
            stacked = torch.stack([p[i] for p in parts], dim=1)  # [B, N, ...]: input-major
            return stacked.reshape(-1, *stacked.shape[2:])

        answer = func(tuple(pairs(found, i) for i in range(len(xs))), tuple(x.repeat_interleave(count, dim=0) for x in xs),
                      tuple(pairs(references, i) for i in range(len(xs))))
        answers = as_tuple(answer)
        if len(answers) != len(xs) or not all(isinstance(a, Tensor) and a.shape[:1] == (len(xs[0]) * count,)
                                              for a in answers):
            raise CaptumInputError(f"custom_attribution_func must return one tensor per input with {len(xs[0]) * count} "
                                   "rows (one per input-baseline pair), like the multipliers it is given")
        means = tuple(a.reshape(-1, count, *a.shape[1:]).mean(dim=1) for a in answers)
        return means if isinstance(inputs, tuple) else means[0]


def _distribution(baselines: Any, inputs: tuple[Tensor, ...]) -> Tensor:
    """captum's baseline distribution (tensors [N, *s_i], one per input, or a callable) packed to [N, ...]."""
    if callable(baselines) and not isinstance(baselines, Tensor):  # called with nothing, or with the inputs
        takes = len(inspect.signature(baselines).parameters)
        baselines = baselines() if takes == 0 else baselines(inputs if len(inputs) > 1 else inputs[0])
    items = baselines if isinstance(baselines, tuple) else (baselines,)
    if len(items) != len(inputs) or not all(isinstance(b, Tensor) for b in items):
        raise CaptumInputError("baselines must be one tensor [N, ...] per input (or a callable returning them)")
    rows = {b.shape[0] for b in items}
    if len(rows) != 1:
        raise CaptumInputError(f"every baseline tensor needs the same number of rows, got {sorted(rows)}")
    return Layout.of(tuple(b.to(x.dtype) for b, x in zip(items, inputs))).pack(items)


class DeepLiftShap(DeepLift):
    """captum's ``DeepLiftShap`` on :class:`camkit.DeepLiftShap`: DeepLift averaged over a baseline distribution."""

    def attribute(  # type: ignore[override]
        self,
        inputs: Any,
        baselines: Any,
        target: Any = None,
        additional_forward_args: Any = None,
        return_convergence_delta: bool = False,
        custom_attribution_func: Any = None,
    ) -> Any:
        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        dist = _distribution(baselines, xs)
        if custom_attribution_func is not None:
            if return_convergence_delta:
                raise NotComputedError("DeepLiftShap(custom_attribution_func=..., return_convergence_delta=True)")
            rows = Layout.of(xs).unpack(dist)  # the distribution per input, [N, *s_i]
            references = [tuple(r[j : j + 1].expand_as(x) for r, x in zip(rows, xs)) for j in range(dist.shape[0])]
            return self._custom(custom_attribution_func, inputs, references, target, additional_forward_args)

        def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
            return km.DeepLiftShap(model, baselines=fit_to(dist, x), eps=self.eps, multiply_by_inputs=self._multiply)

        self.delta_key = "pair_deltas"  # captum's delta: one per example and baseline, example-major
        return self._answer(inputs, target, additional_forward_args, build, return_convergence_delta)


