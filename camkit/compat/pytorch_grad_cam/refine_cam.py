"""``RefineCAM`` (pytorch-grad-cam 1.5.7)."""

from ._missing import missing

__all__ = ["RefineCAM"]

RefineCAM = missing("RefineCAM")
