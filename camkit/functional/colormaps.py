"""Colour lookup tables defined by their anchor colours: diverging maps for signed attributions.

OpenCV's colormaps (``jet``, ``viridis``, ``turbo``...) are sequential: fine for CAM maps in
[0, 1], wrong for attributions whose sign matters. The tables here are built from a few anchor
colours, linearly interpolated at 256 evenly spaced positions, with numpy only (no plotting
library is imported). :func:`camkit.functional.colormap_lut` and every ``colormap=`` argument
look names up here first, then in OpenCV.

Diverging tables put negative values (index 0) at the first anchor, zero (index 127.5) at the
middle one and positive values (index 255) at the last: in ``bwr`` negative is blue, zero white,
positive red.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["ANCHORS", "anchor_lut", "colormap_names"]

# ColorBrewer's 11-class RdBu, from red (low values) to blue (high values).
_RDBU_HEX = ("67001f", "b2182b", "d6604d", "f4a582", "fddbc7", "f7f7f7", "d1e5f0", "92c5de", "4393c3", "2166ac", "053061")

# name -> anchor colours (RGB in [0, 1]), spaced evenly over [0, 1].
ANCHORS: dict[str, tuple[tuple[float, float, float], ...]] = {
    # diverging: negative -> zero -> positive
    "bwr": ((0.0, 0.0, 1.0), (1.0, 1.0, 1.0), (1.0, 0.0, 0.0)),
    "seismic": ((0.0, 0.0, 0.3), (0.0, 0.0, 1.0), (1.0, 1.0, 1.0), (1.0, 0.0, 0.0), (0.5, 0.0, 0.0)),
    # ColorBrewer's RdBu (red for low values, blue for high) and, below, its reverse.
    "rdbu": tuple((int(h[0:2], 16) / 255, int(h[2:4], 16) / 255, int(h[4:6], 16) / 255) for h in _RDBU_HEX),
    "rdwhgn": ((1.0, 0.0, 0.0), (1.0, 1.0, 1.0), (0.0, 0.5, 0.0)),  # negative red, positive green
    # sequential, white -> colour: for one sign at a time
    "reds": ((1.0, 1.0, 1.0), (0.8, 0.0, 0.0)),
    "blues": ((1.0, 1.0, 1.0), (0.0, 0.0, 0.8)),
    "greens": ((1.0, 1.0, 1.0), (0.0, 0.45, 0.0)),
}
ANCHORS["rdbu_r"] = tuple(reversed(ANCHORS["rdbu"]))


def colormap_names() -> list[str]:
    """The names of the anchor-defined tables (OpenCV's come on top of these).

    Example:
        >>> from camkit.functional.colormaps import colormap_names
        >>> "bwr" in colormap_names() and "seismic" in colormap_names()
        True
    """
    return sorted(ANCHORS)


@functools.lru_cache(maxsize=32)
def anchor_lut(name: str) -> np.ndarray | None:
    """The 256-entry uint8 RGB table [256, 3] of an anchor-defined colormap, or None if unknown.

    Entry ``i`` sits at position ``t = i / 255``; between two anchors ``k`` and ``k + 1``
    (at ``k / (n - 1)`` and ``(k + 1) / (n - 1)``) the colour is interpolated linearly, then
    quantised with ``round(c * 255)``. The returned array is read-only.

    Example:
        >>> from camkit.functional.colormaps import anchor_lut
        >>> lut = anchor_lut("bwr")
        >>> lut[0].tolist(), lut[255].tolist(), lut[127].tolist(), lut[128].tolist()
        ([0, 0, 255], [255, 0, 0], [254, 254, 255], [255, 254, 254])
    """
    anchors = ANCHORS.get(name.lower())
    if anchors is None:
        return None
    colours = np.asarray(anchors, dtype=np.float64)  # [n, 3]
    where = np.linspace(0.0, 1.0, len(colours))
    t = np.arange(256, dtype=np.float64) / 255.0
    table = np.stack([np.interp(t, where, colours[:, c]) for c in range(3)], axis=1)
    lut = np.rint(table * 255).astype(np.uint8)
    lut.setflags(write=False)
    return lut
