"""What a family rule says: how a model family is recognised and which layer is its default.

Layer patterns are dotted names in which ``<last>`` stands for the last child of a container
(in registration order) and ``<last ReLU>`` for its last ``ReLU`` child, so a rule works at
any depth (:func:`expand`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from torch import nn

__all__ = ["NCHW", "NHWC", "FamilyRule", "expand", "tokens"]

NCHW = "[B, C, h, w]"
NHWC = "channel-last [B, h, w, C]"


def tokens(prefix: str) -> str:
    """The output text of a token layer with ``prefix`` leading tokens (for the docs' table)."""
    return f"tokens [B, {prefix}h·w, D]"


class FamilyRule(NamedTuple):
    """One architecture family: how to recognise it and which layer to use.

    Attributes:
        library: ``"timm"`` or ``"transformers"``.
        family: a human-readable name (``"ViT / DeiT / EVA / BEiT"``).
        classes: model class names matched (the class or any base class).
        patterns: dotted layer patterns tried in order; the first that resolves wins.
        output: the layout of that layer's output, for the docs.
        examples: model names or classes the rule was checked on.
        channels_last: ``True``/``False`` when the layer's 4-D output is known to be
            channel-last/-first, ``None`` for tokens.
        prefix: leading non-patch tokens of the layer's token output, or a callable
            reading them from the model (``None``: not a token layer, or not known).

    Example:
        >>> from camkit.layers.families import rules
        >>> rule = next(r for r in rules() if r.family == "Swin")
        >>> rule.patterns, rule.channels_last
        (('layers.<last>.blocks.<last>.norm1',), True)
    """

    library: str
    family: str
    classes: tuple[str, ...]
    patterns: tuple[str, ...]
    output: str
    examples: str
    channels_last: bool | None = None
    prefix: int | Callable[[nn.Module], int | None] | None = None


def expand(model: nn.Module, pattern: str) -> str | None:
    """Resolve ``<last>`` / ``<last ReLU>`` segments; ``None`` when the path does not exist."""
    module = model
    parts: list[str] = []
    for segment in pattern.split("."):
        if segment.startswith("<last"):
            wanted = segment[len("<last") : -1].strip()
            children = [
                (name, child) for name, child in module.named_children()
                if not wanted or type(child).__name__ == wanted
            ]
            if not children:
                return None
            segment, module = children[-1]
        else:
            child = dict(module.named_children()).get(segment)
            if child is None:
                return None
            module = child
        parts.append(segment)
    return ".".join(parts)
