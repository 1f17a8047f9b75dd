"""DeepLift at a layer: the Rescale multipliers of the target score with respect to a hidden layer.

:class:`LayerDeepLift` runs the reference pass on the baseline input (recording every activation
call, as :class:`~camkit.DeepLift` does, and the layer's output ``a0`` there), then the main pass
on the input with each activation after the layer replaced by its Rescale rule, and takes the
gradient of the score with respect to the layer's output ``a``: those are the layer's multipliers
``m``, and ``raw = (a - a0) * m``. On a network whose non-linearities after the layer all have a
rule, ``raw`` sums per input to ``score(x) - score(x0)``. :class:`LayerDeepLiftShap` averages it
over a set of baselines.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError
from ...explanation import Explanation
from ...hooks import LayerCapture
from ...layers.names import LayerSpec
from ...targets.classes import OutputSelector, Target, resolve_target, select_output
from .._core.cam_base import Reshape
from ..registry import register_method
from ._activations import warn_unruled
from ._baselines import baselines_for, check_baselines
from ._rescale_mode import _Mismatch, _RescaleMode
from .layer import LayerAttribution
from .pixel import score_gradients

__all__ = ["LayerDeepLift", "LayerDeepLiftShap"]


@register_method("layerdeeplift")
class LayerDeepLift(LayerAttribution):
    """DeepLift (Rescale rule) at a layer: ``raw = (a - a0) * m``, ``m`` the layer's multipliers.

    ``a`` and ``a0`` are the layer's outputs for the input ``x`` and the baseline ``x0``; ``m``
    is the gradient of the target score with respect to ``a`` with every activation after the
    layer (each spelling :class:`~camkit.DeepLift` knows) taking its Rescale multiplier against
    the baseline's pass. ``raw`` has the layer's output shape ([B, C, *s]; [B, K, ...] for [B, K]
    targets); ``extras["delta"]`` is ``sum(raw) - (score(x) - score(x0))`` per input (zero up to
    rounding when every non-linearity after the layer has a rule), ``extras["baseline_scores"]``
    the scores at ``x0``.

    Args:
        model, layer, call, output, keep_mode, reshape: as for :class:`~camkit.GradCAM`.
        baseline: ``x0``, a number (default ``0.0``) or a tensor that broadcasts to the input.
        eps: input changes below this use the activation's derivative (default ``1e-10``).
        multiply_by_inputs: ``False``: ``raw`` is the multipliers ``m`` alone (captum's local
            form); ``extras["delta"]`` still measures ``(a - a0) * m``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(1, 1, 1, bias=False), nn.ReLU(), nn.Flatten(), nn.Linear(2, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[0].weight.fill_(1.0)
        ...     _ = net[3].weight.copy_(torch.tensor([[1.0, -2.0]]))
        >>> e = camkit.LayerDeepLift(net, "0").explain(torch.tensor([[[[3.0, 1.0]]]]), 0)
        >>> e.raw.tolist(), e.extras["delta"].abs().item() < 1e-6
        ([[[[3.0, -2.0]]]], True)
    """

    cost: ClassVar[str] = "2 forwards (baseline and input) + 1 backward from the layer"
    use_when: ClassVar[str] = "You want layer attributions that sum exactly to score(x) - score(baseline) in one pass."

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        *,
        baseline: float | Tensor = 0.0,
        eps: float = 1e-10,
        multiply_by_inputs: bool = True,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        reshape: Reshape | None = None,
    ) -> None:
        super().__init__(model, layer, call=call, output=output, keep_mode=keep_mode, reshape=reshape)
        if isinstance(baseline, bool) or not isinstance(baseline, (int, float, Tensor)):
            raise InvalidInputError(f"baseline must be a number or a tensor, got {type(baseline).__name__}")
        if not eps >= 0:
            raise InvalidInputError(f"eps must be >= 0, got {eps!r}")
        self.baseline = baseline
        self.eps = float(eps)
        self.multiply_by_inputs = bool(multiply_by_inputs)

    def _pair(self, x: Tensor, base: Tensor, target: Target) -> tuple[Tensor | None, Tensor, Tensor, Tensor, Tensor]:
        """``(classes, scores, baseline_scores, a - a0, m)`` of ``x`` against the baseline batch ``base`` [B, ...]."""
        layer = self._layer(x)
        recorder = _RescaleMode()
        with torch.no_grad(), recorder, LayerCapture([layer], gradients=False, call=self.call) as reference:
            raw0 = self._call_model(base)
            act0 = reference.activations()[0]
        mode = _RescaleMode(recorder.recorded, self.eps)
        try:
            with LayerCapture([layer], gradients=True, call=self.call) as capture:
                with mode:
                    classes, scores = self._target_scores(x, target)
                act = capture.activations()[0]
                grads = score_gradients(scores, act)
            if mode.index != len(recorder.recorded):
                raise _Mismatch(f"the forward called {mode.index} activations, the baseline's {len(recorder.recorded)}")
        except _Mismatch as err:
            raise InvalidInputError(
                f"{type(self).__name__}: {err}. The Rescale rule pairs the k-th activation call on the input with the "
                "k-th on the baseline: the forward must call the same activations in the same order for both."
            ) from None
        warn_unruled(type(self).__name__, mode.unruled,
                     "their plain gradient is used, so the attributions need not sum to score(x) - score(baseline).")
        with torch.no_grad():
            out0 = select_output(raw0, self.output)
            if classes is None:
                base_scores = resolve_target(target, out0, batch=x.shape[0])[1]
            else:
                picked = out0.gather(1, classes if classes.dim() == 2 else classes[:, None])
                base_scores = picked if classes.dim() == 2 else picked[:, 0]
        if act.shape != act0.shape:
            raise InvalidInputError(f"the layer's output is {list(act.shape)} for the input, {list(act0.shape)} for the baseline")
        return classes, scores.detach(), base_scores.detach(), (act - act0).detach().float(), grads.float()

    @staticmethod
    def _product(diff: Tensor, grads: Tensor, scores: Tensor) -> Tensor:
        return (diff[:, None] if scores.dim() == 2 else diff) * grads

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        x = x.detach()
        base = self._baseline(self.baseline, x)
        classes, scores, base_scores, diff, grads = self._pair(x, base, target)
        attr = self._product(diff, grads, scores)
        gap = attr.flatten(scores.dim()).sum(dim=-1) - (scores.float() - base_scores.float())
        return self._finish(attr if self.multiply_by_inputs else grads, x, classes, scores, delta=gap,
                            baseline_scores=base_scores)


@register_method("layerdeepliftshap")
class LayerDeepLiftShap(LayerDeepLift):
    """:class:`LayerDeepLift` averaged over a set of baselines [N, C, *S] (captum's ``LayerDeepLiftShap``).

    ``raw = mean_j LayerDeepLift(x, b_j)``; it sums per input to ``score(x) - mean_j score(b_j)``
    (``extras["delta"]``), and ``extras["pair_deltas"]`` [B, N] holds each baseline's own gap.
    One baseline runs at a time (two forwards and one backward each).

    Args:
        model, layer, call, output, keep_mode, reshape, eps, multiply_by_inputs: as for
            :class:`LayerDeepLift`.
        baselines: [N, C, *S] (or one baseline [C, *S]); ``None`` is one all-zero input.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(1, 2, 1), nn.ReLU(), nn.Flatten(), nn.Linear(8, 1))
        >>> x, bases = torch.rand(1, 1, 2, 2), torch.rand(3, 1, 2, 2)
        >>> raw = camkit.LayerDeepLiftShap(net, "0", bases).explain(x, 0).raw
        >>> each = [camkit.LayerDeepLift(net, "0", baseline=b).explain(x, 0).raw for b in bases]
        >>> torch.allclose(raw, sum(each) / 3, atol=1e-6)
        True
    """

    cost: ClassVar[str] = "N x (2 forwards + 1 backward from the layer)"
    use_when: ClassVar[str] = "You want LayerDeepLift without betting on one baseline."

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec = None,
        baselines: Tensor | None = None,
        *,
        eps: float = 1e-10,
        multiply_by_inputs: bool = True,
        call: int = -1,
        output: OutputSelector = None,
        keep_mode: bool = False,
        reshape: Reshape | None = None,
    ) -> None:
        check_baselines(baselines)
        super().__init__(model, layer, eps=eps, multiply_by_inputs=multiply_by_inputs, call=call, output=output,
                         keep_mode=keep_mode, reshape=reshape)
        self.baselines = None if baselines is None else baselines.detach()

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        x = x.detach()
        bases = baselines_for(self.baselines, x)
        attr = local = base_total = None
        gaps: list[Tensor] = []
        resolved: Any = target
        classes: Tensor | None = None
        scores = x.new_zeros(0)
        for row in bases:
            classes, scores, base_scores, diff, grads = self._pair(x, row[None].expand_as(x), resolved)
            resolved = classes if classes is not None else target  # every baseline explains the same classes
            part = self._product(diff, grads, scores)
            gaps.append(part.flatten(scores.dim()).sum(dim=-1) - (scores.float() - base_scores.float()))
            attr = part if attr is None else attr + part
            local = grads if local is None else local + grads
            base_total = base_scores.float() if base_total is None else base_total + base_scores.float()
        count = bases.shape[0]
        assert attr is not None and local is not None and base_total is not None
        mean, base_mean = attr / count, base_total / count
        gap = mean.flatten(scores.dim()).sum(dim=-1) - (scores.float() - base_mean)
        return self._finish(mean if self.multiply_by_inputs else local / count, x, classes, scores, delta=gap,
                            baseline_scores=base_mean, pair_deltas=torch.stack(gaps, dim=1), baselines=count)
