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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from torch import nn

__all__ = ["FamilyRule", "family_layer", "family_rule", "family_table", "layer_layout", "markdown_table", "prefix_tokens", "rules"]

NCHW = "[B, C, h, w]"
NHWC = "channel-last [B, h, w, C]"


def _tokens(prefix: str) -> str:
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
        >>> from camkit.families import rules
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


def _dinov2_prefix(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    registers = getattr(config, "num_register_tokens", 0) or 0
    return 1 + int(registers) if isinstance(registers, int) else None


_TIMM = "timm"
_HF = "transformers"

_RULES: tuple[FamilyRule, ...] = (
    # --- timm ---------------------------------------------------------------------------
    FamilyRule(_TIMM, "ResNet / ResNet-D / ResNeXt / SE-ResNet", ("ResNet",), ("layer4",), NCHW,
               "resnet18, resnet10t, resnet50d, resnext50_32x4d", False),
    FamilyRule(_TIMM, "EfficientNet / MixNet / MNASNet", ("EfficientNet",), ("bn2",), NCHW,
               "efficientnet_b0, tf_efficientnetv2_b0", False),
    FamilyRule(_TIMM, "MobileNetV3", ("MobileNetV3",), ("blocks.<last>",), NCHW + " (before the pooled conv_head)",
               "mobilenetv3_small_050, mobilenetv3_large_100", False),
    FamilyRule(_TIMM, "ConvNeXt", ("ConvNeXt",), ("stages.<last>.blocks.<last>",), NCHW,
               "convnext_atto, convnext_tiny", False),
    FamilyRule(_TIMM, "RegNet", ("RegNet",), ("s4",), NCHW, "regnetx_002, regnety_004", False),
    FamilyRule(_TIMM, "DenseNet", ("DenseNet",), ("features",), NCHW + " (ends with norm5)", "densenet121", False),
    FamilyRule(_TIMM, "VGG", ("VGG",), ("features.<last ReLU>",), NCHW + " (before the last max-pool)",
               "vgg11, vgg16_bn", False),
    FamilyRule(_TIMM, "Inception v3", ("InceptionV3",), ("Mixed_7c",), NCHW, "inception_v3", False),
    FamilyRule(_TIMM, "Xception (legacy)", ("Xception",), ("act4",), NCHW, "legacy_xception", False),
    FamilyRule(_TIMM, "Xception (aligned)", ("XceptionAligned",), ("act",), NCHW, "xception41, xception65p", False),
    FamilyRule(_TIMM, "ViT / DeiT / EVA / BEiT", ("VisionTransformer", "Eva", "Beit"), ("blocks.<last>.norm1",),
               _tokens("prefix + "), "vit_tiny_patch16_224, deit_tiny_distilled_patch16_224, eva02_tiny_patch14_224, "
               "beit_base_patch16_224"),
    FamilyRule(_TIMM, "Swin", ("SwinTransformer",), ("layers.<last>.blocks.<last>.norm1",), NHWC,
               "swin_tiny_patch4_window7_224", True),
    # Swin V2 normalises after attention (norm1 is on the residual branch): the block's output
    FamilyRule(_TIMM, "Swin V2", ("SwinTransformerV2",), ("layers.<last>.blocks.<last>",), NHWC,
               "swinv2_tiny_window8_256", True),
    FamilyRule(_TIMM, "LeViT", ("Levit", "LevitDistilled"), ("stages.<last>",),
               _tokens("") + " (levit_conv_*: [B, C, h, w])", "levit_128s, levit_conv_128s", None, 0),
    FamilyRule(_TIMM, "MLP-Mixer / ResMLP", ("MlpMixer",), ("blocks.<last>",), _tokens(""),
               "mixer_s16_224, resmlp_12_224", None, 0),
    FamilyRule(_TIMM, "CoAtNet / MaxViT", ("MaxxVit",), ("stages.<last>",), NCHW + " (the stage ends with a Linear)",
               "coatnet_nano_rw_224, maxvit_nano_rw_256", False),
    FamilyRule(_TIMM, "EfficientFormer", ("EfficientFormer",), ("stages.<last>",), _tokens(""),
               "efficientformer_l1", None, 0),
    FamilyRule(_TIMM, "MobileViT / BYOB nets", ("ByobNet",), ("final_conv",), NCHW,
               "mobilevit_xxs, resnext26ts, repvgg_a0", False),
    # --- Hugging Face transformers --------------------------------------------------------
    FamilyRule(_HF, "ViT", ("ViTForImageClassification", "ViTModel"),
               ("vit.layers.<last>.layernorm_before", "layers.<last>.layernorm_before",  # transformers 5
                "vit.encoder.layer.<last>.layernorm_before", "encoder.layer.<last>.layernorm_before"),  # 4.x
               _tokens("1 + "), "ViTForImageClassification, ViTModel", None, 1),
    FamilyRule(_HF, "DeiT", ("DeiTForImageClassification", "DeiTForImageClassificationWithTeacher", "DeiTModel"),
               ("deit.layers.<last>.layernorm_before", "layers.<last>.layernorm_before",  # transformers 5
                "deit.encoder.layer.<last>.layernorm_before", "encoder.layer.<last>.layernorm_before"),  # 4.x
               _tokens("2 + "), "DeiTForImageClassification(WithTeacher), DeiTModel", None, 2),
    FamilyRule(_HF, "Swin", ("SwinForImageClassification", "SwinModel"),
               ("swin.encoder.layers.<last>.blocks.<last>.layernorm_before",
                "encoder.layers.<last>.blocks.<last>.layernorm_before"),
               "tokens [B, h·w, C] on the last stage's grid", "SwinForImageClassification, SwinModel", None, 0),
    FamilyRule(_HF, "ConvNeXt", ("ConvNextForImageClassification", "ConvNextModel"),
               ("convnext.encoder.stages.<last>", "encoder.stages.<last>"),
               NCHW + " (the stage ends with a Linear)", "ConvNextForImageClassification, ConvNextModel", False),
    FamilyRule(_HF, "ResNet", ("ResNetForImageClassification", "ResNetModel"),
               ("resnet.encoder.stages.<last>", "encoder.stages.<last>"), NCHW,
               "ResNetForImageClassification, ResNetModel", False),
    FamilyRule(_HF, "CLIP vision", ("CLIPForImageClassification", "CLIPVisionModel", "CLIPVisionModelWithProjection"),
               ("vision_model.encoder.layers.<last>.layer_norm1",), _tokens("1 + "),
               "CLIPForImageClassification, CLIPVisionModel", None, 1),
    FamilyRule(_HF, "DINOv2", ("Dinov2ForImageClassification", "Dinov2Model",
                               "Dinov2WithRegistersForImageClassification", "Dinov2WithRegistersModel"),
               ("dinov2.encoder.layer.<last>.norm1", "dinov2_with_registers.encoder.layer.<last>.norm1",
                "encoder.layer.<last>.norm1"),
               _tokens("1 + registers + "), "Dinov2ForImageClassification, Dinov2WithRegisters*", None,
               _dinov2_prefix),
)


def rules() -> tuple[FamilyRule, ...]:
    """All family rules, timm first, then transformers.

    Example:
        >>> from camkit.families import rules
        >>> sorted({r.library for r in rules()})
        ['timm', 'transformers']
    """
    return _RULES


def _class_names(model: nn.Module) -> list[str]:
    return [cls.__name__ for cls in type(model).__mro__]


def _expand(model: nn.Module, pattern: str) -> str | None:
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


def family_rule(model: nn.Module) -> tuple[FamilyRule, str] | None:
    """The first rule that recognises ``model`` and the layer name it gives, or ``None``.

    Example:
        >>> from torch import nn
        >>> from camkit.families import family_rule
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
            layer = _expand(model, pattern)
            if layer is not None:
                return rule, layer
    return None


def family_layer(model: nn.Module) -> str | None:
    """The family default layer of a timm / transformers model, or ``None`` when no rule fits.

    Example:
        >>> from torch import nn
        >>> from camkit.families import family_layer
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
        >>> from camkit.families import layer_layout
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
    say it themselves with ``num_prefix_tokens``, which :func:`camkit.architectures.prefix_token_hint`
    reads first).

    Example:
        >>> from types import SimpleNamespace
        >>> from torch import nn
        >>> from camkit.families import prefix_tokens
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
        >>> from camkit.families import family_table
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
        >>> from camkit.families import markdown_table
        >>> markdown_table().splitlines()[0]
        '| library | family | model classes | default layer | output the CAM reads |'
    """
    lines = ["| library | family | model classes | default layer | output the CAM reads |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in family_table()]
    return "\n".join(lines) + "\n"
