"""Layer attributions: how much each unit of a hidden layer contributes to the target score.

:class:`LayerActivation`, :class:`LayerGradientXActivation`,
:class:`LayerIntegratedGradients` and :class:`LayerConductance` take one layer (as the CAMs
do) and return ``raw`` at the layer's output shape ([B, C, *s], [B, N, D] for tokens;
[B, K, ...] for [B, K] targets). ``maps`` is a CAM-like view: the attribution brought to
a grid [B, C, *s] with one axis per spatial axis of the input ([B, C, t] for a signal,
[B, C, h, w] for an image, [B, C, d, h, w] for a volume or a video;
:meth:`~camkit.CAMExplainer.to_grid`), summed over channels (signed), upsampled (linear,
bilinear or trilinear) and min-max normalised; ``extras["map"]`` holds that channel sum
before upsampling. Hooks come only from :mod:`camkit.hooks`; gradients are taken with
:func:`torch.autograd.grad`, so no ``param.grad`` is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..._internal.checks import BATCH_SHAPES, check_broadcasts
from ..._internal.state import GradModes
from ...errors import InvalidInputError, LayerNotReachedError
from ...explanation import Explanation
from ...functional.attribution import IntegrationRule, integration_points
from ...hooks import HookScope, LayerCapture
from ...layers.names import LayerSpec
from ...targets.classes import OutputSelector, Target
from .._core.binding import InputIndex
from .._core.cam_base import CAMExplainer, Reshape
from .._core.forward import RowScorer, capture_forward, check_positive, chunks, expand_targets
from .._core.output import finish_maps
from ..registry import register_method
from .pixel import score_gradients

__all__ = [
    "LayerActivation",
    "LayerAttribution",
    "LayerConductance",
    "LayerGradientXActivation",
    "LayerIntegratedGradients",
]


class LayerAttribution(CAMExplainer):
    """Base of the layer attributions: one layer, ``raw`` at its shape, a channel-sum map view."""

    def _layer(self, x: Tensor) -> tuple[str, nn.Module]:
        layers = self.layers(x)
        if len(layers) != 1:
            raise InvalidInputError(
                f"{type(self).__name__} attributes to one layer, got {len(layers)} ({[n for n, _ in layers]}); "
                "make one explainer per layer."
            )
        return layers[0]

    def _baseline(self, baseline: float | Tensor, x: Tensor) -> Tensor:
        if isinstance(baseline, Tensor):
            base = baseline.detach().to(device=x.device, dtype=x.dtype)
            inner = BATCH_SHAPES[x.dim()][len("[B, ") : -1]  # "C, H, W" for an image
            check_broadcasts(base, x, what="input", hint=f"pass [{inner}], [1, {inner}] or [B, {inner}].")
            return base.expand_as(x)
        return torch.full_like(x, float(baseline))

    def _finish(
        self, attr: Tensor, x: Tensor, classes: Tensor | None, scores: Tensor, **extras: Any
    ) -> Explanation:
        """Wrap a layer attribution [B, (K,) ...] with its map view."""
        multi = scores.dim() == 2
        batch = x.shape[0]
        flat_attr = attr.reshape(-1, *attr.shape[2:]) if multi else attr
        grid = self.to_grid([flat_attr], x)[0]
        if grid.dim() != x.dim():
            raise InvalidInputError(
                f"the layer's attribution has shape {list(attr.shape)}; a map view of a {list(x.shape)} input needs "
                f"a grid with its {x.dim() - 2} spatial axes"
            )
        view = grid.sum(dim=1)
        view = view.reshape(batch, -1, *view.shape[1:]) if multi else view
        maps, flat = finish_maps([view], tuple(x.shape[2:]), window=self._window(x))  # detectors' resize undone
        return Explanation(
            maps=maps.to(x.device),
            raw=attr,
            target=classes,
            scores=scores.detach(),
            flat=flat.to(x.device),
            method=self.key,
            layers=self._names(),
            extras={"map": view, **extras},
        )


@register_method("layeractivation")
class LayerActivation(LayerAttribution):
    """The layer's output itself (captum's ``LayerActivation``): no gradient, one forward.

    ``raw`` is the activation (float32); the target only sets ``target`` and ``scores``
    (for [B, K] targets the activation is repeated K times).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(1, 2, 1, bias=False), nn.Flatten(), nn.Linear(8, 2))
        >>> with torch.no_grad():
        ...     _ = net[0].weight.copy_(torch.tensor([[[[1.0]]], [[[2.0]]]]))
        >>> e = camkit.LayerActivation(net, "0").explain(torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]]))
        >>> e.raw[0, 1].tolist(), e.extras["map"].tolist()
        ([[2.0, 4.0], [6.0, 8.0]], [[[3.0, 6.0], [9.0, 12.0]]])
    """

    needs_grad = False
    needs_score: ClassVar[bool] = False  # no score needed: runs on any output (detectors...)
    cost: ClassVar[str] = "1 forward"
    use_when: ClassVar[str] = "You want to see what a layer responds to, whatever the class."

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        self._layer(x)
        cap = capture_forward(self, x, target)
        act = cap.acts[0].float()
        if cap.multi:
            act = act[:, None].expand(-1, cap.scores.shape[1], *act.shape[1:])
        return self._finish(act, x, cap.classes, cap.scores)


@register_method("layergradientxactivation")
class LayerGradientXActivation(LayerAttribution):
    """Activation times the gradient of the target score at the layer: ``A * dS/dA``.

    One forward and one backward from the layer on (per target column). The map view,
    ``sum_c A dS/dA``, is HiResCAM's map before its ReLU. With ``multiply_by_inputs=False``
    ``raw`` is the gradient ``dS/dA`` alone (captum's ``multiply_by_inputs=False``).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(1, 1, 1, bias=False), nn.Flatten(), nn.Linear(2, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[0].weight.fill_(2.0)
        ...     _ = net[2].weight.copy_(torch.tensor([[3.0, -1.0]]))
        >>> camkit.LayerGradientXActivation(net, "0").explain(torch.tensor([[[[1.0, 5.0]]]]), 0).raw.tolist()
        [[[[6.0, -10.0]]]]
    """

    cost: ClassVar[str] = "1 forward + 1 backward (from the layer)"
    use_when: ClassVar[str] = "You want a cheap signed attribution to each unit of a layer."

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        multiply_by_inputs: bool = True,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        reshape: Reshape | None = None,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode, reshape=reshape)
        self.multiply_by_inputs = bool(multiply_by_inputs)

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        layer = self._layer(x)
        with LayerCapture([layer], gradients=True, call=self.call) as capture:
            classes, scores = self._target_scores(x, target)
            act = capture.activations()[0]
            grads = score_gradients(scores, act)
        act = act.detach().float()
        attr = (act[:, None] if scores.dim() == 2 else act) * grads.float() if self.multiply_by_inputs else grads.float()
        return self._finish(attr, x, classes, scores)


@contextmanager
def _substitute(module: nn.Module, call: int, value: Tensor) -> Iterator[None]:
    """Replace the ``call``-th output of ``module`` by ``value`` in the forwards run inside.

    Autograd is off until the substitution, then on: the graph starts at ``value``.
    """
    seen = [0]
    modes = GradModes()

    def hook(mod: nn.Module, args: Any, output: Any) -> Tensor | None:
        index = seen[0]
        seen[0] += 1
        if index != call:
            return None
        if not isinstance(output, Tensor) or output.shape != value.shape:
            got = list(output.shape) if isinstance(output, Tensor) else type(output).__name__
            raise InvalidInputError(f"the layer returned {got}, expected a tensor of shape {list(value.shape)}")
        modes.enter(True)
        return value.clone()

    with modes:
        modes.enter(False)
        with HookScope() as scope:
            scope.forward(module, hook)
            yield


class _PathMethod(LayerAttribution):
    """Shared arguments of the path methods (baseline, steps, chunking)."""

    reruns_rows = True

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        steps: int = 50,
        baseline: float | Tensor = 0.0,
        max_batch: int = 32,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
        reshape: Reshape | None = None,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode, input_index=input_index, reshape=reshape)
        if isinstance(baseline, bool) or not isinstance(baseline, (int, float, Tensor)):
            raise InvalidInputError(f"baseline must be a number or a tensor, got {type(baseline).__name__}")
        self.steps = check_positive("steps", steps)
        self.baseline = baseline
        self.max_batch = check_positive("max_batch", max_batch)


@register_method("layerintegratedgradients")
class LayerIntegratedGradients(_PathMethod):
    """Integrated gradients at a layer: the path runs between the layer's outputs for the
    baseline and for the input.

    With ``a`` and ``a0`` the layer's outputs for ``x`` and the baseline image ``x0``,
    ``raw = (a - a0) * sum_i w_i dS/da (a0 + alpha_i (a - a0))``: the layer's output is
    replaced by each path point while the rest of the network runs on ``x`` (as captum's
    ``LayerIntegratedGradients`` does). ``B * steps`` path points run in chunks of
    ``max_batch``. ``extras["completeness_gap"]`` is ``sum(raw) - (S(x) - S(x0))`` per
    sample (the quadrature error), ``extras["baseline_scores"]`` the scores at ``x0``.

    Args:
        model, layer, call, output, keep_mode, reshape, input_index: as for :class:`~camkit.GradCAM`.
        steps: quadrature points (default 50).
        rule: ``"gausslegendre"`` (default), ``"midpoint"``, ``"trapezoid"``, ``"left"`` or ``"right"``.
        baseline: ``x0``, a number or a tensor that broadcasts to the input.
        max_batch: the most path points run at once.
        multiply_by_inputs: ``False`` leaves out the factor ``a - a0``: ``raw`` is the path's mean
            gradient at the layer (captum's ``multiply_by_inputs=False``); the gap still
            measures the multiplied attribution.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(1, 1, 1, bias=False), nn.Flatten(), nn.Linear(2, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[0].weight.fill_(2.0)
        ...     _ = net[2].weight.copy_(torch.tensor([[3.0, -1.0]]))
        >>> e = camkit.LayerIntegratedGradients(net, "0", steps=2).explain(torch.tensor([[[[1.0, 5.0]]]]), 0)
        >>> e.raw.tolist(), abs(e.extras["completeness_gap"].item()) < 1e-5
        ([[[[6.0, -10.0]]]], True)
    """

    cost: ClassVar[str] = "2 forwards + steps x (1 forward + 1 backward from the layer)"
    use_when: ClassVar[str] = "You want layer attributions that add up to S(x) - S(baseline)."

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        steps: int = 50,
        rule: IntegrationRule = "gausslegendre",
        baseline: float | Tensor = 0.0,
        max_batch: int = 32,
        multiply_by_inputs: bool = True,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
        reshape: Reshape | None = None,
    ) -> None:
        super().__init__(
            model, layer, steps=steps, baseline=baseline, max_batch=max_batch, call=call, output=output,
            keep_mode=keep_mode, input_index=input_index, reshape=reshape,
        )
        integration_points(steps, rule)
        self.rule: IntegrationRule = rule
        self.multiply_by_inputs = bool(multiply_by_inputs)

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        _, module = self._layer(x)
        x = x.detach()
        base = self._baseline(self.baseline, x)
        cap = capture_forward(self, x, target)
        cap0 = capture_forward(self, base, cap.classes if cap.classes is not None else target)
        act, act0 = cap.acts[0], cap0.acts[0]
        if act.shape != act0.shape:
            raise InvalidInputError(
                f"the layer's output for the baseline has shape {list(act0.shape)}, for the input {list(act.shape)}"
            )
        call = self.call if self.call >= 0 else cap.calls[0] + self.call
        if not 0 <= call < cap.calls[0]:
            raise LayerNotReachedError(f"call={self.call} is out of range: the layer ran {cap.calls[0]} time(s)")
        alphas, weights = integration_points(self.steps, self.rule, dtype=torch.float32, device=x.device)
        scorer = RowScorer(target, expand_targets(cap.classes), softmax=False, output=self.output)
        k = cap.scores.shape[1] if cap.multi else 1
        total = torch.zeros(x.shape[0], k, *act.shape[1:], device=x.device)
        diff = act - act0
        for part in chunks(x.shape[0] * self.steps, self.max_batch):
            index = torch.arange(part.start, part.stop, device=x.device)
            sample, step = index // self.steps, index % self.steps
            shape = (-1, *([1] * (act.dim() - 1)))
            leaf = (act0[sample] + alphas[step].view(shape).to(act.dtype) * diff[sample]).requires_grad_(True)
            with _substitute(module, call, leaf):
                values = scorer(self._call_model_rows(x[sample], sample), sample)
                grads = score_gradients(values, leaf).float()  # [n, K, ...]
            total.index_add_(0, sample, grads * weights[step].view(-1, 1, *([1] * (act.dim() - 1))))
        attr = diff.float()[:, None] * total
        attr = attr if cap.multi else attr[:, 0]
        base_scores = cap0.scores.float()
        gap = attr.flatten(cap.scores.dim()).sum(dim=-1) - (cap.scores.float() - base_scores)
        if not self.multiply_by_inputs:
            attr = total if cap.multi else total[:, 0]
        return self._finish(
            attr, x, cap.classes, cap.scores, completeness_gap=gap, baseline_scores=base_scores, steps=self.steps,
            rule=self.rule,
        )


@register_method("layerconductance")
class LayerConductance(_PathMethod):
    """Conductance (Dhamdhere et al. 2018): the flow of the target score through each unit
    of a layer along the straight path from the baseline image to the input.

    With ``x_i = x0 + alpha_i (x - x0)`` for the ``steps + 1`` path points ``alpha_0 < .. <
    alpha_steps`` and ``a_i`` the layer's output at ``x_i``:
    ``raw = sum_{i < steps} dS/da (x_i) * (a_{i+1} - a_i)``, a Riemann sum. With the default
    ``rule="trapezoid"`` the points are ``i / steps`` and include both ends, so ``sum(raw)``
    tends to ``S(x) - S(x0)``; ``extras["completeness_gap"]`` is ``sum(raw) - (S(x) - S(x0))``
    whatever the rule. The default equals captum's ``LayerConductance`` with
    ``method="riemann_trapezoid"``, and each other rule captum's method of that name (its
    default ``"gausslegendre"``: nodes that leave out the path's two ends, so the sum then
    approximates ``S(x_last) - S(x_first)`` for the first and last inner points, and the gap
    does not vanish). ``B * (steps + 1)`` path images run in chunks of ``max_batch``.

    Args:
        model, layer, call, output, keep_mode, reshape, input_index: as for :class:`~camkit.GradCAM`.
        steps: path segments (default 50).
        rule: where the ``steps + 1`` points lie: the nodes of
            :func:`camkit.functional.integration_points` for ``steps + 1`` nodes and this rule
            (``"trapezoid"``, the default, ``"gausslegendre"``, ``"midpoint"``, ``"left"`` or
            ``"right"``); only the nodes are used, not the weights.
        baseline: ``x0``, a number or a tensor that broadcasts to the input.
        max_batch: the most path images run at once.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(1, 1, 1, bias=False), nn.Flatten(), nn.Linear(2, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[0].weight.fill_(2.0)
        ...     _ = net[2].weight.copy_(torch.tensor([[3.0, -1.0]]))
        >>> camkit.LayerConductance(net, "0", steps=4).explain(torch.tensor([[[[1.0, 5.0]]]]), 0).raw.tolist()
        [[[[6.0, -10.0]]]]
    """

    cost: ClassVar[str] = "(steps + 1) x (1 forward + 1 backward from the layer)"
    use_when: ClassVar[str] = "You want the share of the score that flows through each unit of a layer."

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        steps: int = 50,
        rule: IntegrationRule = "trapezoid",
        baseline: float | Tensor = 0.0,
        max_batch: int = 32,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
        reshape: Reshape | None = None,
    ) -> None:
        super().__init__(
            model, layer, steps=steps, baseline=baseline, max_batch=max_batch, call=call, output=output,
            keep_mode=keep_mode, input_index=input_index, reshape=reshape,
        )
        integration_points(steps + 1, rule)
        self.rule: IntegrationRule = rule

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        layer = self._layer(x)
        x = x.detach()
        base = self._baseline(self.baseline, x)
        with torch.no_grad():
            classes, scores = self._target_scores(x, target)
        scorer = RowScorer(target, expand_targets(classes), softmax=False, output=self.output)
        points = self.steps + 1
        alphas = integration_points(points, self.rule, dtype=torch.float64)[0].to(device=x.device, dtype=x.dtype)
        total: Tensor | None = None
        ends = torch.zeros(x.shape[0], 2, scores.shape[1] if scores.dim() == 2 else 1, device=x.device)
        prev_act: Tensor | None = None
        prev_grad: Tensor | None = None
        for part in chunks(x.shape[0] * points, self.max_batch):
            index = torch.arange(part.start, part.stop, device=x.device)
            sample, step = index // points, index % points
            images = base[sample] + alphas[step].view(-1, *(1,) * (x.dim() - 1)) * (x[sample] - base[sample])
            with LayerCapture([layer], gradients=True, call=self.call) as capture:
                values = scorer(self._call_model_rows(images, sample), sample)
                act = capture.activations()[0]
                grads = score_gradients(values, act).float()  # [n, K, ...]
            act = act.detach().float()
            if total is None:
                total = torch.zeros(x.shape[0], *grads.shape[1:], device=x.device)
                prev_act, prev_grad = torch.zeros_like(act[:1]), torch.zeros_like(grads[:1])
            assert prev_act is not None and prev_grad is not None
            acts, gs = torch.cat([prev_act, act]), torch.cat([prev_grad, grads])
            # Row r pairs with the row before it (the same sample's previous point) unless it is a
            # path's first point. Rows are weighted by 0/1 instead of selected with a boolean mask,
            # whose size a device would have to report back to the host.
            inner = (step > 0).to(act.dtype)
            flow = gs[:-1] * (acts[1:] - acts[:-1])[:, None]
            total.index_add_(0, sample, flow * inner.view(-1, *([1] * (flow.dim() - 1))))
            for end, at in ((0, 0), (1, points - 1)):
                hit = (step == at).to(act.dtype)  # one row per sample and end, over all chunks
                ends[:, end].index_add_(0, sample, values.detach().float() * hit[:, None])
            prev_act, prev_grad = act[-1:], grads[-1:]
        assert total is not None
        attr = total if scores.dim() == 2 else total[:, 0]
        start, stop = ends[:, 0].reshape(scores.shape), ends[:, 1].reshape(scores.shape)
        if self.rule != "trapezoid":  # the points leave out an end: the scores there come from the ends themselves
            stop = scores.float()
            with torch.no_grad():
                start = scorer(self.model(base), torch.arange(x.shape[0], device=x.device)).float().reshape(scores.shape)
        gap = attr.flatten(scores.dim()).sum(dim=-1) - (stop - start)
        return self._finish(attr, x, classes, scores, completeness_gap=gap, steps=self.steps, rule=self.rule)
