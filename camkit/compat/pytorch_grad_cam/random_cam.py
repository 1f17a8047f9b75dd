"""``RandomCAM``: the module path pytorch-grad-cam keeps it under."""

from ._cams import RandomCAM

__all__ = ["RandomCAM"]
