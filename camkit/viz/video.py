"""Videos for people: a strip of frames with their overlays, and the overlaid clip as a GIF or MP4.

A clip is ``[3, T, H, W]`` (camkit's layout, one item of ``[B, 3, T, H, W]``: float in [0, 1],
uint8, or normalised with ``mean``/``std``) or uint8 RGB frames ``[T, H, W, 3]`` as
:func:`camkit.media.read_video` returns them. Maps ``[T, H, W]`` in [0, 1] are drawn as they are,
so every frame shares one colour scale. The strip needs matplotlib (``pip install camkit[plot]``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import InvalidInputError
from ..media.video import write_video
from ._draw import add_colorbar, as_maps, bare
from .canvas import COLORBAR_INCHES, TITLE_INCHES, ExplanationFigure, matplotlib_parts, render
from .overlay import blend

__all__ = ["frame_curve_figure", "overlay_frames", "save_animation", "video_figure"]


def _clips(video: Any, mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> Tensor:
    """Frames as float RGB [B, T, 3, H, W] in [0, 1] from [3, T, H, W], [B, 3, T, H, W] or uint8 [T, H, W, 3]."""
    if isinstance(video, np.ndarray):
        if video.dtype != np.uint8 or video.ndim != 4 or video.shape[3] != 3:
            raise InvalidInputError(f"frames as an array are uint8 RGB [T, H, W, 3], got {video.dtype} {list(video.shape)}")
        return torch.from_numpy(np.ascontiguousarray(video)).permute(0, 3, 1, 2)[None].float() / 255
    if not isinstance(video, Tensor) or video.dim() not in (4, 5) or video.shape[-4] != 3:
        got = list(video.shape) if isinstance(video, Tensor) else type(video).__name__
        raise InvalidInputError(f"a clip is [3, T, H, W], a batch [B, 3, T, H, W] or uint8 frames [T, H, W, 3]; got {got}")
    clips = (video if video.dim() == 5 else video[None]).detach().cpu()
    if (mean is None) != (std is None):
        raise InvalidInputError("give both mean and std (the values the clip was normalised with), or neither")
    if clips.dtype == torch.uint8:
        clips = clips.float() / 255
    elif mean is not None and std is not None:
        clips = clips.float() * torch.tensor(std).view(1, 3, 1, 1, 1) + torch.tensor(mean).view(1, 3, 1, 1, 1)
    clips = clips.float()
    if bool(clips.min() < -1e-3) or bool(clips.max() > 1 + 1e-3):
        raise InvalidInputError(
            "the clip has values outside [0, 1]: it looks normalised; pass mean= and std= (the values it was "
            "normalised with) so it is shown as it looked"
        )
    return clips.clamp(0, 1).transpose(1, 2)


def overlay_frames(video: Any, maps: Tensor, alpha: float = 0.5, colormap: str = "jet") -> np.ndarray:
    """Each frame with its map blended over it: uint8 RGB [T, H, W, 3].

    Args:
        video: one clip [3, T, H, W] (float in [0, 1] or uint8) or uint8 frames [T, H, W, 3].
        maps: [T, H, W] in [0, 1] (an explanation's ``maps[b]``); resized to the frames' size
            (bilinear) when they differ.
        alpha, colormap: the map's weight and colour table, as :func:`camkit.overlay`.

    Example:
        >>> import torch
        >>> from camkit.viz.video import overlay_frames
        >>> frames = overlay_frames(torch.zeros(3, 4, 8, 8), torch.ones(4, 8, 8))
        >>> frames.shape, frames[0, 0, 0].tolist()  # half of jet's dark red over black
        ((4, 8, 8, 3), [64, 0, 0])
    """
    clips = _clips(video)
    if clips.shape[0] != 1:
        raise InvalidInputError("overlay_frames draws one clip; pick one: video[b]")
    frames = clips[0]
    heat = maps.detach().float().cpu() if isinstance(maps, Tensor) else torch.as_tensor(maps, dtype=torch.float32)
    if heat.dim() != 3 or heat.shape[0] != frames.shape[0]:
        raise InvalidInputError(f"maps must be [T={frames.shape[0]}, H, W] for this clip, got {list(heat.shape)}")
    return blend(frames, heat, alpha, colormap)


def save_animation(
    path: str | os.PathLike[str], video: Any, maps: Tensor, fps: float = 8.0, alpha: float = 0.5,
    colormap: str = "jet",
) -> np.ndarray:  # fmt: skip
    """Write the overlaid clip (:func:`overlay_frames`) as an animated GIF, an MP4 or an AVI; returns its frames.

    The file type follows ``path``'s ending (see :func:`camkit.media.write_video`).

    Example:
        >>> import os, tempfile, torch
        >>> from camkit.media import read_video
        >>> from camkit.viz.video import save_animation
        >>> path = os.path.join(tempfile.mkdtemp(), "clip.gif")
        >>> drawn = save_animation(path, torch.rand(3, 6, 16, 16), torch.rand(6, 16, 16), fps=4)
        >>> read_video(path).frames.shape, read_video(path).fps
        ((6, 16, 16, 3), 4.0)
    """
    frames = overlay_frames(video, maps, alpha, colormap)
    write_video(path, frames, fps)
    return frames


def video_figure(
    video: Any,
    explanations: Any,
    *,
    count: int = 8,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    colormap: str = "jet",
    alpha: float = 0.5,
    panel: float = 1.5,
    dpi: int = 100,
) -> ExplanationFigure:
    """A strip of frames per clip: the frames, then a row of overlays per explanation, on one colour scale.

    ``count`` frames evenly spaced from the first to the last (all of them when the clip is
    shorter). Each overlay is titled with the frame's share of that map (its mass in the frame
    over the whole clip's, as :attr:`camkit.Explanation.frame_share`): which moments mattered.
    One colorbar (0 to 1) serves every overlay. Columns are ``"frame t"``.

    Args:
        video: a clip [3, T, H, W], a batch [B, 3, T, H, W] (float in [0, 1], uint8, or
            normalised: give ``mean``/``std``), or uint8 frames [T, H, W, 3].
        explanations: an :class:`~camkit.Explanation` (maps [B, T, H, W]), a tensor of maps,
            several in a sequence, or a ``{label: ...}`` mapping.
        count: frames shown per clip.
        mean, std: per-channel values the clip was normalised with.
        colormap, alpha, panel, dpi: as in :func:`camkit.figure`.

    Example:
        >>> import torch
        >>> from camkit.viz.video import video_figure
        >>> fig = video_figure(torch.rand(3, 10, 8, 8), torch.rand(10, 8, 8), count=4, panel=1.0, dpi=40)
        >>> fig.columns, sorted({row for row, _ in fig.panels})
        (('frame 0', 'frame 3', 'frame 6', 'frame 9'), [0, 1])
    """
    Figure, *_ = matplotlib_parts()
    clips = _clips(video, mean, std)
    batch, frames = clips.shape[0], clips.shape[1]
    single = not (isinstance(video, Tensor) and video.dim() == 5)
    named = as_maps(explanations, None if single else batch, tuple(clips.shape[1:2]) + tuple(clips.shape[3:]))
    if single:
        named = {k: v[None] for k, v in named.items()}
    picks = sorted({round(v) for v in np.linspace(0, frames - 1, max(1, min(count, frames)))})
    columns = tuple(f"frame {t}" for t in picks)
    rows = batch * (1 + len(named))
    tall = panel * min(2.0, clips.shape[-2] / clips.shape[-1])
    fig = Figure(figsize=(len(picks) * panel, rows * (tall + TITLE_INCHES) + COLORBAR_INCHES), dpi=dpi,
                 layout="constrained")  # fmt: skip
    grid = fig.subplots(rows + 1, len(picks), squeeze=False, gridspec_kw={"height_ratios": [1.0] * rows + [0.08]})
    fontsize = max(5.0, 4.0 * panel)
    axes: dict[tuple[int, str], Any] = {}
    titles: dict[tuple[int, str], str] = {}
    for b in range(batch):
        top = b * (1 + len(named))
        shown = (clips[b, picks] * 255).round().byte().permute(0, 2, 3, 1).numpy()
        for c, t in enumerate(picks):
            title = f"clip {b}\nframe {t} of {frames}"
            grid[top, c].imshow(shown[c], interpolation="nearest")
            bare(grid[top, c], title, fontsize)
            axes[(top, columns[c])], titles[(top, columns[c])] = grid[top, c], title
        for r, (label, maps) in enumerate(named.items(), start=1):
            per_frame = maps[b].sum(dim=(-2, -1))
            share = per_frame / per_frame.sum() if bool(per_frame.sum() > 0) else torch.zeros_like(per_frame)
            drawn = blend(clips[b, picks], maps[b, picks], alpha, colormap)
            for c, t in enumerate(picks):
                title = f"{label}\nshare {float(share[t]):.2f}"
                grid[top + r, c].imshow(drawn[c], interpolation="nearest")
                bare(grid[top + r, c], title, fontsize)
                axes[(top + r, columns[c])], titles[(top + r, columns[c])] = grid[top + r, c], title
    for cax in grid[rows]:
        cax.set_axis_off()
    middle = len(picks) // 2
    grid[rows, middle].set_axis_on()
    add_colorbar(fig, grid[rows, middle], colormap, fontsize)
    return render(fig, axes, columns, titles)


def frame_curve_figure(
    share: Any, fps: float | None = None, *, label: str = "map", width: float = 6.0, height: float = 2.0,
    dpi: int = 100,
) -> ExplanationFigure:  # fmt: skip
    """Each frame's share of the map as a curve (:attr:`camkit.Explanation.frame_share`): when the evidence lies.

    One panel, key ``(0, "curve")``: the share of frame ``t`` at ``t / fps`` seconds (or at
    frame ``t`` without ``fps``), one marker per frame; the shares sum to 1.

    Example:
        >>> import torch
        >>> from camkit.viz.video import frame_curve_figure
        >>> fig = frame_curve_figure(torch.tensor([0.1, 0.2, 0.7]), fps=25.0, width=3, height=1, dpi=40)
        >>> fig.columns, fig.image.shape
        (('curve',), (40, 120, 3))
    """
    Figure, *_ = matplotlib_parts()
    values = share.detach().float().cpu().numpy() if isinstance(share, Tensor) else np.asarray(share, np.float64)
    if values.ndim != 1 or values.size == 0:
        raise InvalidInputError(f"frame_curve_figure takes one share per frame [T], got shape {list(values.shape)}")
    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    ax = fig.subplots()
    time = np.arange(values.size) / fps if fps else np.arange(values.size)
    ax.plot(time, values, marker="o", markersize=3, linewidth=1.2, label=label)
    ax.set_xlabel("seconds" if fps else "frame", fontsize=8)
    ax.set_ylabel("share of the map", fontsize=8)
    ax.set_ylim(0, max(float(values.max()) * 1.1, 1e-6))
    ax.tick_params(labelsize=7)
    title = f"{label}: each frame's share"
    ax.set_title(title, fontsize=8)
    return render(fig, {(0, "curve"): ax}, ("curve",), {(0, "curve"): title})
