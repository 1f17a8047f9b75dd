"""pytorch-grad-cam's ``utils`` package: image helpers, targets, reshape transforms, projections, layer helpers."""

from . import find_layers, image, model_targets, reshape_transforms, svd_on_activations
from .image import deprocess_image
from .svd_on_activations import get_2d_projection

__all__ = [
    "deprocess_image",
    "find_layers",
    "get_2d_projection",
    "image",
    "model_targets",
    "reshape_transforms",
    "svd_on_activations",
]
