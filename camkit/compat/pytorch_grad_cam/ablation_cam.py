"""``AblationCAM``: the module path pytorch-grad-cam keeps it under."""

from ._cams import AblationCAM

__all__ = ["AblationCAM"]
