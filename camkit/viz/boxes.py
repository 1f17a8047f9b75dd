"""Detections on pictures: boxes and labels drawn on an image, and a map renormalised inside boxes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import InvalidInputError
from ..io import to_uint8_rgb

__all__ = ["draw_boxes", "renormalize_in_boxes"]


def _boxes(boxes: Any) -> np.ndarray:
    array = boxes.detach().float().cpu().numpy() if isinstance(boxes, Tensor) else np.asarray(boxes, dtype=np.float32)
    if array.ndim == 1 and array.shape[0] == 4:
        array = array[None]
    if array.ndim != 2 or array.shape[1] != 4:
        raise InvalidInputError(f"boxes must be [N, 4] (x1, y1, x2, y2) in pixels, got shape {list(array.shape)}")
    return array


def draw_boxes(
    image: Any,
    boxes: Any,
    labels: Sequence[str] | None = None,
    *,
    color: tuple[int, int, int] = (255, 255, 255),
    width: int = 2,
) -> np.ndarray:
    """Draw boxes, each with its label above it, on a copy of an image.

    Args:
        image: uint8 [H, W, 3] array (an overlay from :func:`camkit.overlay`, say), PIL image or
            float tensor [3, H, W] in [0, 1].
        boxes: [N, 4] (or one [4]) ``(x1, y1, x2, y2)`` in the image's pixels.
        labels: one text per box (``"dog 0.87"``), or ``None``.
        color: the boxes' and labels' RGB colour; each label sits on a dark band so it reads on
            any heatmap.
        width: the boxes' line width in pixels.

    Returns:
        A new uint8 RGB array [H, W, 3].

    Example:
        >>> import numpy as np
        >>> from camkit.viz import draw_boxes
        >>> out = draw_boxes(np.zeros((8, 8, 3), np.uint8), [[1, 1, 6, 6]], width=1)
        >>> out[1, 1].tolist(), out[3, 3].tolist()  # on the box's edge, inside it
        ([255, 255, 255], [0, 0, 0])
    """
    import cv2

    picture = to_uint8_rgb(image)
    array = _boxes(boxes)
    if labels is not None and len(labels) != len(array):
        raise InvalidInputError(f"give one label per box: {len(array)} boxes, {len(labels)} labels")
    rgb = tuple(int(c) for c in color)
    scale = max(0.3, min(picture.shape[:2]) / 600)
    for index, (x1, y1, x2, y2) in enumerate(np.rint(array).astype(int)):
        cv2.rectangle(picture, (int(x1), int(y1)), (int(x2), int(y2)), rgb, max(1, int(width)))
        if labels is None or not labels[index]:
            continue
        (text_w, text_h), base = cv2.getTextSize(labels[index], cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
        top = int(y1) - text_h - base - 2 if int(y1) - text_h - base - 2 >= 0 else int(y1) + 1
        cv2.rectangle(picture, (int(x1), top), (int(x1) + text_w + 2, top + text_h + base + 2), (0, 0, 0), -1)
        cv2.putText(picture, labels[index], (int(x1) + 1, top + text_h + 1), cv2.FONT_HERSHEY_SIMPLEX, scale, rgb, 1,
                    cv2.LINE_AA)
    return picture


def renormalize_in_boxes(maps: Tensor, boxes: Any) -> Tensor:
    """A map min-max normalised inside each box on its own, and zero outside every box.

    For each box, the map's values inside it are rescaled to [0, 1] by that box's own minimum
    and maximum; where boxes overlap, the larger value is kept; outside all boxes the map is 0.

    What it shows: where, *within* each detected object, the map is strongest, even for an
    object whose evidence is weak next to another's (every box gets the full colour range).
    What it hides: everything outside the boxes (context the detector used, such as the road
    under a car, or evidence that lies beside the object), and how strong one box's evidence
    is compared with another's: a box whose map is nearly flat is stretched to full contrast.
    Look at the plain map as well before drawing conclusions.

    Args:
        maps: [H, W] or [B, H, W] (the same boxes for every map).
        boxes: [N, 4] ``(x1, y1, x2, y2)`` in pixels; they are rounded outwards and clipped to the map.

    Returns:
        A new tensor of the maps' shape; the input is not modified.

    Example:
        >>> import torch
        >>> from camkit.viz import renormalize_in_boxes
        >>> m = torch.tensor([[0.1, 0.2, 0.9], [0.3, 0.4, 0.9]])
        >>> renormalize_in_boxes(m, [[0, 0, 2, 2]])
        tensor([[0.0000, 0.3333, 0.0000],
                [0.6667, 1.0000, 0.0000]])
    """
    if not isinstance(maps, Tensor) or maps.dim() not in (2, 3):
        got = list(maps.shape) if isinstance(maps, Tensor) else type(maps).__name__
        raise InvalidInputError(f"maps must be a tensor [H, W] or [B, H, W], got {got}")
    array = _boxes(boxes)
    height, width = maps.shape[-2:]
    out = torch.zeros_like(maps, dtype=torch.float32)
    for x1, y1, x2, y2 in array:
        left, top = max(0, int(np.floor(x1))), max(0, int(np.floor(y1)))
        right, bottom = min(width, int(np.ceil(x2))), min(height, int(np.ceil(y2)))
        if right <= left or bottom <= top:
            continue
        region = maps[..., top:bottom, left:right].float()
        low = region.amin(dim=(-2, -1), keepdim=True)
        span = region.amax(dim=(-2, -1), keepdim=True) - low
        scaled = torch.where(span > 0, (region - low) / span.clamp_min(1e-30), torch.zeros_like(region))
        out[..., top:bottom, left:right] = torch.maximum(out[..., top:bottom, left:right], scaled)
    return out
