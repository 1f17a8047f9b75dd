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

Each library's rules live in a module of their own: :mod:`camkit.layers.families.timm`,
:mod:`camkit.layers.families.transformers`, and :mod:`camkit.layers.families.torchvision`
(torchvision's families are matched by ``isinstance``, by
:func:`camkit.layers.defaults.default_layer`, before these rules); the shape of a rule is
:class:`~camkit.layers.families.rule.FamilyRule`.
"""

from __future__ import annotations

from torch import nn

from . import timm, transformers
from .rule import FamilyRule, expand

__all__ = ["FamilyRule", "family_layer", "family_rule", "family_table", "layer_layout", "markdown_table", "prefix_tokens", "rules"]

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
    return prefix(model) if callable(prefix) else prefix


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
