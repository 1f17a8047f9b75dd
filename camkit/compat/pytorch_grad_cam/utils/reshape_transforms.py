"""pytorch-grad-cam's reshape transforms: a layer's output to [B, C, h, w].

camkit lays out tokens and channel-last maps itself, so with camkit these are rarely needed;
they remain for scripts that pass them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ....functional.tokens import tokens_to_grid

__all__ = ["fasterrcnn_reshape_transform", "swinT_reshape_transform", "vit_reshape_transform"]


def fasterrcnn_reshape_transform(x: Any) -> Tensor:
    """A Faster R-CNN backbone's feature dict: every level's magnitude resized to the ``"pool"`` level's size, concatenated."""
    levels = list(x.values())
    size = (x["pool"] if "pool" in x else levels[-1]).shape[-2:]
    return torch.cat([F.interpolate(torch.abs(level), size, mode="bilinear") for level in levels], dim=1)


def swinT_reshape_transform(tensor: Tensor, height: int = 7, width: int = 7) -> Tensor:
    """Swin tokens [B, h * w, C] (or a channel-last map [B, h, w, C]) to [B, C, h, w]."""
    return tensor.reshape(tensor.size(0), height, width, tensor.size(-1)).permute(0, 3, 1, 2)


def vit_reshape_transform(tensor: Tensor, height: int = 14, width: int = 14) -> Tensor:
    """ViT tokens [B, 1 + h * w, C]: the class token dropped, the rest as [B, C, h, w].

    Example:
        >>> import torch
        >>> from camkit.compat.pytorch_grad_cam.utils.reshape_transforms import vit_reshape_transform
        >>> vit_reshape_transform(torch.rand(2, 1 + 6, 5), height=2, width=3).shape
        torch.Size([2, 5, 2, 3])
    """
    return tokens_to_grid(tensor, prefix=tensor.size(1) - height * width, grid=(height, width))
