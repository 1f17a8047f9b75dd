"""``GradCAM``: the module path pytorch-grad-cam keeps it under."""

from ._cams import GradCAM

__all__ = ["GradCAM"]
