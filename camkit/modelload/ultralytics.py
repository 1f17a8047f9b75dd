"""``ultralytics:PATH.pt``: a YOLO checkpoint and ultralytics' own letterbox preprocessing.

A checkpoint is a pickle (loading it runs code from the file), so it needs ``trust_pickle``
(``--trust-pickle``). The model is ultralytics' ``nn.Module`` (``YOLO(path).model``); its
inputs are letterboxed as ultralytics' ``predict`` does: resized keeping the aspect ratio so
that the longer side is the checkpoint's ``imgsz`` (or ``size``), padded with grey (114) to a
multiple of the model's stride, centred, in [0, 1] without normalisation. :class:`Letterbox`
reads its geometry from ultralytics' own ``LetterBox`` and takes maps and boxes back to the
image.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InvalidInputError, ModelLoadError
from .files import first_line
from .preprocess import Preprocess

__all__ = ["Letterbox", "load_ultralytics"]


@dataclass(frozen=True)
class Letterbox(Preprocess):
    """Ultralytics' letterbox: resize keeping the aspect ratio, pad to a multiple of ``stride``, centred.

    ``size`` is ``(imgsz, imgsz)``; the image's longer side becomes ``imgsz`` and the other
    side is padded up to the next multiple of ``stride`` (grey 114), as ``predict`` does for
    PyTorch models. The input is in [0, 1] (``mean`` 0, ``std`` 1).

    Example:
        >>> import numpy as np, torch
        >>> from camkit.modelload.ultralytics import Letterbox
        >>> box = Letterbox(size=(64, 64))
        >>> x, shown = box(np.zeros((30, 60, 3), np.uint8))   # 60 wide -> 64 wide, 32 high, no padding
        >>> tuple(x.shape), box.window(30, 60)
        ((3, 32, 64), (0, 0, 32, 64))
        >>> box.invert_map(torch.ones(32, 64), 30, 60)[0].shape
        torch.Size([30, 60])
    """

    stride: int = 32
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)

    def _letterbox(self) -> Any:
        from ultralytics.data.augment import LetterBox

        return LetterBox(new_shape=self.size or (640, 640), auto=True, stride=int(self.stride))

    def window(self, height: int, width: int) -> tuple[int, int, int, int]:
        """``(top, left, resized_h, resized_w)``: where the image lies in the letterboxed input."""
        params = self._letterbox().get_params({"img": np.empty((height, width, 1), np.uint8)})
        new_w, new_h = params["new_unpad"]
        return int(params["top"]), int(params["left"]), int(new_h), int(new_w)

    def output_shape(self, height: int, width: int) -> tuple[int, int]:
        top, left, new_h, new_w = self.window(height, width)
        params = self._letterbox().get_params({"img": np.empty((height, width, 1), np.uint8)})
        return new_h + top + int(params["bottom"]), new_w + left + int(params["right"])

    def __call__(self, rgb: np.ndarray) -> tuple[Tensor, np.ndarray]:
        if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            got = f"{rgb.dtype} {list(rgb.shape)}" if isinstance(rgb, np.ndarray) else type(rgb).__name__
            raise InvalidInputError(f"expected a uint8 RGB image [H, W, 3] (see camkit.read_rgb), got {got}")
        shown = np.ascontiguousarray(self._letterbox()(image=np.ascontiguousarray(rgb)))
        return torch.from_numpy(shown).permute(2, 0, 1).float() / 255.0, shown

    def transform_boxes(self, boxes: np.ndarray, height: int, width: int) -> np.ndarray:
        """Boxes [N, 4] in the image's pixels -> the letterboxed input's pixels."""
        top, left, new_h, new_w = self.window(height, width)
        scale = np.array([new_w / width, new_h / height] * 2)
        return np.asarray(boxes, dtype=np.float64) * scale + np.array([left, top, left, top], dtype=np.float64)

    def inverse_boxes(self, boxes: np.ndarray, height: int, width: int) -> np.ndarray:
        """Boxes [N, 4] in the letterboxed input's pixels -> the image's pixels (clipped to it)."""
        top, left, new_h, new_w = self.window(height, width)
        scale = np.array([width / new_w, height / new_h] * 2)
        out = (np.asarray(boxes, dtype=np.float64) - np.array([left, top, left, top])) * scale
        return np.clip(out, 0, np.array([width, height, width, height], dtype=np.float64))

    def transform_mask(self, mask: np.ndarray) -> Tensor:
        raise InvalidInputError("region masks are not supported with ultralytics' letterbox; use boxes")

    def invert_map(self, heat: Tensor, height: int, width: int) -> tuple[Tensor, Tensor]:
        """A map on the letterboxed input -> the image: the padding is cut off, the rest resized (bilinear)."""
        top, left, new_h, new_w = self.window(height, width)
        crop = heat.float()[top : top + new_h, left : left + new_w]
        if tuple(crop.shape) != (new_h, new_w):
            raise InvalidInputError(f"the map is {list(heat.shape)}; the letterboxed input holds the image at {[new_h, new_w]}")
        full = F.interpolate(crop[None, None], size=(height, width), mode="bilinear", align_corners=False)[0, 0]
        return full, torch.ones(height, width, dtype=torch.bool, device=heat.device)

    def describe(self) -> dict[str, Any]:
        return {"letterbox": self.size, "stride": self.stride, "mean": self.mean, "std": self.std}


def load_ultralytics(
    path: str,
    trust_pickle: bool,
    size: int | Sequence[int] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> tuple[nn.Module, Letterbox, list[str] | None, list[str]]:
    """``(model, letterbox, class names, notes)`` from an ultralytics checkpoint (``ultralytics:PATH.pt``).

    ``size``: the letterbox's side (the longer side of the image), default the checkpoint's
    ``imgsz`` (else 640); ``(h, w)`` uses the larger. ``mean``/``std`` are refused: YOLO
    models take [0, 1] inputs.

    Raises:
        ModelLoadError: without ``trust_pickle``, for a missing file, when ultralytics is not
            installed or cannot read the file, or with ``mean``/``std``.
    """
    if mean is not None or std is not None:
        raise ModelLoadError("--model ultralytics:...: YOLO models take [0, 1] inputs; drop --mean and --std")
    if size is not None and not isinstance(size, int):
        size = max(int(s) for s in size)
    file = Path(path)
    if not file.is_file():
        raise ModelLoadError(f"--model ultralytics:{path}: no such file (a YOLO checkpoint .pt)")
    if not trust_pickle:
        raise ModelLoadError(
            f"--model ultralytics:{path} is a pickle: loading it runs code from the file. Pass --trust-pickle "
            "(trust_pickle=True) if you trust it."
        )
    try:
        os.environ.setdefault("YOLO_OFFLINE", "1")  # never reach the network for a local file
        from ultralytics import YOLO
    except ImportError:
        raise ModelLoadError("--model ultralytics:... needs the ultralytics package (pip install ultralytics)") from None
    try:
        model = YOLO(str(file)).model
    except Exception as err:  # ultralytics raises many kinds; the message says which file
        raise ModelLoadError(f"--model ultralytics:{path}: ultralytics could not load it: {first_line(err)}") from None
    if not isinstance(model, nn.Module):
        raise ModelLoadError(f"--model ultralytics:{path}: the checkpoint holds no model")
    model = model.float().eval()
    args = getattr(model, "args", None)
    imgsz = size or (args.get("imgsz") if isinstance(args, dict) else None) or 640
    imgsz = int(imgsz[0] if isinstance(imgsz, (list, tuple)) else imgsz)
    stride = int(torch.as_tensor(getattr(model, "stride", torch.tensor([32.0]))).max())
    names = getattr(model, "names", None)
    categories = [str(names[i]) for i in sorted(names)] if isinstance(names, dict) else None
    notes = [f"ultralytics {type(model).__name__}, letterboxed to {imgsz} (stride {stride}) as ultralytics' predict does"]
    return model, Letterbox(size=(imgsz, imgsz), stride=stride), categories, notes
