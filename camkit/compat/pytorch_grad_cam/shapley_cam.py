"""``ShapleyCAM``: the module path pytorch-grad-cam keeps it under."""

from ._cams import ShapleyCAM

__all__ = ["ShapleyCAM"]
