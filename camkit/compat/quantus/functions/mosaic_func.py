"""Quantus's mosaic builders (data preparation for ``Focus``): names only, not translated.

camkit's ``Focus`` takes the mosaics and ``custom_batch`` however they were made; building them
is left to the original Quantus. Both names raise
:class:`~camkit.compat.quantus.NotTranslatedError` when called.
"""

from __future__ import annotations

from .perturb_func import _marker

__all__ = ["build_single_mosaic", "mosaic_creation"]

build_single_mosaic = _marker("build_single_mosaic", "mosaic_func")
mosaic_creation = _marker("mosaic_creation", "mosaic_func")
