"""``GradCAMElementWise``: the module path pytorch-grad-cam keeps it under."""

from ._cams import GradCAMElementWise

__all__ = ["GradCAMElementWise"]
