"""``LayerCAM``: the module path pytorch-grad-cam keeps it under."""

from ._cams import LayerCAM

__all__ = ["LayerCAM"]
