"""``HiResCAM``: the module path pytorch-grad-cam keeps it under."""

from ._cams import HiResCAM

__all__ = ["HiResCAM"]
