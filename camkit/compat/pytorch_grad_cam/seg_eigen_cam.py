"""``SegEigenCAM``: the module path pytorch-grad-cam keeps it under."""

from ._cams import SegEigenCAM

__all__ = ["SegEigenCAM"]
