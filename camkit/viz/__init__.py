"""What people look at: heatmap overlays, figures of explanations, colour tables.

* :mod:`camkit.viz.overlay`: one image with its heatmap blended over it (:func:`overlay`);
* :mod:`camkit.viz.figures`: images, maps and overlays side by side with titles and a
  colorbar (:func:`figure`), from any object with maps (:class:`Explained`);
* :mod:`camkit.viz.tokens`: a strip of overlays, one per generated word with the word beneath
  (:func:`~camkit.viz.tokens.token_strip`), from any object with ``maps`` and ``tokens``;
* :mod:`camkit.viz.colormaps`: the colour tables camkit ships (``bwr``...);
* :mod:`camkit.viz.boxes`: detections drawn on a picture (:func:`draw_boxes`) and a map
  renormalised inside boxes (:func:`renormalize_in_boxes`).

The tensor math under the pictures (colouring, batched overlays, attribution views) is in
:mod:`camkit.functional`; the pixel conversions in :mod:`camkit.io`.
"""

from .boxes import draw_boxes, renormalize_in_boxes
from .canvas import ExplanationFigure
from .colormaps import colormap_names
from .figures import Explained, figure
from .overlay import overlay
from .tokens import token_strip

__all__ = [
    "Explained", "ExplanationFigure", "colormap_names", "draw_boxes", "figure", "overlay", "renormalize_in_boxes", "token_strip",
]
