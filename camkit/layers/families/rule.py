"""What a family rule says: how a model family is recognised and which layer is its default.

Layer patterns are dotted names in which ``<last>`` stands for the last child of a container
(in registration order) and ``<last ReLU>`` for its last ``ReLU`` child, so a rule works at
any depth (:func:`expand`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from torch import nn

__all__ = ["NCHW", "NHWC", "FamilyRule", "TokenLayout", "expand", "tokens"]

NCHW = "[B, C, h, w]"
NHWC = "channel-last [B, h, w, C]"


class TokenLayout(NamedTuple):
    """How a model's patch tokens lie on the input, when its configuration says.

    A model's own numbers decide where inference from the token count alone cannot: ``8 x 7 x 7``
    and ``2 x 14 x 14`` are both 392 tokens of a 16x112x112 clip, and a model whose tokens run
    patch by patch, each patch's frames in a row (Hugging Face's TimeSformer), is not read in
    row-major order. Layers whose tokens do not fit (a pooled stage, another rank) are read by
    the generic rule, unless ``order`` says the model's tokens are not row-major: then they are
    refused rather than misread.

    Attributes:
        prefix: leading non-patch tokens (class, distillation, registers) where a layer has
            them; a layer whose token count fits the grid without them has none.
        strides: per spatial axis of the input, its side divided by the grid's (a tubelet
            and a patch size: ``(2, 16, 16)``); ``None`` on an axis leaves that side to
            inference (a stride that changes from stage to stage). Sides are rounded down or up.
        order: the grid's axes from the slowest-varying token to the fastest; ``None`` is
            row-major (``(0, 1, 2)``: frames, then rows, then columns). TimeSformer: ``(1, 2, 0)``.

    Example:
        >>> from camkit.layers.families.rule import TokenLayout
        >>> TokenLayout(prefix=1, strides=(2, 16, 16)).order is None
        True
    """

    prefix: int | None = None
    strides: tuple[int | None, ...] = ()
    order: tuple[int, ...] | None = None


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
        layout: a callable reading the model's :class:`TokenLayout` from its configuration
            (a video transformer's tubelet and patch sizes, its token order), or ``None``.
        frames_first: the model takes videos ``[B, T, C, H, W]`` (Hugging Face's
            ``pixel_values``): camkit explains it through
            :class:`camkit.layers.video.ChannelsFirstVideo`, and refuses it bare.

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
    layout: Callable[[nn.Module], TokenLayout | None] | None = None
    frames_first: bool = False


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
