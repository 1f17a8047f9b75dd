"""Which class each image is explained for: the ``--target`` spec and the chooser that reads it off the logits.

Shared by ``camkit explain``, ``camkit audit`` and ``camkit.evaluate``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import InvalidTargetError

__all__ = ["Choose", "TargetSpec", "chooser", "parse_target"]

Choose = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class TargetSpec:
    """Which class each image is explained for: ``kind`` is ``"pred"``, ``"class"``, ``"topk"`` or ``"label"``."""

    kind: str
    value: int = 1

    def __str__(self) -> str:
        return {"pred": "pred", "class": str(self.value), "topk": f"top{self.value}", "label": "label"}[self.kind]


def parse_target(text: str | int | None, allow: tuple[str, ...] = ("pred", "class", "topk", "label")) -> TargetSpec:
    """Parse ``pred`` (top-1, the default), a class index ``N``, ``topK`` or ``label``.

    Example:
        >>> from camkit.runs.targeting import parse_target
        >>> parse_target("top3"), parse_target(7), parse_target(None)
        (TargetSpec(kind='topk', value=3), TargetSpec(kind='class', value=7), TargetSpec(kind='pred', value=1))
    """
    if text is None or text == "pred" or text == "top1":
        spec = TargetSpec("pred")
    elif (isinstance(text, int) and not isinstance(text, bool)) or (isinstance(text, str) and text.isdigit()):
        spec = TargetSpec("class", int(text))
    elif isinstance(text, str) and re.fullmatch(r"top[1-9]\d*", text):
        spec = TargetSpec("topk", int(text[3:]))
    elif text == "label":
        spec = TargetSpec("label")
    else:
        spec = TargetSpec("?")
    if spec.kind not in allow:
        forms = {"pred": "pred", "class": "a class index N", "topk": "topK (e.g. top3)", "label": "label"}
        raise InvalidTargetError(f"--target {text!r} is not one of: {', '.join(forms[a] for a in allow)}")
    return spec


def chooser(spec: TargetSpec, labels: Tensor | None = None) -> Choose:
    """``f(logits [B, C]) -> classes`` ([B], or [B, K] for ``topK``) for a target spec.

    ``labels`` [B] (class indices, -1 unknown) is needed for ``label``; an unknown label
    falls back to the prediction.
    """

    def choose(logits: Tensor) -> Tensor:
        if spec.kind == "pred":
            return logits.argmax(dim=1)
        if spec.kind == "class":
            if not 0 <= spec.value < logits.shape[1]:
                raise InvalidTargetError(
                    f"--target {spec.value} is out of range for a model with {logits.shape[1]} classes"
                )
            return torch.full((logits.shape[0],), spec.value, dtype=torch.long, device=logits.device)
        if spec.kind == "topk":
            if spec.value > logits.shape[1]:
                raise InvalidTargetError(
                    f"--target top{spec.value} asks for more classes than the model's {logits.shape[1]}"
                )
            return logits.topk(spec.value, dim=1).indices
        if labels is None:
            raise InvalidTargetError("--target label needs labels (class folders or a CSV 'label' column)")
        known = labels.to(logits.device)
        return torch.where((known >= 0) & (known < logits.shape[1]), known, logits.argmax(dim=1))

    return choose
