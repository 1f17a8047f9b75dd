"""Image preprocessing for a loaded model: resize, optional centre crop, scale to [0, 1], normalise.

The same geometry maps region boxes and masks in original-image pixels onto the model input
(:meth:`Preprocess.transform_boxes`, :meth:`Preprocess.transform_mask`) and a map back onto
the original image (:meth:`Preprocess.invert_map`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InvalidInputError, ModelLoadError
from ..io import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["Preprocess"]


@dataclass(frozen=True)
class Preprocess:
    """Image preprocessing: resize, optional centre crop, scale to [0, 1], normalise.

    Exactly one of ``size`` (resize straight to ``(height, width)``) and ``resize``
    (resize the shorter side to this many pixels, keeping the aspect ratio, as
    torchvision's ``Resize(int)``) is set. ``crop`` centre-crops after resizing.
    Resizing is bilinear with antialiasing, in float.

    Example:
        >>> import numpy as np
        >>> from camkit.modelload import Preprocess
        >>> p = Preprocess(resize=4, crop=(4, 4), mean=(0.0,) * 3, std=(1.0,) * 3)
        >>> x, shown = p(np.zeros((8, 16, 3), np.uint8))
        >>> tuple(x.shape), shown.shape
        ((3, 4, 4), (4, 4, 3))
        >>> p.transform_boxes(np.array([[0.0, 0.0, 16.0, 8.0]]), 8, 16).tolist()
        [[-2.0, 0.0, 6.0, 4.0]]
    """

    size: tuple[int, int] | None = None
    resize: int | None = None
    crop: tuple[int, int] | None = None
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        if (self.size is None) == (self.resize is None):
            raise ModelLoadError("Preprocess needs exactly one of size=(height, width) and resize=shorter_side")

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        """``(height, width)`` after the resize step, before cropping."""
        if self.size is not None:
            return self.size
        resize = int(self.resize or 0)  # set: __post_init__ requires size or resize
        short, long = (height, width) if height <= width else (width, height)
        new_long = int(resize * long / short)
        return (resize, new_long) if height <= width else (new_long, resize)

    def crop_offsets(self, height: int, width: int) -> tuple[int, int, int, int]:
        """``(top, left, out_height, out_width)`` of the crop in the resized image."""
        rh, rw = self.resized_shape(height, width)
        if self.crop is None:
            return 0, 0, rh, rw
        ch, cw = self.crop
        return round((rh - ch) / 2.0), round((rw - cw) / 2.0), ch, cw

    def output_shape(self, height: int, width: int) -> tuple[int, int]:
        """``(height, width)`` of the model input for an original image of this size."""
        _, _, oh, ow = self.crop_offsets(height, width)
        return oh, ow

    def _geometry(self, tensor: Tensor, mode: str) -> Tensor:
        """Resize and crop a float tensor [C, H, W] (crop zero-pads when the image is smaller)."""
        height, width = tensor.shape[-2:]
        rh, rw = self.resized_shape(height, width)
        if (rh, rw) != (height, width):
            if mode == "bilinear":
                tensor = F.interpolate(
                    tensor[None], size=(rh, rw), mode="bilinear", align_corners=False, antialias=True
                )[0]
            else:
                tensor = F.interpolate(tensor[None], size=(rh, rw), mode="nearest-exact")[0]
        top, left, oh, ow = self.crop_offsets(height, width)
        if (top, left, oh, ow) != (0, 0, rh, rw):
            pad = (max(0, -left), max(0, left + ow - rw), max(0, -top), max(0, top + oh - rh))
            if any(pad):
                tensor = F.pad(tensor, pad)
                top, left = top + pad[2], left + pad[0]
            tensor = tensor[:, top : top + oh, left : left + ow]
        return tensor

    def __call__(self, rgb: np.ndarray) -> tuple[Tensor, np.ndarray]:
        """``(x, shown)``: the model input [3, h, w] and the uint8 RGB image [h, w, 3] it shows."""
        if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            got = f"{rgb.dtype} {list(rgb.shape)}" if isinstance(rgb, np.ndarray) else type(rgb).__name__
            raise InvalidInputError(f"expected a uint8 RGB image [H, W, 3] (see camkit.read_rgb), got {got}")
        x01 = self._geometry(torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).float() / 255.0, "bilinear")
        x01 = x01.clamp(0.0, 1.0)
        shown = (x01 * 255.0).round().to(torch.uint8).permute(1, 2, 0).numpy()
        x = (x01 - torch.tensor(self.mean).view(3, 1, 1)) / torch.tensor(self.std).view(3, 1, 1)
        return x, shown

    def transform_boxes(self, boxes: np.ndarray, height: int, width: int) -> np.ndarray:
        """Boxes [N, 4] ``(x0, y0, x1, y1)`` in original pixels -> the model input's pixels.

        Coordinates are scaled by the resize factors and shifted by the crop; they are
        not clipped (the metrics treat out-of-image coordinates as thresholds).
        """
        rh, rw = self.resized_shape(height, width)
        top, left, _, _ = self.crop_offsets(height, width)
        scale = np.array([rw / width, rh / height, rw / width, rh / height])
        shift = np.array([left, top, left, top], dtype=np.float64)
        return np.asarray(boxes, dtype=np.float64) * scale - shift

    def transform_mask(self, mask: np.ndarray) -> Tensor:
        """A region mask [H, W] (non-zero inside) at original size -> bool [h, w] (nearest)."""
        m = torch.from_numpy(np.ascontiguousarray(mask != 0)).float()[None]
        return self._geometry(m, "nearest")[0] > 0.5

    def invert_map(self, heat: Tensor, height: int, width: int) -> tuple[Tensor, Tensor]:
        """A map [h, w] at the model input's size taken back to the original image [height, width].

        The map is placed where the crop took its pixels in the resized image, then that frame is
        resized (bilinear) to the original size. Returns ``(map, inside)``: ``inside`` (bool
        [height, width]) marks the pixels the model saw; outside the crop the map is 0.

        Example:
            >>> import torch
            >>> from camkit.modelload import Preprocess
            >>> p = Preprocess(resize=2, crop=(2, 2), mean=(0.0,) * 3, std=(1.0,) * 3)
            >>> full, inside = p.invert_map(torch.ones(2, 2), 2, 4)  # a 2x4 image: the middle 2x2 was seen
            >>> full.tolist(), inside[0].tolist()
            ([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0]], [False, True, True, False])
        """
        rh, rw = self.resized_shape(height, width)
        top, left, oh, ow = self.crop_offsets(height, width)
        if tuple(heat.shape) != (oh, ow):
            raise InvalidInputError(f"the map is {list(heat.shape)}; this preprocessing gives inputs of {[oh, ow]}")
        frame = torch.zeros(2, rh, rw, dtype=torch.float32, device=heat.device)
        y0, x0, y1, x1 = max(0, top), max(0, left), min(rh, top + oh), min(rw, left + ow)
        frame[0, y0:y1, x0:x1] = heat.float()[y0 - top : y1 - top, x0 - left : x1 - left]
        frame[1, y0:y1, x0:x1] = 1.0
        if (rh, rw) != (height, width):
            values = F.interpolate(frame[None, :1], size=(height, width), mode="bilinear", align_corners=False)[0, 0]
            inside = F.interpolate(frame[None, 1:], size=(height, width), mode="nearest-exact")[0, 0] > 0.5
        else:
            values, inside = frame[0], frame[1] > 0.5
        return torch.where(inside, values, torch.zeros_like(values)), inside

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly description (for manifests)."""
        return {"size": self.size, "resize": self.resize, "crop": self.crop, "mean": self.mean, "std": self.std}
