"""DeepLift with the Rescale rule (Shrikumar et al. 2017) and DeepLiftShap, on every activation spelling.

How a call runs
---------------
1. *Reference pass*: the model runs once on the baseline (one image when the baseline is the same for the whole batch,
   as for a number or a [C, *S] tensor) without autograd, while a :class:`~torch.overrides.TorchFunctionMode` records
   the input of every activation call, in call order.
2. *Main pass*: the model runs on the images under a second mode that replaces the k-th activation call by an autograd
   Function computing the same value (in place when the call was in place) whose backward multiplies the gradient by
   the Rescale multiplier ``(f(x) - f(x0)) / (x - x0)`` against the k-th recorded reference ``x0``
   (:func:`camkit.functional.rescale_multiplier`).
3. One backward to the input gives the multipliers ``m``; ``raw = (x - x0) * m``.

Linear operations (convolutions, linear layers, batch norm in eval mode, average pooling, additions, reshapes) need no
rule: their gradient is their multiplier. So on a network of such operations and elementwise activations, the
attributions of an image sum to ``score(x) - score(x0)`` (summation-to-delta), reported per image as
``extras["delta"]``.

Activations seen, in every spelling (module, functional, ``torch.*``, ``Tensor.*``, in place or not): ReLU,
ReLU6/hardtanh, leaky ReLU, ELU, sigmoid, tanh, SiLU, GELU, softplus; and max-pooling of every rank
(``nn.MaxPool1d/2d/3d``, ``F.max_pool1d/2d/3d``), whose output change is routed to the image's maxima and the
reference's, as in captum (overlapping windows accumulate; see :mod:`camkit.methods.attribution._maxpool_rule`);
and softmax along an explicit axis (``nn.Softmax``, ``F.softmax``, ``torch.softmax``, ``Tensor.softmax``), whose
multipliers carry each output's change exactly and give a common shift of its inputs nothing (see
:mod:`camkit.methods.attribution._softmax_rule`). The rules run in :mod:`camkit.methods.attribution._rescale_mode`.
Non-linear calls without a rule (log-softmax, other max-pooling, layer/group norm, ...) keep their gradient and raise one
:class:`~camkit.errors.NoRuleWarning` per call, since the summation-to-delta then no longer holds exactly. Because the
reference pass is one image, the cost of a call is about that of :class:`~camkit.Saliency` plus one single-image
forward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Union, cast

import torch
from torch import Tensor, nn

from ..._internal.checks import check_broadcasts
from ...errors import InvalidInputError, InvalidTargetError
from ...explanation import Explanation
from ...functional.attribution import completeness_gap
from ...targets.classes import OutputSelector, Target, resolve_target, select_output
from .._core.binding import InputIndex
from ..registry import register_method
from ._activations import warn_unruled
from ._baselines import baseline_hint, baselines_for, check_baselines
from ._rescale_mode import _Mismatch, _RescaleMode
from .pixel import GradientAttribution, score_gradients

__all__ = ["DeepLift", "DeepLiftShap"]

Baseline = Union[float, Tensor]


def _is_callable(target: Target) -> bool:
    """Whether ``target`` scores by being called (then it resolves to no classes)."""
    return callable(target) and not isinstance(target, Tensor)


def _class_scores(output: Tensor, classes: Tensor) -> Tensor:
    """``output``'s entries at ``classes`` row by row: [N] for classes [N], [N, K] for [N, K]."""
    scores = output.gather(1, classes if classes.dim() == 2 else classes[:, None])
    return scores if classes.dim() == 2 else scores[:, 0]


@register_method("deeplift")
class DeepLift(GradientAttribution):
    """DeepLift with the Rescale rule: ``raw = (x - x0) * m``, ``m`` the multipliers of the target score.

    See :mod:`camkit.methods.attribution.deeplift` for how the rule reaches every activation spelling without touching
    the model. Any rank: for ``x`` [B, C, *S] (a signal [B, C, T], an image [B, C, H, W], a volume or a video [B, C,
    D, H, W]) ``raw`` is [B, C, *S] ([B, K, C, *S] for [B, K] targets) and sums per input to ``score(x) - score(x0)``
    on networks whose non-linearities all have a rule (convolutions, batch norm in eval mode, average pooling and
    linear layers of every rank need none); ``maps`` [B, *S] is the normalised ``max_c |raw|``. ``extras``:
    ``"baseline_scores"`` (the target scores at ``x0``) and ``"delta"`` (``sum(raw) - (score(x) - score(x0))`` per
    image: zero up to rounding when every non-linearity had a rule).

    Args:
        model: the model to explain.
        baseline: ``x0``: a number (a constant input, default ``0.0``) or a tensor that
            broadcasts to the input ([C, *S], [1, C, *S] or [B, C, *S]).
        eps: input changes ``|x - x0|`` below this use the activation's derivative instead
            of the difference quotient (default ``1e-10``).
        multiply_by_inputs: ``False``: ``raw`` is the multipliers ``m``, without the factor ``x - x0`` (captum's
            local form); ``extras["delta"]`` still measures ``(x - x0) * m``.
        output, keep_mode, input_index: see :class:`~camkit.Explainer`. Keyword inputs
            (``explain(..., kwargs=...)``) reach both passes; other positional inputs are refused.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(2, 1), nn.ReLU())
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[1.0, 2.0]]))
        ...     _ = net[1].bias.fill_(-1.0)
        >>> e = camkit.DeepLift(net).explain(torch.tensor([[[[2.0, 1.0]]]]), target=0)
        >>> e.raw.tolist(), e.scores.tolist(), e.extras["delta"].abs().item() < 1e-6
        ([[[[1.5, 1.5]]]], [3.0], True)
    """

    cost: ClassVar[str] = "1 forward + 1 backward, plus 1 forward of the baseline"
    use_when: ClassVar[str] = (
        "You want a one-pass attribution that sums exactly to score(x) - score(baseline) on ReLU networks."
    )

    def __init__(
        self,
        model: nn.Module,
        *,
        baseline: Baseline = 0.0,
        eps: float = 1e-10,
        multiply_by_inputs: bool = True,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        super().__init__(model, output=output, keep_mode=keep_mode, input_index=input_index)
        self.multiply_by_inputs = bool(multiply_by_inputs)
        if isinstance(baseline, bool) or not isinstance(baseline, (int, float, Tensor)):
            raise InvalidInputError(f"baseline must be a number or a tensor, got {type(baseline).__name__}")
        if not eps >= 0:
            raise InvalidInputError(f"eps must be >= 0, got {eps!r}")
        self.baseline = baseline
        self.eps = float(eps)

    def _bind_inputs(self, x: Tensor, inputs: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> Any:
        if inputs is not None:
            raise InvalidInputError(
                f"{type(self).__name__} runs the model on baselines of its own, which other positional inputs "
                "cannot follow; pass per-call keyword inputs with kwargs= or wrap the model so x is its only "
                "positional input."
            )
        return super()._bind_inputs(x, inputs, kwargs)

    def _baselines(self, x: Tensor) -> Tensor:
        """The reference inputs: [1, C, *S] when one serves the whole batch, else [B, C, *S]."""
        if isinstance(self.baseline, Tensor):
            base = self.baseline.detach().to(device=x.device, dtype=x.dtype)
            check_broadcasts(base, x, what="baseline", hint=baseline_hint(x))
            base = base if base.dim() == x.dim() else base.reshape(1, *base.shape)
            rows = x.shape[0] if base.dim() == x.dim() and base.shape[0] == x.shape[0] else 1
            return base.expand(rows, *x.shape[1:])
        return torch.full((1, *x.shape[1:]), float(self.baseline), dtype=x.dtype, device=x.device)

    def _resolve(self, raw: Any, target: Target, batch: int) -> tuple[Tensor | None, Tensor]:
        if self.output is None and getattr(target, "takes_model_output", False) and not isinstance(raw, Tensor):
            return resolve_target(target, raw, batch=batch)
        return resolve_target(target, select_output(raw, self.output), batch=batch)

    def _reference_scores(self, raw: Any, classes: Tensor | None, target: Target, batch: int, rows: int,
                          called: Tensor | None = None) -> Tensor:
        """The target scores of the reference pass's output ``raw`` ([rows] images), one per image of ``batch``.

        Image ``i`` goes with reference row ``i // (batch / rows)`` (one row for all, one each, or groups).
        ``called``: a callable target's scores, taken during the reference pass.
        """
        if classes is None:
            scores = called if called is not None else self._resolve(raw, target, rows)[1]
            return scores.expand(batch, *scores.shape[1:])
        refs = select_output(raw, self.output)
        refs = refs.expand(batch, *refs.shape[1:]) if rows == 1 else refs.repeat_interleave(batch // rows, dim=0)
        return _class_scores(refs, classes)

    def _resolve_grouped(self, raw: Any, target: Target, images: int) -> tuple[Tensor, Tensor]:
        """``(classes, scores)`` for a batch of copies of ``images`` images, resolved on the first copy.

        ``target`` is checked against the ``images`` images as in any call; the classes found
        are then repeated for every copy. Only class targets come here (see :class:`DeepLiftShap`).
        """
        out = select_output(raw, self.output)
        resolved, _ = resolve_target(target, out[:images], batch=images)
        first = cast(Tensor, resolved)  # a class target: callables never share passes
        classes = first.repeat(out.shape[0] // images, *([1] * (first.dim() - 1)))
        return classes, _class_scores(out, classes)

    def _multipliers(
        self, x: Tensor, base: Tensor, target: Target, images: int | None = None
    ) -> tuple[Tensor | None, Tensor, Tensor, Tensor]:
        """``(classes, scores, baseline_scores, m)`` for the baseline batch ``base``.

        ``base`` has one row for the whole batch ``x``, or one per image; or, with ``images``
        set, ``x`` is ``base.shape[0]`` copies of ``images`` images, copy ``j`` explained
        against baseline row ``j``.
        """
        recorder = _RescaleMode()
        with torch.no_grad(), recorder:
            raw_ref = self._call_model(base)
            # a callable target may read what the pass records (a NeuronTarget's layer), which the input's pass
            # then overwrites: it scores the reference now
            called = self._resolve(raw_ref, target, base.shape[0])[1] if _is_callable(target) else None
        leaf = x.detach().clone().requires_grad_(True)
        group = None if images is None else (base.shape[0], x.shape[0])
        mode = _RescaleMode(recorder.recorded, self.eps, group)
        with torch.enable_grad():
            with mode:
                raw = self._call_model(leaf.clone())
            if mode.index != len(recorder.recorded):
                raise _Mismatch(f"the forward called {mode.index} activations, the baseline's {len(recorder.recorded)}")
            if images is None:
                classes, scores = self._resolve(raw, target, x.shape[0])
            else:
                classes, scores = self._resolve_grouped(raw, target, images)
            grads = score_gradients(scores, leaf)
        with torch.no_grad():
            base_scores = self._reference_scores(raw_ref, classes, target, x.shape[0], base.shape[0], called)
        warn_unruled(
            type(self).__name__,
            mode.unruled,
            "their plain gradient is used, so the attributions need not sum to score(x) - score(baseline).",
        )
        return classes, scores.detach(), base_scores.detach(), grads

    def _checked_multipliers(
        self, x: Tensor, base: Tensor, target: Target, images: int | None = None
    ) -> tuple[Tensor | None, Tensor, Tensor, Tensor]:
        try:
            return self._multipliers(x, base, target, images)
        except _Mismatch as err:
            if base.shape[0] < x.shape[0]:
                # The model moves the batch dimension: run the reference at the images' batch size, each image's
                # baseline in its row, so that the two passes line up whatever the model does with the rows.
                try:
                    rows = base.repeat_interleave(x.shape[0] // base.shape[0], dim=0)
                    return self._multipliers(x, rows, target, images)
                except _Mismatch:
                    pass
            raise InvalidInputError(
                f"{type(self).__name__}: {err}. The Rescale rule pairs the k-th activation call on the images with "
                "the k-th on the baseline, so the forward must call the same activations in the same order for both "
                "(no data-dependent control flow)."
            ) from None

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        x = x.detach()
        base = self._baselines(x)
        classes, scores, base_scores, grads = self._checked_multipliers(x, base, target)
        diff = (x - base).float()
        raw = (diff.unsqueeze(1) if scores.dim() == 2 else diff) * grads.float()
        return self._finish(x, raw, classes, scores, base_scores, local=grads.float())

    def _finish(
        self, x: Tensor, raw: Tensor, classes: Tensor | None, scores: Tensor, base_scores: Tensor,
        local: Tensor | None = None, **extras: Any
    ) -> Explanation:
        """Wrap ``raw`` (``(x - x0) * m``); ``local`` (``m``) replaces it when ``multiply_by_inputs`` is off."""
        if classes is None and scores.shape[0] != x.shape[0]:
            raise InvalidTargetError(f"a callable target must return one score per image ({x.shape[0]})")
        size = tuple(x.shape[2:])
        delta = completeness_gap(raw, scores.float(), base_scores.float(), spatial_dims=len(size))
        raw = raw if self.multiply_by_inputs or local is None else local
        maps, flat = self.maps_from_raw(raw, size)
        return Explanation(
            maps=maps,
            raw=raw,
            target=classes,
            scores=scores,
            flat=flat,
            method=self.key,
            extras={"baseline_scores": base_scores, "delta": delta, **extras},
        )


@register_method("deepliftshap")
class DeepLiftShap(DeepLift):
    """DeepLiftShap: DeepLift averaged over a set of baselines (an approximation of SHAP values).

    ``raw = mean_j DeepLift(x, b_j)`` over the baselines ``b_j`` [N, C, *S]; it sums per image to ``score(x) - mean_j
    score(b_j)`` (``extras["delta"]`` is the gap, ``extras["baseline_scores"]`` the mean baseline score,
    ``extras["pair_deltas"]`` [B, N] each DeepLift's own gap to its baseline).

    Several baselines share one pass: the B images are repeated once per baseline, up to ``max_batch`` images at a
    time, and the reference pass runs on those baselines together, so a call costs ``ceil(N / k)`` DeepLift passes,
    ``k = max(1, max_batch // B)`` baselines each: memory is bounded by ``max_batch`` (or B, if larger), not by N. One
    baseline per pass (plain DeepLift for each, in turn) is used instead when the passes could not be shared safely:
    for a callable target (it scores the batch it is given), for per-call model inputs (``kwargs=``), for a model with
    a module in training mode (``keep_mode=True``: batch statistics would mix the baselines), or when B alone reaches
    ``max_batch``. Sharing assumes that the model keeps the rows of a batch in their order (no layer sorts or shuffles
    images); the result does not depend on ``max_batch`` up to float rounding.

    Args:
        model: the model to explain.
        baselines: [N, C, *S] (or [C, *S] for one) with the input's rank, e.g. a few inputs
            of the data set, read when the input arrives; ``None`` (the default) is one
            all-zero input, which makes this plain DeepLift.
        max_batch: the most images (repeated images) run through the model at once (default 32).
        eps, multiply_by_inputs, output, keep_mode, input_index: as for :class:`DeepLift` (``raw``: the mean ``m``).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(2, 1), nn.ReLU())
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[1.0, 2.0]]))
        ...     _ = net[1].bias.fill_(-1.0)
        >>> baselines = torch.tensor([[[[0.0, 0.0]]], [[[2.0, 1.0]]]])  # the second one is x itself
        >>> e = camkit.DeepLiftShap(net, baselines).explain(torch.tensor([[[[2.0, 1.0]]]]), target=0)
        >>> e.raw.tolist()  # half of DeepLift against the first baseline, nothing from the second
        [[[[0.75, 0.75]]]]
    """

    cost: ClassVar[str] = (
        "ceil(N_baselines / k) x (1 forward + 1 backward on k copies of the batch + 1 forward of k baselines), "
        "k = max(1, max_batch // B)"
    )
    use_when: ClassVar[str] = (
        "You want DeepLift without betting on one baseline: attributions averaged over a sample of reference images."
    )

    def __init__(
        self,
        model: nn.Module,
        baselines: Tensor | None = None,
        *,
        max_batch: int = 32,
        eps: float = 1e-10,
        multiply_by_inputs: bool = True,
        output: OutputSelector = None,
        keep_mode: bool = False,
        input_index: InputIndex = 0,
    ) -> None:
        check_baselines(baselines)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise InvalidInputError(f"max_batch must be a positive int, got {max_batch!r}")
        super().__init__(model, baseline=0.0, eps=eps, multiply_by_inputs=multiply_by_inputs, output=output,
                         keep_mode=keep_mode, input_index=input_index)
        self.baselines = None if baselines is None else baselines.detach()
        self.max_batch = max_batch

    def _per_pass(self, target: Target, batch: int, count: int) -> int:
        """How many baselines share one pass (1: plain DeepLift for each in turn)."""
        shared = min(count, self.max_batch // batch)
        if shared < 2 or not self._rows_can_join():
            return 1
        if callable(target) and not isinstance(target, Tensor):
            return 1  # a callable scores the batch it gets: it may hold per-image data for B rows
        if isinstance(target, Tensor) and target.dim() > 0 and target.shape[0] != batch:
            return 1  # leave the error message to the plain path
        if isinstance(target, Sequence) and len(target) != batch:
            return 1
        return shared

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        x = x.detach()
        bases = baselines_for(self.baselines, x)
        count, batch = bases.shape[0], x.shape[0]
        per_pass = self._per_pass(target, batch, count)
        total: Tensor | None = None
        local: Tensor | None = None  # the multipliers summed over the baselines
        base_total: Tensor | None = None
        classes: Tensor | None = None
        scores = x.new_zeros(0)
        resolved: Target = target
        gaps: list[Tensor] = []  # DeepLift's gap to each baseline: [rows, B(, K)] per pass
        for start in range(0, count, per_pass):
            base = bases[start : start + per_pass]
            rows = base.shape[0]
            if per_pass == 1:
                classes, scores, base_scores, grads = self._checked_multipliers(x, base, resolved)
            else:
                copies = x.repeat(rows, *([1] * (x.dim() - 1)))
                classes, scores, base_scores, grads = self._checked_multipliers(copies, base, resolved, images=batch)
                classes, scores = cast(Tensor, classes)[:batch], scores[:batch]
            if classes is not None:
                resolved = classes  # every baseline explains the classes resolved on the first pass
            diff = (x.unsqueeze(0) - base.unsqueeze(1)).float()  # [rows, B, C, *S]: input i against baseline j
            grads = grads.float().unflatten(0, (rows, batch))
            pairs = (diff.unsqueeze(2) if scores.dim() == 2 else diff) * grads  # [rows, B, (K,) C, *S]
            part, base_pairs = pairs.sum(dim=0), base_scores.float().unflatten(0, (rows, batch))
            gaps.append(pairs.flatten(1 + scores.dim()).sum(dim=-1) - (scores.float() - base_pairs))
            base_part = base_pairs.sum(dim=0)
            total = part if total is None else total + part
            local = grads.sum(dim=0) if local is None else local + grads.sum(dim=0)
            base_total = base_part if base_total is None else base_total + base_part
        pair_deltas = torch.cat(gaps).movedim(0, 1)  # [B, N(, K)]
        mean = cast(Tensor, total) / count
        return self._finish(x, mean, classes, scores, cast(Tensor, base_total) / count, cast(Tensor, local) / count,
                            baselines=count, pair_deltas=pair_deltas)
