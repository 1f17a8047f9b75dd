"""What every camkit figure is: :class:`ExplanationFigure` (pixels, panel boxes, titles), drawn with matplotlib.

matplotlib is an optional dependency (``pip install camkit[plot]``), imported when a figure is
drawn (:func:`matplotlib_parts`); figures render off screen (Agg) whatever pyplot's backend is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from ..io import save_png

__all__ = ["ExplanationFigure", "matplotlib_parts", "render"]

TITLE_INCHES = 0.5  # a panel's title band
COLORBAR_INCHES = 0.7  # the colorbar row under the panels


@dataclass(frozen=True)
class ExplanationFigure:
    """A rendered figure: its pixels, where each panel lies, and what each panel is titled.

    Jupyter shows it inline (``_repr_png_``); :meth:`save` writes it as a PNG.

    Attributes:
        image: uint8 RGB [H, W, 3].
        columns: the column names, left to right: for :func:`camkit.figure` on images ``"image"``,
            then ``"map: <label>"`` and ``"overlay: <label>"`` for each explanation; the pictures
            of other ranks name theirs (``"axis 0"``, ``"frame 3"``, ``"signal"``...).
        panels: ``(row, column) -> (x0, y0, x1, y1)``, the panel's pixel box in ``image``
            (``x1``/``y1`` exclusive).
        titles: ``(row, column) -> title``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> x = torch.rand(2, 3, 8, 8)
        >>> fig = camkit.GradCAM(net, "1").explain(x).show(x, panel=1.0, dpi=50)
        >>> fig.image.shape, fig.columns
        ((185, 150, 3), ('image', 'map: gradcam', 'overlay: gradcam'))
        >>> fig._repr_png_()[:4]
        b'\\x89PNG'
    """

    image: np.ndarray
    columns: tuple[str, ...]
    panels: Mapping[tuple[int, str], tuple[int, int, int, int]] = field(default_factory=dict)
    titles: Mapping[tuple[int, str], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "panels", MappingProxyType(dict(self.panels)))
        object.__setattr__(self, "titles", MappingProxyType(dict(self.titles)))

    def _repr_png_(self) -> bytes:
        import cv2

        ok, buf = cv2.imencode(".png", np.ascontiguousarray(self.image[:, :, ::-1]))
        if not ok:
            raise InvalidInputError(f"could not encode a figure of shape {self.image.shape} as PNG")
        return buf.tobytes()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the figure as a PNG (see :func:`camkit.save_png`)."""
        save_png(path, self.image)

    def __repr__(self) -> str:
        height, width = self.image.shape[:2]
        rows = 1 + max((r for r, _ in self.panels), default=-1)
        return f"ExplanationFigure({width}x{height} px, {rows} rows, columns={list(self.columns)})"


def matplotlib_parts() -> tuple[Any, Any, Any, Any, Any]:
    """matplotlib's Figure, Agg canvas, ScalarMappable, ListedColormap, Normalize; or a clear ImportError."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import ListedColormap, Normalize
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            "camkit.figure needs matplotlib, an optional dependency: pip install 'camkit[plot]' "
            "(or pip install matplotlib)"
        ) from err
    return Figure, FigureCanvasAgg, ScalarMappable, ListedColormap, Normalize


def render(fig: Any, axes: Mapping[tuple[int, str], Any], columns: tuple[str, ...],
           titles: Mapping[tuple[int, str], str]) -> ExplanationFigure:  # fmt: skip
    """Draw a matplotlib ``Figure`` with Agg and read each named axes' pixel box: an :class:`ExplanationFigure`."""
    _, Canvas, _, _, _ = matplotlib_parts()
    canvas = Canvas(fig)
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    height = rgba.shape[0]
    panels = {}
    for key, ax in axes.items():
        box = ax.get_window_extent()
        panels[key] = (int(np.ceil(box.x0)), int(np.ceil(height - box.y1)), int(np.floor(box.x1)),
                       int(np.floor(height - box.y0)))  # fmt: skip
    return ExplanationFigure(image=np.ascontiguousarray(rgba[:, :, :3]), columns=columns, panels=panels, titles=titles)
