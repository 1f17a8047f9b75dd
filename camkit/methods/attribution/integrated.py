"""Integrated gradients (Sundararajan et al. 2017), batched under a memory bound."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Union

import torch
from torch import Tensor, nn

from ..._internal.checks import check_broadcasts
from ...errors import InvalidInputError, InvalidTargetError
from ...explanation import Explanation
from ...functional.attribution import IntegrationRule, blur, completeness_gap, integration_points
from ...targets.classes import OutputSelector, Target, resolve_target, select_output
from ...targets.neuron import NeuronTarget
from ...targets.tokens import TokenTarget
from .._core.binding import InputIndex
from ..registry import register_method
from ._baselines import baseline_hint
from .pixel import GradientAttribution, score_gradients

__all__ = ["Baseline", "IntegratedGradients"]

Baseline = Union[float, str, Tensor]


@register_method("integratedgradients")
class IntegratedGradients(GradientAttribution):
    """Integrated gradients: ``(x - x0) * integral_0^1 dS/dx(x0 + a (x - x0)) da``.

    The integral is a quadrature over ``steps`` points of the straight path from the
    baseline ``x0`` to ``x``. All ``B * steps`` path points of a batch are pushed through the
    model in chunks of at most ``max_batch`` images, so memory is bounded whatever ``steps``
    is, and the result does not depend on ``max_batch`` (up to float rounding).

    Any rank: ``x`` is a signal [B, C, T], an image [B, C, H, W] or a volume or a video
    [B, C, D, H, W] (written [B, C, *S]). ``raw`` is the signed attribution [B, C, *S]
    ([B, K, C, *S] for [B, K] targets), ``maps`` [B, *S] the normalised ``max_c |raw|``.
    ``extras`` holds ``"completeness_gap"``: ``sum(raw) - (score(x) - score(x0))`` per
    sample ([B] or [B, K]; zero for an exact integral, so it measures the quadrature
    error), ``"baseline_scores"`` (the target scores at ``x0``), ``"steps"`` and ``"rule"``.

    Args:
        model: the model to explain.
        steps: quadrature points per image (default 50).
        baseline: ``x0``: a number (a constant input, default ``0.0``), ``"blur"`` (each
            input blurred with a Gaussian of ``blur_sigma`` samples along every spatial axis,
            see :func:`camkit.functional.blur`) or a tensor that broadcasts to the input
            ([C, *S], [1, C, *S] or [B, C, *S]).
        rule: ``"gausslegendre"`` (default), ``"midpoint"``, ``"trapezoid"``, ``"left"`` or ``"right"``; see
            :func:`camkit.functional.integration_points`.
        max_batch: the most path images run through the model at once (default 32).
        multiply_by_inputs: ``False`` leaves out the factor ``x - x0``: ``raw`` is then the
            path's mean gradient (the "local" form; captum's ``multiply_by_inputs=False``).
            ``extras["completeness_gap"]`` still measures the multiplied attribution.
        blur_sigma: the blur baseline's sigma in samples; ``None`` means a tenth of the
            largest spatial side (``max(H, W) / 10`` for an image).
        output, keep_mode, input_index: see :class:`~camkit.Explainer`. Keyword inputs
            (``explain(..., kwargs=...)``) reach every forward, each path image given its own
            sample's rows of those with one row per sample (see :class:`~camkit.Explainer`);
            other positional inputs (``inputs=``) are refused.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(2, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[1.0, -3.0]]))
        >>> explanation = camkit.IntegratedGradients(net, steps=4).explain(torch.tensor([[[[2.0, 1.0]]]]), target=0)
        >>> explanation.raw.tolist(), explanation.extras["completeness_gap"].abs().item() < 1e-6
        ([[[[2.0, -3.0]]]], True)
    """

    reruns_rows = True

    cost: ClassVar[str] = "steps x (1 forward + 1 backward) per image, in chunks of max_batch"
    use_when: ClassVar[str] = (
        "You need attributions that add up to the score difference from a baseline (completeness)."
    )

    def __init__(
        self,
        model: nn.Module,
        *,
        steps: int = 50,
        baseline: Baseline = 0.0,
        rule: IntegrationRule = "gausslegendre",
        max_batch: int = 32,
        multiply_by_inputs: bool = True,
        blur_sigma: float | None = None,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode, input_index=input_index)
        integration_points(steps, rule)  # validates steps and rule now, not at the first call
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise InvalidInputError(f"max_batch must be a positive int, got {max_batch!r}")
        if isinstance(baseline, str) and baseline != "blur":
            raise InvalidInputError(f"baseline must be a number, 'blur' or a tensor, got {baseline!r}")
        if not isinstance(baseline, (int, float, str, Tensor)) or isinstance(baseline, bool):
            raise InvalidInputError(f"baseline must be a number, 'blur' or a tensor, got {type(baseline).__name__}")
        self.steps = steps
        self.baseline = baseline
        self.rule: IntegrationRule = rule
        self.max_batch = max_batch
        self.blur_sigma = blur_sigma
        self.multiply_by_inputs = bool(multiply_by_inputs)
        self._on_device: dict[tuple[str, int, str], tuple[Tensor, Tensor]] = {}

    def _bind_inputs(self, x: Tensor, inputs: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> Any:
        if inputs is not None:
            raise InvalidInputError(
                f"{type(self).__name__} runs the model on batches of path images, which other positional "
                "inputs cannot follow; pass per-call keyword inputs with kwargs= or wrap the model so x is its "
                "only positional input."
            )
        return super()._bind_inputs(x, inputs, kwargs)

    def _baseline(self, x: Tensor) -> Tensor:
        if isinstance(self.baseline, Tensor):
            base = self.baseline.detach().to(device=x.device, dtype=x.dtype)
            check_broadcasts(base, x, what="input", hint=baseline_hint(x))
            return base.expand_as(x)
        if isinstance(self.baseline, str):
            sigma = self.blur_sigma if self.blur_sigma is not None else max(x.shape[2:]) / 10.0
            return blur(x, sigma)
        return torch.full((1, *x.shape[1:]), float(self.baseline), dtype=x.dtype, device=x.device).expand_as(x)

    def _points(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """The quadrature's nodes and weights on ``device``, copied there once per device."""
        key = (str(device), self.steps, self.rule)
        if key not in self._on_device:
            self._on_device[key] = integration_points(self.steps, self.rule, dtype=torch.float32, device=device)
        return self._on_device[key]

    def _scores(self, output: Tensor, classes: Tensor | None, target: Target, rows: Tensor | None) -> Tensor:
        """Target scores of ``output``; ``rows`` maps each output row to its sample."""
        if classes is None and callable(target):
            # token positions given per sample follow the path images' rows
            scores = (target.for_rows(rows) if rows is not None and isinstance(target, TokenTarget) else target)(output)
            if not isinstance(scores, Tensor) or scores.shape[0] != output.shape[0]:
                raise InvalidTargetError(
                    f"a callable target must return a tensor [N] or [N, K] for N={output.shape[0]} images"
                )
            return scores
        if classes is None:
            raise InvalidTargetError(f"no classes were resolved for target {target!r}")
        chosen = classes if rows is None else classes[rows]
        if chosen.dim() == 2:
            return output.gather(1, chosen)
        return output.gather(1, chosen[:, None])[:, 0]

    def _endpoint_scores(
        self, x: Tensor, base: Tensor, shared: Tensor | None, target: Target
    ) -> tuple[Tensor | None, Tensor, Tensor]:
        """``(classes, scores, baseline_scores)``: the target resolved on ``x``, scored at both ends of the path.

        One forward of the images with the baseline's distinct rows beneath them (``shared``, its
        one row, when every image has the same baseline), where rows cannot influence each other's scores: class targets or a
        :class:`~camkit.NeuronTarget`, no per-call model inputs, no module in training mode.
        Otherwise two forwards, as the target or the model may read the whole batch.
        """
        neuron = isinstance(target, NeuronTarget)  # a callable, but one that scores each row on its own
        if (callable(target) and not isinstance(target, Tensor) and not neuron) or not self._rows_can_join():
            classes, scores = self._target_scores(x, target)
            return classes, scores, self._scores(self._forward(base), classes, target, None)
        batch = x.shape[0]
        ends = torch.cat([x, base if shared is None else shared])
        if neuron:
            _, both = self._target_scores(ends, target)
            refs = both[batch:]
            return None, both[:batch], refs if shared is None else refs.expand(batch, *refs.shape[1:])
        out = select_output(self._call_model(ends), self.output)
        classes, scores = resolve_target(target, out[:batch], batch=batch)
        refs = out[batch:] if shared is None else out[batch:].expand(batch, *out.shape[1:])
        return classes, scores, self._scores(refs, classes, target, None)

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        x = x.detach()
        base = self._baseline(x)
        # one baseline row for all images: broadcast, not gathered, and scored once
        shared = base[:1] if base.stride(0) == 0 or base.shape[0] == 1 else None
        with torch.no_grad():
            classes, scores, base_scores = self._endpoint_scores(x, base, shared, target)
        alphas, weights = self._points(x.device)
        batch = x.shape[0]
        per_row = (batch, *scores.shape[1:], *x.shape[1:])
        total = torch.zeros(per_row, dtype=torch.float32, device=x.device)
        change = x - base
        for start in range(0, batch * self.steps, self.max_batch):
            index = torch.arange(start, min(start + self.max_batch, batch * self.steps), device=x.device)
            sample, step = index // self.steps, index % self.steps
            alpha = alphas[step].view(-1, *([1] * (x.dim() - 1))).to(x.dtype)  # over [C, *S]
            # base + alpha * (x - base), in one pass over the path images
            leaf = torch.addcmul(base[sample] if shared is None else shared, alpha, change[sample]).requires_grad_(True)
            with torch.enable_grad():
                with self._rule():
                    chunk_scores = self._scores(self._forward_rows(leaf.clone(), sample), classes, target, sample)
                weight = weights[step]
                folded = chunk_scores.dtype in (torch.float32, torch.float64)
                if folded:  # the weight scales each path image's score, so its gradient comes out weighted
                    weight = weight.to(chunk_scores.dtype)
                    chunk_scores = chunk_scores * (weight[:, None] if chunk_scores.dim() == 2 else weight)
                grads = score_gradients(chunk_scores, leaf).float()
            if not folded:  # half precision: weighted after the backward, in float32
                grads = grads * weight.view(-1, *([1] * (grads.dim() - 1)))
            total.index_add_(0, sample, grads)
        diff = change.float()
        raw = (diff.unsqueeze(1) if scores.dim() == 2 else diff) * total
        size = tuple(x.shape[2:])
        gap = completeness_gap(raw, scores.float(), base_scores.float(), spatial_dims=len(size))
        raw = raw if self.multiply_by_inputs else total
        maps, flat = self.maps_from_raw(raw, size)
        return Explanation(
            maps=maps,
            raw=raw,
            target=classes,
            scores=scores,
            flat=flat,
            method=self.key,
            extras={"completeness_gap": gap, "baseline_scores": base_scores, "steps": self.steps, "rule": self.rule},
        )
