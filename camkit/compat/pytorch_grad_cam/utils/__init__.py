"""pytorch-grad-cam's ``utils`` package: image helpers, targets, reshape transforms, projections."""

from . import image, model_targets, reshape_transforms, svd_on_activations

__all__ = ["image", "model_targets", "reshape_transforms", "svd_on_activations"]
