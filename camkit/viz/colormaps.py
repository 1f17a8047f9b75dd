"""The colour tables of camkit's own colormaps (``bwr``, ``RdBu``...), under the path scripts import them by.

They are plain data, defined beside the tensor colouring that reads them, in
:mod:`camkit.functional.colormaps`.
"""

from ..functional.colormaps import ANCHORS, anchor_lut, colormap_names

__all__ = ["ANCHORS", "anchor_lut", "colormap_names"]
