"""Which picture a figure draws, by the input's rank: a signal, an image, a volume or a video."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from ..errors import InvalidInputError
from .canvas import ExplanationFigure
from .signal import signal_figure
from .video import video_figure
from .volume import volume_figure

__all__ = ["KINDS", "rank_figure"]

KINDS = ("volume", "video")
"""What a 5-D input ``[B, C, D, H, W]`` is drawn as (``kind=`` of :func:`camkit.figure`)."""


def rank_figure(
    images: Tensor, explanations: Any, *, kind: str | None = None, sign: str | None = None,
    mean: Sequence[float] | None = None, std: Sequence[float] | None = None, colormap: str | None = None,
    alpha: float = 0.5, panel: float = 2.0, dpi: int = 100,
) -> ExplanationFigure:  # fmt: skip
    """The figure of a signal batch [B, C, T] or a volume or video batch [B, C, D, H, W].

    Signals get :func:`~camkit.viz.signal.signal_figure`; 5-D inputs get
    :func:`~camkit.viz.video.video_figure` when ``kind="video"`` and
    :func:`~camkit.viz.volume.volume_figure` when ``kind="volume"``; by default three channels
    are read as a video and any other count as a volume. Maps are drawn as they are, in [0, 1].

    Example:
        >>> import torch
        >>> from camkit.viz.ranks import rank_figure
        >>> rank_figure(torch.rand(1, 1, 6, 8, 8), torch.rand(1, 6, 8, 8), panel=1.0, dpi=40).columns
        ('axis 0', 'axis 1', 'axis 2')
    """
    if sign is not None:
        raise InvalidInputError(
            f"sign={sign!r}: signed views are drawn for images only; signals, volumes and videos are drawn from "
            "their maps in [0, 1] (leave sign out)"
        )
    cmap = colormap or "jet"
    if images.dim() == 3:
        if mean is not None or std is not None:
            raise InvalidInputError("mean and std undo an image normalisation; a signal is drawn as its values")
        return signal_figure(images, explanations, colormap=cmap, width=4.0 * panel, height=0.8 * panel, dpi=dpi)
    if images.dim() != 5:
        raise InvalidInputError(f"rank_figure draws [B, C, T] or [B, C, D, H, W], got {list(images.shape)}")
    chosen = kind or ("video" if images.shape[1] == 3 else "volume")
    if chosen not in KINDS:
        raise InvalidInputError(f"kind must be one of {KINDS} for a 5-D input, got {kind!r}")
    if chosen == "video":
        return video_figure(images, explanations, mean=mean, std=std, colormap=cmap, alpha=alpha, panel=panel, dpi=dpi)
    if mean is not None or std is not None:
        raise InvalidInputError("mean and std are for videos; a volume is shown with its intensities scaled to [0, 1]")
    return volume_figure(images, explanations, colormap=cmap, alpha=alpha, panel=panel, dpi=dpi)
