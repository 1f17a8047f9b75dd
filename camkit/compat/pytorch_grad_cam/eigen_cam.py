"""``EigenCAM``: the module path pytorch-grad-cam keeps it under."""

from ._cams import EigenCAM

__all__ = ["EigenCAM"]
