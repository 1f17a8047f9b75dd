"""The demo's small vision transformer and the loader of its bundled, trained weights.

The same shapes data as the demo CNN (:mod:`camkit.bundled.shapes`, with the corner watermark
shortcut), the same seeded training loop (``python -m camkit.demo.train --model vit``); the
model is torchvision's ``VisionTransformer`` at a tiny size, so every attention method
(:class:`camkit.AttentionRollout`, :class:`camkit.CheferRollout`, :class:`camkit.LeGrad`) and every
CAM can be compared on it (``benchmarks/case_vit_faithfulness.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from .model import load_weights
from .shapes import CLASSES, IMAGE_SIZE

__all__ = ["VIT_CAM_LAYER", "VIT_WEIGHTS", "load_shapes_vit", "shapes_vit"]

VIT_WEIGHTS = Path(__file__).resolve().parent.parent / "assets" / "shapes_vit.pt"
"""The bundled state dict, produced by ``python -m camkit.demo.train --model vit``."""

VIT_CAM_LAYER = "encoder.layers.encoder_layer_3.ln_1"
"""The layer a CAM reads on this model: the last block's first norm (camkit's default for torchvision ViTs)."""


def shapes_vit(classes: int = len(CLASSES)) -> nn.Module:
    """A 4-block ViT for the 64x64 shapes (8 x 8 tokens of width 48, 4 heads; about 122k parameters).

    Input: RGB in [0, 1], [B, 3, 64, 64]; output: logits [B, 4] in
    :data:`~camkit.bundled.shapes.CLASSES` order. One class token and an 8 x 8 token grid. The
    patches are embedded by a small convolutional stem (three stride-2 3 x 3 convolutions and a
    stride-1 one, torchvision's ``conv_stem_configs``) instead of one 8 x 8 convolution.

    What it learned (``camkit/assets/shapes_vit.json``): trained for a few minutes from scratch on
    a CPU, this model, like a plain 8 x 8 patch embedding tried before it, learned the watermark
    shortcut and little of the shapes: its training accuracy stayed near 0.49 (circles by their
    watermark, about chance on the three other classes). Such a model is what the faithfulness
    benchmark needs: where it calls a swapped image "circle", the evidence is the watermark.

    Example:
        >>> import torch
        >>> from camkit.bundled.vit import shapes_vit
        >>> shapes_vit()(torch.rand(2, 3, 64, 64)).shape
        torch.Size([2, 4])
    """
    from torchvision.models.vision_transformer import ConvStemConfig, VisionTransformer

    stem = [ConvStemConfig(out_channels=c, kernel_size=3, stride=s) for c, s in ((16, 2), (32, 2), (48, 2), (48, 1))]
    return VisionTransformer(
        image_size=IMAGE_SIZE, patch_size=8, num_layers=4, num_heads=4, hidden_dim=48, mlp_dim=96, num_classes=classes,
        conv_stem_configs=stem,
    )


def load_shapes_vit(path: str | os.PathLike[str] | None = None, map_location: str | torch.device = "cpu") -> nn.Module:
    """The trained demo ViT in eval mode, with the bundled weights (loaded with ``weights_only=True``).

    Example:
        >>> from camkit.bundled.vit import load_shapes_vit
        >>> load_shapes_vit().training
        False
    """
    return load_weights(shapes_vit(), VIT_WEIGHTS if path is None else path, map_location, "--model vit ")
