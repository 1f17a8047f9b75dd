"""``FullGrad``: the module path pytorch-grad-cam keeps it under."""

from ._cams import FullGrad

__all__ = ["FullGrad"]
