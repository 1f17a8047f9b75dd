"""``FEM``: the module path pytorch-grad-cam keeps it under."""

from ._cams import FEM

__all__ = ["FEM"]
