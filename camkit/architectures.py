"""What camkit knows about common architectures: wrappers, default layers, layouts, prefix tokens.

* :func:`unwrap_model` strips ``DataParallel`` / ``DistributedDataParallel`` (``.module``)
  and ``torch.compile`` (``._orig_mod``) wrappers. Explainers run the eager module inside:
  hooks added after compiling are not traced by the compiled graph, and a ``DataParallel``
  replica per device would split the batch across separate captures.
* :func:`default_layer` gives the CAM layer for torchvision families, then for timm and
  transformers families (:mod:`camkit.families`; tables in ``docs/layers.md``); it takes
  precedence over the generic rule of :func:`camkit.layers.auto_layer` when it gives a
  spatial map for the input.
* :func:`known_channels_last` reads a module's output layout from its type.
* :func:`prefix_token_hint` reads the number of class/register tokens from the model.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from torch import nn

from .families import family_layer, prefix_tokens, rules

__all__ = [
    "default_layer",
    "default_layer_table",
    "known_channels_last",
    "prefix_token_hint",
    "unwrap_model",
]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The eager module inside DataParallel / DistributedDataParallel / ``torch.compile`` wrappers.

    Example:
        >>> from torch import nn
        >>> from camkit.architectures import unwrap_model
        >>> net = nn.Linear(2, 2)
        >>> unwrap_model(nn.DataParallel(net)) is net
        True
    """
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model.get_submodule("_orig_mod")
        else:
            return model


def _last_child(module: nn.Module) -> str:
    return list(module.named_children())[-1][0]


def _vit(model: nn.Module) -> str:
    # The last block's first LayerNorm: its tokens feed the attention that reads the class
    # token. The encoder's output would give zero gradients at every patch token.
    return f"encoder.layers.{_last_child(model.get_submodule('encoder.layers'))}.ln_1"


def _last_feature(model: nn.Module) -> str:
    return f"features.{_last_child(model.get_submodule('features'))}"


def _vgg(model: nn.Module) -> str:
    relus = [name for name, m in model.get_submodule("features").named_children() if isinstance(m, nn.ReLU)]
    return f"features.{relus[-1]}" if relus else _last_feature(model)


def _rules() -> list[tuple[type, Callable[[nn.Module], str], str]]:
    from torchvision.models import (
        VGG,
        ConvNeXt,
        DenseNet,
        EfficientNet,
        MobileNetV2,
        MobileNetV3,
        ResNet,
        SwinTransformer,
        VisionTransformer,
    )
    from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
    from torchvision.models.segmentation import FCN, LRASPP, DeepLabV3

    return [
        (VisionTransformer, _vit, "encoder.layers.<last>.ln_1"),
        (SwinTransformer, _last_feature, "features.<last> (channel-last)"),
        (ConvNeXt, _last_feature, "features.<last>"),
        (EfficientNet, _last_feature, "features.<last>"),
        (MobileNetV2, _last_feature, "features.<last>"),
        (MobileNetV3, _last_feature, "features.<last>"),
        (DenseNet, lambda m: "features", "features (ends with norm5)"),
        (VGG, _vgg, "features.<last ReLU>"),
        (ResNet, lambda m: "layer4", "layer4"),
        (FCN, lambda m: f"backbone.{_last_child(m.get_submodule('backbone'))}", "backbone.<last>"),
        (DeepLabV3, lambda m: f"backbone.{_last_child(m.get_submodule('backbone'))}", "backbone.<last>"),
        (LRASPP, lambda m: f"backbone.{_last_child(m.get_submodule('backbone'))}", "backbone.<last>"),
        (GeneralizedRCNN, lambda m: f"backbone.body.{_last_child(m.get_submodule('backbone.body'))}", "backbone.body.<last>"),
    ]


def default_layer_table() -> list[tuple[str, str]]:
    """``(architecture class, default layer)`` rows, as documented in ``docs/layers.md``.

    Torchvision's rows come first, then the timm / transformers families' (model classes and
    layer patterns, from :func:`camkit.families.rules`).

    Example:
        >>> from camkit.architectures import default_layer_table
        >>> dict(default_layer_table())["ResNet"]
        'layer4'
    """
    torchvision = [(cls.__name__, text) for cls, _, text in _rules()]
    return torchvision + [(", ".join(r.classes), " or ".join(r.patterns)) for r in rules()]  # timm, transformers


def default_layer(model: nn.Module) -> str | None:
    """The default CAM layer name for a known torchvision architecture, or ``None``.

    Subclasses of a known class get the same default. Wrappers are looked through. Models
    that no torchvision rule knows get the timm / transformers family default of
    :func:`camkit.families.family_layer`, if one fits.

    Example:
        >>> from torchvision.models import resnet18
        >>> from camkit.architectures import default_layer
        >>> default_layer(resnet18())
        'layer4'
    """
    model = unwrap_model(model)
    # A torchvision model (or a subclass) means torchvision.models is imported already; when it
    # is not, importing it just to say no would cost hundreds of MiB (it pulls in torch._dynamo).
    for cls, rule, _ in _rules() if "torchvision.models" in sys.modules else []:
        if isinstance(model, cls):
            try:
                return rule(model)
            except (AttributeError, IndexError):  # get_submodule raises AttributeError
                return None  # a subclass rebuilt differently: fall back to the generic rule
    return family_layer(model)  # timm / transformers families (camkit.families)


_CHANNELS_FIRST = {
    "Conv2d",
    "ConvTranspose2d",
    "BatchNorm2d",
    "SyncBatchNorm",
    "FrozenBatchNorm2d",
    "GroupNorm",
    "InstanceNorm2d",
    "LayerNorm2d",
    "MaxPool2d",
    "AvgPool2d",
    "AdaptiveAvgPool2d",
    "AdaptiveMaxPool2d",
    "CNBlock",
    "ConvNeXtBlock",
    "Bottleneck",
    "BasicBlock",
}
_CHANNELS_LAST = {"SwinTransformerBlock", "SwinTransformerBlockV2", "PatchMerging", "PatchMergingV2", "Linear"}


def _own_layout(module: nn.Module) -> bool | None:
    name = type(module).__name__
    if name in _CHANNELS_FIRST:
        return False
    if name in _CHANNELS_LAST:
        return True
    if name == "Permute":
        dims = list(getattr(module, "dims", []))
        if dims == [0, 2, 3, 1]:
            return True
        if dims == [0, 3, 1, 2]:
            return False
    if isinstance(module, nn.LayerNorm) and not name.endswith("2d"):
        return True  # nn.LayerNorm normalises the last dimension: features are last
    return None


def known_channels_last(module: nn.Module) -> bool | None:
    """Whether a module's 4-D output is channel-last, from its type; ``None`` when unknown.

    The module's own type decides first; an ``nn.Sequential`` (or ``ModuleList``) is judged
    by its last child, which is what it returns (element-wise modules skipped), followed down
    to a module of known type. Any other container is unknown: its forward may permute, so
    the last leaf inside it is no evidence (a ConvNeXt block ends with a ``Linear`` yet
    returns a channel-first map). Explainers use this only when the
    output's shape fits both layouts (see :mod:`camkit.layout`).

    Example:
        >>> from torch import nn
        >>> from camkit.architectures import known_channels_last
        >>> known_channels_last(nn.LayerNorm(8)), known_channels_last(nn.Sequential(nn.Conv2d(3, 8, 1), nn.ReLU()))
        (True, False)
        >>> known_channels_last(nn.ReLU()) is None
        True
    """
    while True:
        own = _own_layout(module)
        if own is not None:
            return own
        if not isinstance(module, (nn.Sequential, nn.ModuleList)):
            # Any other container may permute in its forward (Hugging Face's ConvNext layer
            # ends with a Linear, then permutes back): its registration order is no evidence.
            return None
        children = [child for child in module.children() if not _shape_keeping(child)]
        if not children:
            return None
        module = children[-1]


_SHAPE_KEEPING = {"Identity", "Dropout", "DropPath", "ReLU", "GELU", "SiLU", "Hardswish", "ReLU6", "Sigmoid"}


def _shape_keeping(module: nn.Module) -> bool:
    # Element-wise modules at the end of a container keep the layout of what came before.
    return type(module).__name__ in _SHAPE_KEEPING


def prefix_token_hint(model: nn.Module) -> int | None:
    """Leading non-patch tokens of a ViT, when the model says: timm's ``num_prefix_tokens``,
    transformers' ViT / DeiT / CLIP vision / DINOv2 from class and config
    (:func:`camkit.families.prefix_tokens`), or 1 for torchvision's ``VisionTransformer``
    itself (not subclasses, which may add registers).

    Example:
        >>> from torch import nn
        >>> from camkit.architectures import prefix_token_hint
        >>> net = nn.Identity(); net.num_prefix_tokens = 5
        >>> prefix_token_hint(net)
        5
    """
    model = unwrap_model(model)
    count = getattr(model, "num_prefix_tokens", None)
    if isinstance(count, int) and count >= 0:
        return count
    count = prefix_tokens(model)  # transformers' ViT, DeiT, CLIP vision, DINOv2 (camkit.families)
    if count is not None:
        return count
    vision_transformer = sys.modules.get("torchvision.models.vision_transformer")  # never imported just to check
    if vision_transformer is not None and type(model) is getattr(vision_transformer, "VisionTransformer", None):
        return 1
    return None
