"""``KPCA_CAM``: the module path pytorch-grad-cam keeps it under."""

from ._cams import KPCA_CAM

__all__ = ["KPCA_CAM"]
