"""``AblationLayer``, ``AblationLayerVit``, ``AblationLayerFasterRCNN``: accepted by ``AblationCAM``, not needed.

pytorch-grad-cam swaps the target layer for one of these modules to zero channels; camkit's
Ablation-CAM zeroes them through a hook on the layer's output itself, for feature maps, tokens
and detector features alike. The classes remain so that scripts constructing them still run:
as modules they pass their input through unchanged.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

__all__ = ["AblationLayer", "AblationLayerFasterRCNN", "AblationLayerVit"]


class AblationLayer(nn.Module):
    """Accepted for ``AblationCAM(ablation_layer=...)``; an identity module (camkit ablates through a hook).

    Example:
        >>> import torch
        >>> from camkit.compat.pytorch_grad_cam import AblationLayer
        >>> AblationLayer()(torch.ones(1, 2)).tolist()
        [[1.0, 1.0]]
    """

    def forward(self, x: Any) -> Any:
        return x

    def set_next_batch(self, input_batch_index: int, activations: Tensor, num_channels_to_ablate: int) -> None:
        """Kept for scripts that call it; camkit chooses the channels itself."""
        return None


class AblationLayerVit(AblationLayer):
    """Accepted for vision transformers; camkit ablates token channels without it."""


class AblationLayerFasterRCNN(AblationLayer):
    """Accepted for Faster R-CNN's feature dictionaries; camkit ablates them without it."""
