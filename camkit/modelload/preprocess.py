"""Image preprocessing for a loaded model: resize, optional centre crop, scale to [0, 1], normalise.

A :class:`Preprocess` reproduces the steps of the model's own library: torchvision's weights
transforms, timm's data config (:mod:`camkit.modelload.timm`) or a Hugging Face image processor
(:mod:`camkit.modelload.hf`). ``backend`` says how pixels are resized, because the libraries
differ there and a heatmap must explain the input the model really sees: ``"pil"`` resizes the
uint8 image with Pillow (torchvision and timm transforms applied to PIL images), ``"tensor"``
resizes the uint8 tensor with torchvision's antialiased kernel (Hugging Face's torchvision
image processors), ``"float"`` resizes in float with antialiasing (camkit's own, for ``--size``).

The same geometry maps region boxes and masks in original-image pixels onto the model input
(:meth:`Preprocess.transform_boxes`, :meth:`Preprocess.transform_mask`) and a map back onto
the original image (:meth:`Preprocess.invert_map`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InvalidInputError, ModelLoadError
from ..io import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["Preprocess"]


_INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos")
_BACKENDS = ("float", "pil", "tensor")


@dataclass(frozen=True)
class Preprocess:
    """Image preprocessing: resize, optional centre crop, scale to [0, 1], normalise.

    Exactly one of ``size`` (resize straight to ``(height, width)``) and ``resize``
    (resize the shorter side to this many pixels, keeping the aspect ratio, as
    torchvision's ``Resize(int)``) is set. With ``resize``, ``max_size`` caps the longer side
    as Hugging Face's DETR processors do (``shortest_edge`` with ``longest_edge``): when the
    longer side would pass it, the shorter side becomes ``round(max_size * short / long)``.
    ``crop`` centre-crops after resizing; its offset
    is rounded (``crop_rounding="round"``, torchvision and timm) or floored (``"floor"``,
    Hugging Face). ``interpolation`` is ``"bilinear"``, ``"bicubic"``, ``"nearest"`` or
    ``"lanczos"`` (``"pil"`` backend only); ``backend`` is ``"float"``, ``"pil"`` or ``"tensor"``
    (see the module docstring). Pixels are then multiplied by ``scale`` (1/255: [0, 1]) and
    normalised with ``mean`` and ``std``. ``origin`` says where the settings came from (not
    compared).

    Calling it on one image (a PIL image, a uint8 array [H, W, 3] or a uint8 tensor [3, H, W])
    gives ``(x, shown)``: the model input [3, h, w] and the uint8 RGB image [h, w, 3] it shows.
    :meth:`batch` stacks several images into a model batch.

    Example:
        >>> import numpy as np
        >>> from camkit.modelload import Preprocess
        >>> p = Preprocess(resize=4, crop=(4, 4), mean=(0.0,) * 3, std=(1.0,) * 3)
        >>> x, shown = p(np.zeros((8, 16, 3), np.uint8))
        >>> tuple(x.shape), shown.shape
        ((3, 4, 4), (4, 4, 3))
        >>> p.transform_boxes(np.array([[0.0, 0.0, 16.0, 8.0]]), 8, 16).tolist()
        [[-2.0, 0.0, 6.0, 4.0]]
        >>> tuple(p.batch([np.zeros((8, 8, 3), np.uint8)] * 2).shape)
        (2, 3, 4, 4)
    """

    size: tuple[int, int] | None = None
    resize: int | None = None
    crop: tuple[int, int] | None = None
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    interpolation: str = "bilinear"
    backend: str = "float"
    crop_rounding: str = "round"
    scale: float = 1.0 / 255.0
    max_size: int | None = None
    origin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if (self.size is None) == (self.resize is None):
            raise ModelLoadError("Preprocess needs exactly one of size=(height, width) and resize=shorter_side")
        if self.interpolation not in _INTERPOLATIONS:
            raise ModelLoadError(f"Preprocess interpolation must be one of {_INTERPOLATIONS}, got {self.interpolation!r}")
        if self.backend not in _BACKENDS:
            raise ModelLoadError(f"Preprocess backend must be one of {_BACKENDS}, got {self.backend!r}")
        if self.interpolation == "lanczos" and self.backend != "pil":
            raise ModelLoadError("Preprocess: lanczos resizing is only reproduced with backend='pil'")
        if self.max_size is not None and (self.resize is None or self.max_size < self.resize):
            raise ModelLoadError(
                f"Preprocess max_size={self.max_size} needs resize= (a shorter side) no larger than it, got resize={self.resize}"
            )
        if self.crop_rounding not in ("round", "floor"):
            raise ModelLoadError(f"Preprocess crop_rounding must be 'round' or 'floor', got {self.crop_rounding!r}")

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        """``(height, width)`` after the resize step, before cropping."""
        if self.size is not None:
            return self.size
        resize: float = int(self.resize or 0)  # set: __post_init__ requires size or resize
        short, long = (height, width) if height <= width else (width, height)
        side = int(resize)
        if self.max_size is not None and long / short * resize > self.max_size:  # DETR's cap, its own arithmetic
            resize = self.max_size * float(short) / float(long)
            side = round(resize)
        if short == side:
            return height, width
        new_long = int(resize * long / short)
        return (side, new_long) if height <= width else (new_long, side)

    def crop_offsets(self, height: int, width: int) -> tuple[int, int, int, int]:
        """``(top, left, out_height, out_width)`` of the crop in the resized image."""
        rh, rw = self.resized_shape(height, width)
        if self.crop is None:
            return 0, 0, rh, rw
        ch, cw = self.crop
        if self.crop_rounding == "floor":
            return int((rh - ch) / 2.0), int((rw - cw) / 2.0), ch, cw
        return round((rh - ch) / 2.0), round((rw - cw) / 2.0), ch, cw

    def output_shape(self, height: int, width: int) -> tuple[int, int]:
        """``(height, width)`` of the model input for an original image of this size."""
        _, _, oh, ow = self.crop_offsets(height, width)
        return oh, ow

    def _crop(self, tensor: Tensor, height: int, width: int) -> Tensor:
        rh, rw = tensor.shape[-2:]
        top, left, oh, ow = self.crop_offsets(height, width)
        if (top, left, oh, ow) != (0, 0, rh, rw):
            pad = (max(0, -left), max(0, left + ow - rw), max(0, -top), max(0, top + oh - rh))
            if any(pad):
                tensor = F.pad(tensor, pad)
                top, left = top + pad[2], left + pad[0]
            tensor = tensor[:, top : top + oh, left : left + ow]
        return tensor

    def _geometry(self, tensor: Tensor, mode: str) -> Tensor:
        """Resize and crop a float tensor [C, H, W] (crop zero-pads when the image is smaller)."""
        height, width = tensor.shape[-2:]
        rh, rw = self.resized_shape(height, width)
        if (rh, rw) != (height, width):
            if mode == "nearest":
                tensor = F.interpolate(tensor[None], size=(rh, rw), mode="nearest-exact")[0]
            else:
                tensor = F.interpolate(
                    tensor[None], size=(rh, rw), mode=mode, align_corners=False, antialias=True
                )[0].clamp(0.0, 1.0)
        return self._crop(tensor, height, width)

    def _resize_uint8(self, rgb: np.ndarray) -> Tensor:
        """Resize and crop a uint8 image [H, W, 3] as the backend does; uint8 [3, h, w] back."""
        height, width = rgb.shape[:2]
        rh, rw = self.resized_shape(height, width)
        if (rh, rw) == (height, width):
            out = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)
        elif self.backend == "pil":
            from PIL import Image

            resample = getattr(Image.Resampling, self.interpolation.upper())
            out = torch.from_numpy(np.array(Image.fromarray(rgb).resize((rw, rh), resample))).permute(2, 0, 1)
        else:
            from torchvision.transforms.v2 import InterpolationMode
            from torchvision.transforms.v2 import functional as tvf

            mode = InterpolationMode.NEAREST_EXACT if self.interpolation == "nearest" else InterpolationMode(self.interpolation)
            out = tvf.resize(
                torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1), [rh, rw], interpolation=mode, antialias=True
            )
        return self._crop(out, height, width)

    def __call__(self, image: Any) -> tuple[Tensor, np.ndarray]:
        """``(x, shown)``: the model input [3, h, w] and the uint8 RGB image [h, w, 3] it shows.

        ``image`` is a PIL image (converted to RGB), a uint8 array [H, W, 3] or a uint8 tensor [3, H, W].
        """
        rgb = _as_rgb(image)
        if self.backend == "float":
            x01 = self._geometry(torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).float() / 255.0, self.interpolation)
            shown_t = (x01 * 255.0).round().to(torch.uint8)
            pixels = x01 * (self.scale * 255.0) if self.scale != 1.0 / 255.0 else x01
        else:
            shown_t = self._resize_uint8(rgb)
            pixels = shown_t.float() * self.scale
        x = (pixels - torch.tensor(self.mean).view(3, 1, 1)) / torch.tensor(self.std).view(3, 1, 1)
        return x, shown_t.permute(1, 2, 0).numpy()

    def batch(self, images: Sequence[Any]) -> Tensor:
        """Several images (each as :meth:`__call__` takes) -> a model batch [B, 3, h, w] (same output size needed)."""
        xs = [self(image)[0] for image in images]
        if len({tuple(x.shape) for x in xs}) > 1:
            raise InvalidInputError(
                f"the images give inputs of different sizes {sorted({tuple(x.shape[1:]) for x in xs})}; this "
                "preprocessing has no fixed output size: give a crop or a (height, width) size"
            )
        return torch.stack(xs)

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
        return {
            "size": self.size, "resize": self.resize, "crop": self.crop, "mean": self.mean, "std": self.std,
            "interpolation": self.interpolation, "backend": self.backend, "crop_rounding": self.crop_rounding,
            "scale": self.scale, "max_size": self.max_size, "origin": self.origin,
        }  # fmt: skip


def _as_rgb(image: Any) -> np.ndarray:
    """A PIL image, uint8 array [H, W, 3] or uint8 tensor [3, H, W] as a uint8 array [H, W, 3]."""
    if isinstance(image, Tensor):
        if image.dtype == torch.uint8 and image.dim() == 3 and image.shape[0] == 3:
            return image.detach().cpu().permute(1, 2, 0).numpy()
        got = f"a {image.dtype} tensor {list(image.shape)}"
    elif isinstance(image, np.ndarray):
        if image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3:
            return image if image.flags.writeable else image.copy()
        got = f"a {image.dtype} array {list(image.shape)}"
    elif hasattr(image, "convert") and hasattr(image, "mode"):  # a PIL image
        return np.array(image.convert("RGB"))
    else:
        got = type(image).__name__
    raise InvalidInputError(
        f"expected one image: a PIL image, a uint8 RGB array [H, W, 3] (see camkit.read_rgb) or a uint8 tensor "
        f"[3, H, W], got {got}; a float image in [0, 1] becomes uint8 with (img * 255).round() and a cast"
    )
