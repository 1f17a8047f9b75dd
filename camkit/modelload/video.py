"""Video preprocessing: the model's own preset (torchvision's video weights) or the size and statistics given.

torchvision's video classifiers (``r3d_18``, ``mc3_18``, ``r2plus1d_18``, ``s3d``, ``mvit_v1_b``,
``swin3d_t``...) come with ``VideoClassification`` transforms: resize every frame (bilinear, no
antialiasing), centre-crop, scale to [0, 1], normalise per channel, and put frames ``[T, C, H, W]``
into the model's layout ``[C, T, H, W]``. :class:`VideoPreprocess` does the same steps with the
same torchvision functions, so a clip reaches the model as it would through the weights' own
transforms; :func:`video_preprocess` reads them from the weights' name (nothing is downloaded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import InvalidInputError, ModelLoadError
from ..io import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["VideoPreprocess", "video_preprocess"]


@dataclass(frozen=True)
class VideoPreprocess:
    """Frames to a model's clip: resize, centre crop, scale to [0, 1], normalise, ``[3, T, H, W]``.

    ``resize`` is ``(height, width)`` (every frame resized to exactly this), ``(side,)`` (the
    shorter side to this, keeping the aspect ratio) or ``None`` (frames keep their size);
    ``crop`` is ``(height, width)`` or ``None``.

    Example:
        >>> import numpy as np
        >>> from camkit.modelload.video import VideoPreprocess
        >>> p = VideoPreprocess(resize=(8, 10), crop=(6, 6), mean=(0.5,) * 3, std=(0.5,) * 3)
        >>> x, shown = p(np.full((4, 16, 20, 3), 255, np.uint8))
        >>> tuple(x.shape), shown.shape, float(x.max())
        ((3, 4, 6, 6), (4, 6, 6, 3), 1.0)
    """

    resize: tuple[int, ...] | None = None
    crop: tuple[int, int] | None = None
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    source: str = "default"

    def __call__(self, frames: np.ndarray) -> tuple[Tensor, np.ndarray]:
        """``(x, shown)``: the clip [3, T, h, w] for the model and the uint8 frames [T, h, w, 3] it shows."""
        import torchvision.transforms.functional as TF  # the functions VideoClassification itself calls

        if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
            got = f"{frames.dtype} {list(frames.shape)}" if isinstance(frames, np.ndarray) else type(frames).__name__
            raise InvalidInputError(f"expected uint8 RGB frames [T, H, W, 3] (see camkit.media.read_video), got {got}")
        video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)  # [T, C, H, W] uint8
        if self.resize is not None:
            video = TF.resize(video, list(self.resize), antialias=False)
        if self.crop is not None:
            video = TF.center_crop(video, list(self.crop))
        shown = video.permute(0, 2, 3, 1).contiguous().numpy()
        x = TF.normalize(video.float() / 255.0, mean=list(self.mean), std=list(self.std))
        return x.permute(1, 0, 2, 3).contiguous(), shown

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly description (for manifests)."""
        return {"resize": self.resize, "crop": self.crop, "mean": self.mean, "std": self.std, "source": self.source}


def _from_weights(name: str, weights: str) -> VideoPreprocess | None:
    import torchvision

    try:
        enum = torchvision.models.get_model_weights(name)
        chosen = enum[weights]
    except (ValueError, KeyError):
        return None
    transform = chosen.transforms()
    resize, crop = getattr(transform, "resize_size", None), getattr(transform, "crop_size", None)
    mean, std = getattr(transform, "mean", None), getattr(transform, "std", None)
    if type(transform).__name__ != "VideoClassification" or not crop or mean is None or std is None:
        return None
    return VideoPreprocess(
        resize=tuple(int(r) for r in resize) if resize else None, crop=(int(crop[0]), int(crop[-1])),
        mean=tuple(float(m) for m in mean), std=tuple(float(s) for s in std),
        source=f"torchvision {name} {weights} transforms",
    )  # fmt: skip


def video_preprocess(
    spec: str | nn.Module,
    weights: str | None = None,
    *,
    size: Sequence[int] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> VideoPreprocess:
    """The preprocessing of a video model: its weights' preset, overridden by what is given.

    For ``torchvision:NAME`` with a weights name, the weights' ``VideoClassification`` transforms
    (e.g. r3d_18's Kinetics-400 weights: resize to 128x171, crop 112x112, Kinetics statistics).
    ``size`` (``(height, width)``) replaces the resize and drops the crop; ``mean``/``std``
    replace the statistics. Otherwise frames keep their size and are normalised with ImageNet's
    statistics.

    Example:
        >>> from camkit.modelload.video import video_preprocess
        >>> p = video_preprocess("torchvision:r3d_18", "KINETICS400_V1")
        >>> p.resize, p.crop, p.mean
        ((128, 171), (112, 112), (0.43216, 0.394666, 0.37645))
    """
    base = VideoPreprocess()
    if isinstance(spec, str) and spec.startswith("torchvision:") and weights is not None:
        base = _from_weights(spec.split(":", 1)[1], weights) or base
    if size is not None:
        hw = tuple(int(s) for s in size)
        if len(hw) != 2 or min(hw) < 1:
            raise ModelLoadError(f"--size for videos is N or HxW (every frame resized to it), got {list(size)}")
        base = VideoPreprocess(resize=hw, crop=None, mean=base.mean, std=base.std, source="--size")
    if (mean is None) != (std is None):
        raise ModelLoadError("give both --mean and --std, or neither")
    if mean is not None and std is not None:
        base = VideoPreprocess(base.resize, base.crop, tuple(float(m) for m in mean), tuple(float(s) for s in std),
                               f"{base.source}, --mean/--std")  # fmt: skip
    return base
