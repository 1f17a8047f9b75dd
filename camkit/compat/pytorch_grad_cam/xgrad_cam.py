"""``XGradCAM``: the module path pytorch-grad-cam keeps it under."""

from ._cams import XGradCAM

__all__ = ["XGradCAM"]
