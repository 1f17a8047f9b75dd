"""Default layers of MONAI's networks (``monai.networks.nets``), for any ``spatial_dims``.

MONAI builds one network class for signals, images and volumes (``spatial_dims=1, 2, 3``), so
one rule serves every rank. MONAI is imported only when the model's own module already
imported it. Classifiers get their last map before pooling (a DenseNet its ``features``,
which end with ``norm5``, as torchvision's and timm's DenseNets; MONAI's own ``GradCAM``
examples use the ReLU after it, ``class_layers.relu``); segmentation networks get
their last decoder features before the output convolution, not the output itself, whose
Grad-CAM for a class would only repeat that class's logits. SegResNet's are read at the
``GroupNorm`` that opens its ``conv_final`` (a normalisation, like torchvision's DenseNet's
``norm5``); the ``ReLU`` after it (``act_mod``) also works, read channel-first because
SegResNet is a plain convolutional network (:func:`camkit.layers.layout.conv_ranks`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from torch import nn

__all__ = ["monai_layer", "table"]


def _rules() -> list[tuple[type, Callable[[nn.Module], str], str]]:
    from monai.networks.nets import DenseNet, EfficientNet, ResNet, SegResNet, SENet, UNet

    return [
        (DenseNet, lambda m: "features", "features (ends with norm5)"),
        (ResNet, lambda m: "layer4", "layer4"),
        (SENet, lambda m: "layer4", "layer4"),
        (EfficientNet, lambda m: "_swish", "_swish (its last call: after _conv_head and _bn1)"),
        (UNet, lambda m: "model.1", "model.1 (the skip connection before the last up-sampling)"),
        (SegResNet, lambda m: "conv_final.0", "conv_final.0 (the normalised last decoder features)"),
    ]


def table() -> list[tuple[str, str]]:
    """``(architecture class, default layer)`` rows for MONAI's networks, as ``docs/layers.md`` shows them.

    Example:
        >>> import monai.networks.nets
        >>> from camkit.layers.families.monai import table
        >>> dict(table())["DenseNet (MONAI)"]
        'features (ends with norm5)'
    """
    return [(f"{cls.__name__} (MONAI)", text) for cls, _, text in _rules()]


def monai_layer(model: nn.Module) -> tuple[bool, str | None]:
    """``(known, layer)``: whether ``model`` is one of MONAI's networks (or a subclass), and its default layer.

    Example:
        >>> from torch import nn
        >>> from monai.networks.nets import DenseNet
        >>> from camkit.layers.families.monai import monai_layer
        >>> net = DenseNet(spatial_dims=3, in_channels=1, out_channels=2, block_config=(1, 1))
        >>> monai_layer(net), monai_layer(nn.Linear(2, 2))
        ((True, 'features'), (False, None))
    """
    for cls, rule, _ in _rules() if "monai.networks.nets" in sys.modules else []:
        if isinstance(model, cls):
            try:
                return True, rule(model)
            except AttributeError:  # get_submodule raises AttributeError
                return True, None  # a subclass rebuilt differently: fall back to the generic rule
    return False, None
