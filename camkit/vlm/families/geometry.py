"""Where a processed view's pixels come from in the original image: resizes, centre crops, pads, tiles.

A *view* is one image the vision tower sees (the whole image resized, or a tile or crop of it).
Image processors build views by resizing, padding and cropping, which are all affine in each
axis, so a view's pixel coordinate ``v`` comes from the original image's ``o = v * scale + offset``
(per axis, continuous coordinates: pixel ``i`` spans ``[i, i + 1)``). :class:`ViewMap` is that map;
:func:`patch_boxes` turns a view's patch grid into boxes on the original image.

The sizes are those transformers' own image-processing helpers compute (imported when called),
so the rounding is the processor's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["ViewMap", "centre_crop_offset", "patch_boxes", "resized_size", "size_dict"]


@dataclass(frozen=True)
class ViewMap:
    """Per axis ``original = view * scale + offset`` (continuous pixel coordinates).

    Example:
        >>> from camkit.vlm.families.geometry import ViewMap
        >>> m = ViewMap(2.0, 2.0, 0.0, 0.0).then_resized((10, 10), (5, 5)).then_cropped(1, 0)
        >>> m.scale_y, m.offset_y
        (4.0, 4.0)
    """

    scale_y: float = 1.0
    scale_x: float = 1.0
    offset_y: float = 0.0
    offset_x: float = 0.0

    def then_resized(self, before: tuple[int, int], after: tuple[int, int]) -> ViewMap:
        """The map of the view after resizing it from ``before`` to ``after`` (H, W)."""
        ry, rx = before[0] / after[0], before[1] / after[1]
        return ViewMap(self.scale_y * ry, self.scale_x * rx, self.offset_y, self.offset_x)

    def then_cropped(self, top: float, left: float) -> ViewMap:
        """The map after cropping the view at ``(top, left)`` (negative: the view was padded there)."""
        return ViewMap(self.scale_y, self.scale_x, self.offset_y + top * self.scale_y, self.offset_x + left * self.scale_x)


def size_dict(size: Any) -> dict[str, int]:
    """A processor's ``size`` / ``crop_size`` (a dict, a ``SizeDict`` or an int) as a plain dict of the keys set.

    Example:
        >>> from camkit.vlm.families.geometry import size_dict
        >>> size_dict({"height": 4, "width": 6, "shortest_edge": None})
        {'height': 4, 'width': 6}
    """
    if isinstance(size, int):
        return {"height": size, "width": size}
    if isinstance(size, Mapping):
        items = dict(size)
    else:
        items = {k: getattr(size, k, None) for k in ("height", "width", "shortest_edge", "longest_edge", "max_height", "max_width")}
    return {k: int(v) for k, v in items.items() if v is not None}


def resized_size(size: Any, height: int, width: int) -> tuple[int, int]:
    """The (H, W) a transformers image processor's ``resize(image, size)`` gives an image of ``(height, width)``.

    Example:
        >>> from camkit.vlm.families.geometry import resized_size
        >>> resized_size({"shortest_edge": 32}, 40, 60), resized_size({"height": 8, "width": 8}, 40, 60)
        ((32, 48), (8, 8))
    """
    import numpy as np
    from transformers.image_transforms import get_resize_output_image_size, get_size_with_aspect_ratio
    from transformers.image_utils import ChannelDimension

    keys = size_dict(size)
    if "shortest_edge" in keys and "longest_edge" in keys:
        h, w = get_size_with_aspect_ratio((height, width), keys["shortest_edge"], keys["longest_edge"])
    elif "shortest_edge" in keys:
        probe = np.broadcast_to(np.zeros((1, 1, 1), dtype=np.uint8), (3, height, width))
        h, w = get_resize_output_image_size(
            probe, size=keys["shortest_edge"], default_to_square=False, input_data_format=ChannelDimension.FIRST
        )
    elif "max_height" in keys and "max_width" in keys:
        from transformers.image_utils import get_image_size_for_max_height_width

        h, w = get_image_size_for_max_height_width((height, width), keys["max_height"], keys["max_width"])
    else:
        h, w = keys["height"], keys["width"]
    return int(h), int(w)


def centre_crop_offset(height: int, width: int, crop_height: int, crop_width: int) -> tuple[int, int]:
    """``(top, left)`` of a transformers centre crop of ``(crop_height, crop_width)`` from ``(height, width)``.

    A crop larger than the image pads it first (half the difference, rounded down, before): the
    offset is then negative.

    Example:
        >>> from camkit.vlm.families.geometry import centre_crop_offset
        >>> centre_crop_offset(32, 48, 32, 32), centre_crop_offset(30, 32, 32, 32)
        ((0, 8), (-1, 0))
    """
    top = -((crop_height - height) // 2) if crop_height > height else int((height - crop_height) / 2.0)
    left = -((crop_width - width) // 2) if crop_width > width else int((width - crop_width) / 2.0)
    return top, left


def patch_boxes(grid: tuple[int, int], patch: int, view: ViewMap, image: tuple[int, int]) -> Tensor:
    """Boxes [gh * gw, 4] on the original image of a view's patch grid (row-major), clipped to the image.

    A patch that falls wholly outside the image (on padding) gets a NaN row.

    Example:
        >>> from camkit.vlm.families.geometry import ViewMap, patch_boxes
        >>> patch_boxes((1, 2), 4, ViewMap(offset_x=-4.0), (4, 6)).tolist()
        [[nan, nan, nan, nan], [0.0, 0.0, 4.0, 4.0]]
    """
    rows, cols = grid
    ys = torch.arange(rows + 1, dtype=torch.float64) * patch * view.scale_y + view.offset_y
    xs = torch.arange(cols + 1, dtype=torch.float64) * patch * view.scale_x + view.offset_x
    y0, y1 = ys[:-1].clamp(0, image[0]), ys[1:].clamp(0, image[0])
    x0, x1 = xs[:-1].clamp(0, image[1]), xs[1:].clamp(0, image[1])
    boxes = torch.stack(
        [y0[:, None].expand(rows, cols), x0[None].expand(rows, cols), y1[:, None].expand(rows, cols), x1[None].expand(rows, cols)],
        dim=-1,
    ).reshape(-1, 4)
    empty = (boxes[:, 2] <= boxes[:, 0]) | (boxes[:, 3] <= boxes[:, 1])
    boxes[empty] = math.nan
    return boxes.float()
