"""The shared core of ``camkit explain`` and ``camkit audit``: build an explainer and explain a batch.

Predictions come from the same forward pass as the maps when the method allows it
(Grad-CAM family: one forward), otherwise from one extra forward pass without gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .._internal.checks import check_logits
from .._internal.state import eval_mode
from ..errors import InvalidInputError, InvalidTargetError
from ..methods import Explainer, GradientCAM
from ..registry import get_method, takes_layer
from .targeting import Choose

__all__ = ["BatchResult", "build_explainer", "explain_batch"]

_NOT_LOGITS = "audits and explain need a classifier returning logits [B, classes], got {got}"


def build_explainer(method: str, model: nn.Module, layer: str | None) -> Explainer:
    """The registered explainer ``method`` for ``model``; ``layer`` for methods that take one.

    Example:
        >>> import torch
        >>> from camkit.runs.explaining import build_explainer
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))
        >>> build_explainer("gradcam", net, "0")
        GradCAM(model=Sequential, layer=['0'])
    """
    cls = get_method(method)
    if takes_layer(cls):
        return cls(model, layer=layer)  # type: ignore[call-arg]
    if layer is not None:
        raise InvalidInputError(f"method {method!r} works on the input pixels and takes no --layer; leave it out")
    return cls(model)


@dataclass(frozen=True)
class BatchResult:
    """One explained batch: ``logits`` [B, C], ``classes`` [B] or [B, K], ``maps`` [B, H, W] or [B, K, H, W].

    ``relevance``: each channel's relevance at the explainer's layer from the same pass, [B, C]
    ([B, K, C]), when the explainer records it (:attr:`camkit.GradientCAM.record_relevance`).
    """

    logits: Tensor
    classes: Tensor
    maps: Tensor
    relevance: Tensor | None = None


class _CaptureTarget:
    """A callable target that records the logits of the one forward pass and picks classes from them."""

    def __init__(self, choose: Choose) -> None:
        self.choose = choose
        self.logits: Tensor | None = None
        self.classes: Tensor | None = None

    def __call__(self, output: Tensor) -> Tensor:
        logits = check_logits(output, _NOT_LOGITS)
        if self.logits is None:
            self.logits = logits.detach()
            self.classes = self.choose(self.logits)
        classes = self.classes
        if classes is None or classes.shape[0] != logits.shape[0]:
            raise InvalidTargetError("the explainer ran the model on a batch of another size; cannot pick targets")
        if classes.dim() == 1:
            return logits.gather(1, classes[:, None])[:, 0]
        return logits.gather(1, classes)


def explain_batch(explainer: Explainer, x: Tensor, choose: Choose) -> BatchResult:
    """Predict and explain a batch ``x`` [B, C, H, W] for the classes ``choose(logits)`` picks."""
    if isinstance(explainer, GradientCAM):
        capture = _CaptureTarget(choose)
        explanation = explainer.explain(x, capture)
        if capture.logits is None or capture.classes is None:
            raise InvalidTargetError(f"{type(explainer).__name__} never scored the target; cannot read predictions")
        return BatchResult(capture.logits, capture.classes, explanation.maps, explanation.extras.get("channel_relevance"))
    with torch.no_grad(), eval_mode(explainer.model, enabled=not explainer.keep_mode):
        logits = check_logits(explainer._forward(x), _NOT_LOGITS).detach()
    classes = choose(logits)
    return BatchResult(logits, classes, explainer.explain(x, classes).maps)
