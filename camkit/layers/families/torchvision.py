"""Default layers of torchvision's classification, segmentation and detection families.

torchvision is imported only when the model's own module already imported it: importing it
just to say "not a torchvision model" would cost hundreds of MiB (it pulls in torch._dynamo).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from torch import nn

__all__ = ["table", "torchvision_layer"]


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


def table() -> list[tuple[str, str]]:
    """``(architecture class, default layer)`` rows for torchvision's families, as ``docs/layers.md`` shows them.

    Example:
        >>> from camkit.layers.families.torchvision import table
        >>> dict(table())["ResNet"]
        'layer4'
    """
    return [(cls.__name__, text) for cls, _, text in _rules()]


def torchvision_layer(model: nn.Module) -> tuple[bool, str | None]:
    """``(known, layer)``: whether ``model`` is a torchvision family (or a subclass), and its default layer.

    A subclass rebuilt so that the rule's path does not exist is known with no layer: the
    generic rule applies, and no other family's rule is tried on it.

    Example:
        >>> from torch import nn
        >>> from torchvision.models import resnet18
        >>> from camkit.layers.families.torchvision import torchvision_layer
        >>> torchvision_layer(resnet18()), torchvision_layer(nn.Linear(2, 2))
        ((True, 'layer4'), (False, None))
    """
    for cls, rule, _ in _rules() if "torchvision.models" in sys.modules else []:
        if isinstance(model, cls):
            try:
                return True, rule(model)
            except (AttributeError, IndexError):  # get_submodule raises AttributeError
                return True, None  # a subclass rebuilt differently: fall back to the generic rule
    return False, None
