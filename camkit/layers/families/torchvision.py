"""Default layers of torchvision's classification, segmentation, detection and video families.

torchvision is imported only when the model's own module already imported it: importing it
just to say "not a torchvision model" would cost hundreds of MiB (it pulls in torch._dynamo).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import Tensor, nn

from .rule import TokenLayout

__all__ = ["table", "torchvision_layer", "torchvision_tokens", "transform_window"]


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


def _mvit(model: nn.Module) -> str:
    # Like a ViT: the head reads the class token after the last block, whose first norm feeds
    # the attention through which the class token reads the patches.
    return f"blocks.{_last_child(model.get_submodule('blocks'))}.norm1"


def _body(model: nn.Module) -> str:
    # The last stage of the backbone's body (before the FPN): one map of the image the
    # detector's transform made, at the body's largest stride.
    return f"backbone.body.{_last_child(model.get_submodule('backbone.body'))}"


def _ssd(model: nn.Module) -> str:
    # SSD's VGG features end at conv4_3 (a plain Sequential of layers); SSDlite's are two
    # stages of MobileNetV3 (the C4 expansion, then the rest): the last stage, before the extras.
    model.get_submodule("backbone.features")
    if type(model.get_submodule("backbone")).__name__ == "SSDLiteFeatureExtractorMobileNet":
        return f"backbone.features.{_last_child(model.get_submodule('backbone.features'))}"
    return "backbone.features"


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
    from torchvision.models.detection import FCOS, RetinaNet
    from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
    from torchvision.models.detection.ssd import SSD
    from torchvision.models.segmentation import FCN, LRASPP, DeepLabV3
    from torchvision.models.video import S3D, MViT, SwinTransformer3d, VideoResNet

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
        (GeneralizedRCNN, _body, "backbone.body.<last>"),
        (RetinaNet, _body, "backbone.body.<last>"),
        (FCOS, _body, "backbone.body.<last>"),
        (SSD, _ssd, "backbone.features (SSD: VGG to conv4_3) or backbone.features.<last> (SSDlite)"),
        (VideoResNet, lambda m: "layer4", "layer4"),
        (S3D, lambda m: "features", "features"),
        (SwinTransformer3d, _last_feature, "features.<last> (channel-last)"),
        (MViT, _mvit, "blocks.<last>.norm1"),
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


def torchvision_tokens(model: nn.Module) -> int | TokenLayout | None:
    """How a torchvision transformer's tokens lie: its prefix count, or a :class:`TokenLayout`; else ``None``.

    ``VisionTransformer`` itself (not subclasses, which may add registers): one class token.
    ``MViT``: one class token, and the time stride of its patch embedding (its stages pool
    space, not time), so that a clip's ``8 x 7 x 7`` tokens are never read as ``2 x 14 x 14``.

    Example:
        >>> from torch import nn
        >>> from torchvision.models import VisionTransformer
        >>> from camkit.layers.families.torchvision import torchvision_tokens
        >>> vit = VisionTransformer(image_size=16, patch_size=8, num_layers=1, num_heads=1, hidden_dim=4, mlp_dim=8)
        >>> torchvision_tokens(vit), torchvision_tokens(nn.Linear(2, 2))
        (1, None)
    """
    vision_transformer = sys.modules.get("torchvision.models.vision_transformer")  # never imported just to check
    if vision_transformer is not None and type(model) is getattr(vision_transformer, "VisionTransformer", None):
        return 1
    mvit = sys.modules.get("torchvision.models.video.mvit")
    if mvit is not None and isinstance(model, mvit.MViT):
        stride = getattr(getattr(model, "conv_proj", None), "stride", None)
        if isinstance(stride, tuple) and len(stride) == 3:
            return TokenLayout(prefix=1, strides=(int(stride[0]), None, None))
        return 1
    return None


def transform_window(model: nn.Module, x: Tensor) -> tuple[int, int, int, int] | None:
    """Where the image lies in what a torchvision detector's backbone sees: ``(h, w, padded_h, padded_w)``.

    torchvision's detectors (Faster/Mask/Keypoint R-CNN, RetinaNet, FCOS, SSD, SSDlite) pass
    their input through a ``GeneralizedRCNNTransform``: it resizes each image (to
    ``min_size`` / ``max_size``, or SSD's fixed size) and pads the batch at the bottom and
    right to a multiple of ``size_divisible``. A backbone layer's map covers that padded
    batch image; the image itself is its top-left ``h x w``. The transform is run once on
    the first image, without autograd, to read both sizes (``None``: no such transform, or
    one that keeps the image as it is).

    Example:
        >>> import torch
        >>> from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn
        >>> from camkit.layers.families.torchvision import transform_window
        >>> model = fasterrcnn_mobilenet_v3_large_fpn(weights=None, weights_backbone=None, num_classes=3,
        ...                                           min_size=64, max_size=64).eval()
        >>> transform_window(model, torch.rand(1, 3, 40, 60))  # resized to 42 x 64, padded to 64 x 64
        (42, 64, 64, 64)
    """
    transform = getattr(model, "transform", None)
    if type(transform).__name__ != "GeneralizedRCNNTransform" or x.dim() != 4 or not isinstance(transform, nn.Module):
        return None
    with torch.no_grad():
        images = transform([x[0]])[0]
    (height, width), padded = images.image_sizes[0], images.tensors.shape[-2:]
    window = (int(height), int(width), int(padded[0]), int(padded[1]))
    return None if window == (x.shape[2], x.shape[3], x.shape[2], x.shape[3]) else window
