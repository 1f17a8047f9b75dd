"""Default CAM layers for timm and Hugging Face transformers models, recognised without importing either.

A model is recognised by its class name (or a base class's name, so subclasses match) and
by structure: the rule's dotted layer pattern must resolve on the model. Patterns use
``<last>`` for the last child of a container (in registration order) and ``<last ReLU>``
for its last ``ReLU`` child, so a rule works at any depth. The first pattern of the first
matching rule that resolves wins; a model no rule fits gets ``None`` (and camkit's generic
rule, :func:`camkit.layers.auto_layer`, applies).

The layers follow pytorch-grad-cam's recommendations where it gives one (a ViT's last
block's first norm, a Swin's last block's first norm, a CNN's last stage) and otherwise
the last module whose output is still a spatial map of the input before pooling. For
transformers, the first norm of the last block is used, not the final norm: classifiers
that read only the class token give zero gradients at every patch token of the final norm.

:func:`prefix_tokens` gives the number of leading non-patch tokens (class, distillation,
register tokens) of the default layer; for Hugging Face vision transformers it is read from
their class and config. :func:`layer_layout` says whether a family's default layer's 4-D
output is channel-last; a container that ends with a ``Linear`` (MaxViT's and transformers'
ConvNeXt stages) cannot be judged by its last leaf module.

Video transformers also say how their tokens lie (:func:`token_layout`: a tubelet and patch
size, a token order), and which take their frames before their channels
(:func:`check_frames_order`). A model wrapped in :class:`camkit.layers.video.ChannelsFirstVideo`
gets its inner model's rule, with the layer named ``model.<layer>``.

Each library's rules live in a module of their own: :mod:`camkit.layers.families.timm`,
:mod:`camkit.layers.families.transformers`, :mod:`camkit.layers.families.torchvision` and
:mod:`camkit.layers.families.monai` (torchvision's and MONAI's families are matched by
``isinstance``, by :func:`camkit.layers.defaults.default_layer`, before these rules); the shape
of a rule is :class:`~camkit.layers.families.rule.FamilyRule`.
"""

from __future__ import annotations

from torch import nn

from ...errors import InvalidInputError
from ..video import ChannelsFirstVideo
from . import timm, transformers
from .rule import FamilyRule, TokenLayout, expand

__all__ = [
    "FamilyRule",
    "TokenLayout",
    "check_frames_order",
    "family_layer",
    "family_rule",
    "family_table",
    "layer_layout",
    "markdown_table",
    "prefix_tokens",
    "rules",
    "token_layout",
]

_RULES: tuple[FamilyRule, ...] = timm.RULES + transformers.RULES


def rules() -> tuple[FamilyRule, ...]:
    """All family rules, timm first, then transformers.

    Example:
        >>> from camkit.layers.families import rules
        >>> sorted({r.library for r in rules()})
        ['timm', 'transformers']
    """
    return _RULES


def _class_names(model: nn.Module) -> list[str]:
    return [cls.__name__ for cls in type(model).__mro__]


def family_rule(model: nn.Module) -> tuple[FamilyRule, str] | None:
    """The first rule that recognises ``model`` and the layer name it gives, or ``None``.

    Example:
        >>> from torch import nn
        >>> from camkit.layers.families import family_rule
        >>> class ViTModel(nn.Module):  # shaped like transformers' ViTModel, no import needed
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.encoder = nn.Module()
        ...         self.encoder.layer = nn.ModuleList(nn.Module() for _ in range(2))
        ...         for block in self.encoder.layer:
        ...             block.layernorm_before = nn.LayerNorm(4)
        >>> rule, layer = family_rule(ViTModel())
        >>> rule.family, layer
        ('ViT', 'encoder.layer.1.layernorm_before')
    """
    if isinstance(model, ChannelsFirstVideo):
        inner = family_rule(model.model)
        return None if inner is None else (inner[0], f"model.{inner[1]}")
    names = _class_names(model)
    for rule in _RULES:
        if not any(name in names for name in rule.classes):
            continue
        for pattern in rule.patterns:
            layer = expand(model, pattern)
            if layer is not None:
                return rule, layer
    return None


def family_layer(model: nn.Module) -> str | None:
    """The family default layer of a timm / transformers model, or ``None`` when no rule fits.

    Example:
        >>> from torch import nn
        >>> from camkit.layers.families import family_layer
        >>> class MlpMixer(nn.Module):  # shaped like timm's MlpMixer
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.blocks = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        >>> family_layer(MlpMixer()), family_layer(nn.Linear(2, 2))
        ('blocks.1', None)
    """
    found = family_rule(model)
    return None if found is None else found[1]


def layer_layout(model: nn.Module, layer: str) -> bool | None:
    """Whether ``layer``'s 4-D output is channel-last, when it is ``model``'s family default layer.

    ``None`` when ``layer`` is not the family default, or when the default gives tokens.

    Example:
        >>> from torch import nn
        >>> from camkit.layers.families import layer_layout
        >>> class RegNet(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.s4 = nn.Conv2d(3, 4, 1)
        >>> layer_layout(RegNet(), "s4")
        False
    """
    found = family_rule(model)
    if found is None or found[1] != layer:
        return None
    return found[0].channels_last


def prefix_tokens(model: nn.Module) -> int | None:
    """Leading non-patch tokens of a recognised model's default layer, from its family rule and config.

    Transformers' ViT and CLIP vision: 1 (class token); DeiT: 2 (class and distillation
    tokens); DINOv2: 1 plus ``config.num_register_tokens`` when set; Swin, LeViT, MLP-Mixer,
    EfficientFormer: 0. ``None`` for models no rule with a token count fits (timm's ViTs
    say it themselves with ``num_prefix_tokens``, which :func:`camkit.layers.layout.prefix_token_hint`
    reads first).

    Example:
        >>> from types import SimpleNamespace
        >>> from torch import nn
        >>> from camkit.layers.families import prefix_tokens
        >>> class Dinov2Model(nn.Module):
        ...     def __init__(self, registers):
        ...         super().__init__()
        ...         self.config = SimpleNamespace(num_register_tokens=registers)
        ...         self.encoder = nn.Module()
        ...         self.encoder.layer = nn.ModuleList([nn.Module()])
        ...         self.encoder.layer[0].norm1 = nn.LayerNorm(4)
        >>> prefix_tokens(Dinov2Model(0)), prefix_tokens(Dinov2Model(4))
        (1, 5)
    """
    found = family_rule(model)
    if found is None:
        return None
    prefix = found[0].prefix
    inner = model.model if isinstance(model, ChannelsFirstVideo) else model
    return prefix(inner) if callable(prefix) else prefix


def token_layout(model: nn.Module) -> TokenLayout | None:
    """How a recognised video transformer's tokens lie on the input, read from its config; else ``None``.

    A model no rule recognises is searched for a recognised submodule (a user's classifier
    around a ``TimesformerModel``, say): its tokens are the backbone's.

    Example:
        >>> from types import SimpleNamespace
        >>> from torch import nn
        >>> from camkit.layers.families import token_layout
        >>> class VideoMAEModel(nn.Module):  # shaped like transformers' VideoMAEModel
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.config = SimpleNamespace(tubelet_size=2, patch_size=16)
        ...         self.encoder = nn.Module()
        ...         self.encoder.layer = nn.ModuleList([nn.Module()])
        ...         self.encoder.layer[0].layernorm_before = nn.LayerNorm(4)
        >>> token_layout(VideoMAEModel())
        TokenLayout(prefix=0, strides=(2, 16, 16), order=None)
    """
    found = family_rule(model)
    if found is not None:
        rule = found[0]
        return None if rule.layout is None else rule.layout(model.model if isinstance(model, ChannelsFirstVideo) else model)
    for module in model.modules():  # a user's model around a recognised backbone: the backbone's tokens
        if module is not model and (inner := family_rule(module)) is not None and inner[0].layout is not None:
            return inner[0].layout(module)
    return None


def check_frames_order(model: nn.Module) -> None:
    """Refuse a bare model known to take videos ``[B, T, C, H, W]``; wrapped, it passes.

    Hugging Face's VideoMAE, TimeSformer and ViViT take ``pixel_values`` with the frames before
    the channels; handed camkit's ``[B, C, T, H, W]`` they would read time as channels, so they
    are explained through :class:`camkit.layers.video.ChannelsFirstVideo`.

    Raises:
        InvalidInputError: for such a model, unwrapped; the message says how to wrap it.

    Example:
        >>> from types import SimpleNamespace
        >>> from torch import nn
        >>> from camkit.layers import ChannelsFirstVideo
        >>> from camkit.layers.families import check_frames_order
        >>> class VideoMAEModel(nn.Module):  # shaped like transformers' VideoMAEModel
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.encoder = nn.Module()
        ...         self.encoder.layer = nn.ModuleList([nn.Module()])
        ...         self.encoder.layer[0].layernorm_before = nn.LayerNorm(4)
        >>> check_frames_order(ChannelsFirstVideo(VideoMAEModel()))
        >>> check_frames_order(VideoMAEModel())
        Traceback (most recent call last):
        ...
        camkit.errors.InvalidInputError: VideoMAEModel (VideoMAE) takes videos as pixel_values [B, T, C, H, W], frames before channels, while camkit's videos are [B, C, T, H, W]: explain camkit.layers.ChannelsFirstVideo(model) on x = pixel_values.transpose(1, 2); its maps are [B, T, H, W]
    """
    if isinstance(model, ChannelsFirstVideo):
        return
    found = family_rule(model)
    if found is None or not found[0].frames_first:
        return
    raise InvalidInputError(
        f"{type(model).__name__} ({found[0].family}) takes videos as pixel_values [B, T, C, H, W], frames before "
        "channels, while camkit's videos are [B, C, T, H, W]: explain camkit.layers.ChannelsFirstVideo(model) "
        "on x = pixel_values.transpose(1, 2); its maps are [B, T, H, W]"
    )


def family_table() -> list[tuple[str, str, str, str, str]]:
    """Rows ``(library, family, classes, default layer, output)`` for the table in ``docs/layers.md``.

    Example:
        >>> from camkit.layers.families import family_table
        >>> [row[3] for row in family_table() if row[1] == "RegNet"]
        ['`s4`']
    """
    return [
        (
            rule.library,
            rule.family,
            ", ".join(f"`{c}`" for c in rule.classes),
            " or ".join(f"`{p}`" for p in rule.patterns),
            rule.output,
        )
        for rule in _RULES
    ]


def markdown_table() -> str:
    """The family table of ``docs/layers.md`` as Markdown (the docs hold this text verbatim; a test checks).

    Example:
        >>> from camkit.layers.families import markdown_table
        >>> markdown_table().splitlines()[0]
        '| library | family | model classes | default layer | output the CAM reads |'
    """
    lines = ["| library | family | model classes | default layer | output the CAM reads |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in family_table()]
    return "\n".join(lines) + "\n"
