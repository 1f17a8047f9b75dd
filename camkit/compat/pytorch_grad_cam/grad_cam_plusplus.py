"""``GradCAMPlusPlus``: the module path pytorch-grad-cam keeps it under."""

from ._cams import GradCAMPlusPlus

__all__ = ["GradCAMPlusPlus"]
