"""Shared plumbing of the forward-only methods: one capturing forward, chunked row scoring.

Private: the public classes live in :mod:`camkit.methods.cam` (``scorecam``, ``eigen``, ``cam``...),
:mod:`camkit.methods.perturbation` and :mod:`camkit.methods.attribution.layer`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch
from torch import Tensor

from ...errors import InvalidInputError, InvalidTargetError, OutputSelectionError
from ...explanation import Explanation
from ...hooks import LayerCapture
from ...targets.classes import OutputSelector, Target, resolve_target, select_output
from .cam_base import CAMExplainer
from .explainer import Explainer
from .output import make_explanation

__all__ = [
    "Captured",
    "ForwardCAM",
    "RowScorer",
    "capture_forward",
    "check_positive",
    "chunks",
    "expand_targets",
    "forward_scores",
    "make_explanation",
    "masked_forwards",
]


#: A layer's channel-first grid by the input's number of dimensions.
_GRIDS = {3: "[B, C, t]", 4: "[B, C, h, w]", 5: "[B, C, d, h, w]"}


class Captured:
    """What one forward pass with ``LayerCapture(gradients=False)`` gave.

    Attributes:
        acts: each layer's selected output, as returned (dtype kept), detached.
        calls: how many times each layer ran.
        classes: [B] / [B, K] class indices, or ``None`` for a callable target.
        scores: [B] / [B, K] target scores of the unperturbed input.
        output: the selected model output, detached.
    """

    def __init__(
        self, acts: list[Tensor], calls: list[int], classes: Tensor | None, scores: Tensor, output: Tensor
    ) -> None:
        self.output = output
        self.acts = acts
        self.calls = calls
        self.classes = classes
        self.scores = scores

    @property
    def multi(self) -> bool:
        """True for [B, K] targets."""
        return self.scores.dim() == 2


def capture_forward(explainer: CAMExplainer, x: Tensor, target: Target) -> Captured:
    """Run the explainer's model on ``x`` once without autograd, recording its layers and resolving ``target``.

    A target that reads the model's own output (a detection target) gets it unselected when
    no ``output=`` is set. A method that needs no score (``needs_score = False``: EigenCAM...)
    called without a target never asks the output to be a tensor: when it is not one (a
    detector's list of detections) or not class scores [B, K] (raw candidates), the scores
    are NaN and the classes ``None``.
    """
    layers = explainer.layers(x)
    batch = x.shape[0]
    with LayerCapture(layers, gradients=False, call=explainer.call) as capture:
        raw = explainer._call_model(x)
        acts = capture.activations()
        calls = [capture.calls(i) for i in range(len(layers))]
    if explainer.output is None and getattr(target, "takes_model_output", False) and not isinstance(raw, Tensor):
        classes, scores = resolve_target(target, raw, batch=batch)
        return Captured(acts, calls, classes, scores.detach(), x.new_full((batch, 0), float("nan")))
    if target is None and not getattr(explainer, "needs_score", True):
        try:
            out = select_output(raw, explainer.output)
            classes, scores = resolve_target(target, out)
        except (OutputSelectionError, InvalidTargetError):  # no score needed, none to be had: say so with NaN
            return Captured(acts, calls, None, x.new_full((batch,), float("nan")), x.new_full((batch, 0), float("nan")))
        return Captured(acts, calls, classes, scores.detach(), out.detach())
    out = select_output(raw, explainer.output)
    classes, scores = resolve_target(target, out)
    return Captured(acts, calls, classes, scores.detach(), out.detach())


def forward_scores(explainer: Explainer, x: Tensor, target: Target) -> tuple[Tensor | None, Tensor]:
    """``(classes, scores)`` of one plain forward without autograd (no layer recorded)."""
    with torch.no_grad():
        classes, scores = explainer._target_scores(x, target)
    return classes, scores.detach()


def check_positive(name: str, value: object) -> int:
    """``value`` as a positive int, or an :class:`InvalidInputError` naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{name} must be a positive int, got {value!r}")
    return value


def chunks(total: int, size: int, *, progress: bool = False, desc: str = "") -> Iterator[slice]:
    """Slices ``[0, size), [size, 2 size) ...`` covering ``range(total)``, with an optional tqdm bar."""
    bar: Any = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=desc, unit="img")
    try:
        for start in range(0, total, size):
            stop = min(start + size, total)
            yield slice(start, stop)
            if bar is not None:
                bar.update(stop - start)
    finally:
        if bar is not None:
            bar.close()


def expand_targets(classes: Tensor | None) -> Tensor | None:
    """Class indices as [B, K] (K = 1 for [B] targets)."""
    if classes is None:
        return None
    return classes if classes.dim() == 2 else classes[:, None]


def masked_forwards(
    explainer: Explainer,
    x: Tensor,
    b_idx: Tensor,
    make_masks: Callable[[slice], Tensor],
    scorer: RowScorer,
    *,
    batch_size: int,
    baseline: float | Tensor = 0.0,
    progress: bool = False,
    desc: str = "",
) -> Iterator[tuple[slice, Tensor, Tensor]]:
    """Score masked copies of the samples, ``batch_size`` at a time, without autograd.

    Row ``i`` is ``x[b_idx[i]] * m_i + baseline * (1 - m_i)`` with ``m_i`` its mask [*S]
    (``x`` is [B, C, *S] of any rank; the mask is broadcast over channels), run with its sample's
    other inputs of the call (see :meth:`Explainer._call_model_rows`); the rows of one
    chunk share one reused input buffer, so memory follows ``batch_size``, not the number of
    rows. ``baseline`` is a number or a tensor [B, C, *S] (row ``i`` uses ``baseline[b_idx[i]]``).

    Args:
        make_masks: ``make_masks(part)`` returns the masks [n, *S] of rows ``part``.

    Yields:
        ``(part, masks, scores)`` per chunk: the rows' slice, their masks and their scores [n, K].
    """
    total = int(b_idx.numel())
    if total == 0:
        return
    buffer = torch.empty((min(batch_size, total), *x.shape[1:]), dtype=x.dtype, device=x.device)
    with torch.inference_mode():
        for part in chunks(total, batch_size, progress=progress, desc=desc):
            rows = b_idx[part]
            masks = make_masks(part)
            keep = masks.to(x.dtype)[:, None]
            batch = buffer[: part.stop - part.start]
            torch.index_select(x, 0, rows, out=batch)
            batch.mul_(keep)
            if isinstance(baseline, Tensor):
                batch.add_(baseline[rows] * (1 - keep))
            elif baseline != 0.0:
                batch.add_(baseline * (1 - keep))
            yield part, masks, scorer(explainer._call_model_rows(batch, rows), rows).float()


class RowScorer:
    """Score rows of a perturbed batch: row ``i`` belongs to sample ``b_idx[i]``.

    Args:
        target: the caller's target (used as is when it is a callable).
        classes: [B, K] class indices from :func:`expand_targets`, or ``None`` for a callable.
        softmax: score class targets by their softmax probability instead of the raw output.
        output: the explainer's output selector.
    """

    def __init__(self, target: Target, classes: Tensor | None, *, softmax: bool, output: OutputSelector) -> None:
        self.target = target
        self.classes = classes
        self.softmax = softmax
        self.output = output

    def __call__(self, raw_output: Any, b_idx: Tensor) -> Tensor:
        """Scores [n, K] of one chunk's model output.

        A target with ``for_rows`` (a detection target) is asked for the chunk's rows, so that
        each row is matched against its own image's reference; one that reads the model's own
        output (``takes_model_output``) gets it unselected when no ``output=`` is set, as in
        the unperturbed forward.
        """
        raw_wanted = self.output is None and getattr(self.target, "takes_model_output", False)
        out = raw_output if raw_wanted and not isinstance(raw_output, Tensor) else select_output(raw_output, self.output)
        if self.classes is None:
            for_rows = getattr(self.target, "for_rows", None)
            fn: Callable[[Any], Tensor] = for_rows(b_idx) if callable(for_rows) else self.target  # type: ignore[assignment]
            scores = fn(out)
            return scores if scores.dim() == 2 else scores[:, None]
        values = out.softmax(dim=1) if self.softmax else out
        return values.gather(1, self.classes[b_idx])


class ForwardCAM(CAMExplainer):
    """Base of the CAMs that read a layer's activations without autograd.

    Subclasses implement :meth:`_raw`: the raw map [B, *s] (or [B, K, *s]) of one layer, from
    its channel-first grid [B, C, *s] (one axis per spatial axis of the input); they may add
    read-only values to ``extras``.
    """

    family: ClassVar[str | None] = "CAM (forward only)"

    needs_grad = False
    #: whether the map depends on a score; methods that need none (EigenCAM...) run on any output
    needs_score: ClassVar[bool] = True

    def _raw(self, x: Tensor, act: Tensor, index: int, cap: Captured, target: Target, extras: dict[str, Any]) -> Tensor:
        raise NotImplementedError

    #: whether the method reruns the model on perturbed inputs (each row then gets its sample's other inputs)
    perturbs: bool = False
    #: whether the method can read token or channel-last layers through :meth:`to_grid`
    reads_grids: bool = True

    def _explain(self, x: Tensor, target: Target) -> Explanation:
        cap = capture_forward(self, x, target)
        grids = self.to_grid(cap.acts, x)
        raws = []
        extras: dict[str, Any] = {}
        for index, (act, grid) in enumerate(zip(cap.acts, grids)):
            if grid is not act and not self.reads_grids:
                raise InvalidInputError(
                    f"{type(self).__name__} edits the layer's channels in place, so it needs a layer with "
                    f"channel-first {_GRIDS[x.dim()]} output for a {list(x.shape)} input; layer "
                    f"'{self._names()[index]}' gives shape {list(act.shape)}. Use ScoreCAM, EigenCAM or a gradient "
                    "CAM for token and channel-last layers."
                )
            raws.append(self._raw(x, grid, index, cap, target, extras))
        return make_explanation(self.key, raws, x, cap.classes, cap.scores, self._names(), window=self._window(x), **extras)
