"""``EigenGradCAM``: the module path pytorch-grad-cam keeps it under."""

from ._cams import EigenGradCAM

__all__ = ["EigenGradCAM"]
