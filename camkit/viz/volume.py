"""Volumes for people: three orthogonal slices through the map's peak, and a montage of slices.

A volume ``[D, H, W]`` (CT, MRI; the axes in the order the model saw them) is shown in grey with
its intensities scaled to [0, 1] over the whole volume, so every slice shares one grey scale;
maps are drawn as they are (never renormalised per slice), so every panel shares one colour
scale, which the colorbar under the panels shows. Needs matplotlib (``pip install camkit[plot]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch import Tensor

from ..errors import InvalidInputError
from ._draw import add_colorbar, as_maps, bare, unit_gray
from .canvas import COLORBAR_INCHES, TITLE_INCHES, ExplanationFigure, matplotlib_parts, render
from .overlay import blend, peak_index

__all__ = ["PLANES", "montage_figure", "volume_figure"]

PLANES = ("axis 0", "axis 1", "axis 2")
"""The columns of :func:`volume_figure`: the slice across each axis (D, H, W) through one voxel."""


def _volumes(volume: Tensor) -> Tensor:
    """[D, H, W], [C, D, H, W] or [B, C, D, H, W] -> grey [B, D, H, W] in [0, 1] (channel 0, scaled per volume)."""
    if not isinstance(volume, Tensor) or volume.dim() not in (3, 4, 5):
        got = list(volume.shape) if isinstance(volume, Tensor) else type(volume).__name__
        raise InvalidInputError(f"a volume is [D, H, W], [C, D, H, W] or a batch [B, C, D, H, W]; got {got}")
    batch = volume if volume.dim() == 5 else (volume[None] if volume.dim() == 4 else volume[None, None])
    return unit_gray(batch[:, 0]) if batch.shape[0] == 1 else _per_item(batch[:, 0])


def _per_item(volumes: Tensor) -> Tensor:
    return volumes.new_tensor(np.stack([unit_gray(v).numpy() for v in volumes]))


def _aspects(spacing: Sequence[float] | None) -> tuple[float, float, float]:
    """imshow aspect (row spacing over column spacing) of the slices across axes 0, 1 and 2."""
    sd, sh, sw = (1.0, 1.0, 1.0) if spacing is None else (float(s) for s in spacing)
    return sh / sw, sd / sw, sd / sh


def _plane(values: Tensor, axis: int, index: int) -> Tensor:
    return values.select(-3 + axis, index)


def volume_figure(
    volume: Tensor,
    explanations: Any,
    *,
    at: Sequence[int] | None = None,
    spacing: Sequence[float] | None = None,
    colormap: str = "jet",
    alpha: float = 0.5,
    panel: float = 2.0,
    dpi: int = 100,
) -> ExplanationFigure:
    """Three orthogonal slices through each volume at its map's peak: the scan, then an overlay per map.

    Per volume, a row ``scan`` (grey) and one row per explanation (the map blended over the
    scan); columns :data:`PLANES`: the slice across axis 0 (an ``[H, W]`` picture), axis 1
    (``[D, W]``) and axis 2 (``[D, H]``), all through the voxel ``at`` (default: the peak of the
    first explanation's map), whose position each title gives. One colorbar (0 to 1) serves every
    map panel. The figure is ``3 * panel`` inches wide and ``rows * (panel + 0.5) + 0.7`` high.

    Args:
        volume: [D, H, W], [C, D, H, W] (channel 0 is shown) or a batch [B, C, D, H, W].
        explanations: an :class:`~camkit.Explanation` (maps [B, D, H, W]), a tensor of maps,
            several in a sequence, or a ``{label: ...}`` mapping.
        at: the voxel ``(d, h, w)`` the slices go through, for every volume.
        spacing: voxel sizes ``(sd, sh, sw)`` (e.g. a NIfTI file's zooms) so slices keep their proportions.
        colormap, alpha: the maps' colour table and weight in the blend.
        panel, dpi: a panel's side in inches, pixels per inch.

    Example:
        >>> import torch
        >>> from camkit.viz.volume import volume_figure
        >>> maps = torch.zeros(1, 8, 8, 8); maps[0, 2, 5, 6] = 1.0
        >>> fig = volume_figure(torch.rand(1, 8, 8, 8), maps, panel=1.0, dpi=40)
        >>> fig.columns, fig.titles[(1, "axis 1")].splitlines()[1]
        (('axis 0', 'axis 1', 'axis 2'), 'H=5 of 8')
    """
    Figure, *_ = matplotlib_parts()
    gray = _volumes(volume)
    batch, shape = gray.shape[0], tuple(gray.shape[1:])
    named = as_maps(explanations, batch, shape)
    first = next(iter(named.values()))
    if at is not None and (len(at) != 3 or not all(0 <= int(i) < s for i, s in zip(at, shape, strict=False))):
        raise InvalidInputError(f"at={list(at)} is not a voxel (d, h, w) of a volume {list(shape)}")
    rows = batch * (1 + len(named))
    fig = Figure(figsize=(3 * panel, rows * (panel + TITLE_INCHES) + COLORBAR_INCHES), dpi=dpi, layout="constrained")
    grid = fig.subplots(rows + 1, 3, squeeze=False, gridspec_kw={"height_ratios": [1.0] * rows + [0.08]})
    fontsize = max(5.0, 4.0 * panel)
    aspects = _aspects(spacing)
    axes: dict[tuple[int, str], Any] = {}
    titles: dict[tuple[int, str], str] = {}
    for b in range(batch):
        voxel = tuple(int(i) for i in at) if at is not None else peak_index(first[b])
        where = "peak of " + next(iter(named)) if at is None else "at"
        top = b * (1 + len(named))
        for r, (label, maps) in enumerate([("scan", None), *named.items()]):
            for axis, column in enumerate(PLANES):
                image = _plane(gray[b], axis, voxel[axis])
                pixels = (
                    blend(image[None], _plane(maps[b], axis, voxel[axis])[None], alpha, colormap)[0]
                    if maps is not None
                    else (image[..., None].expand(-1, -1, 3) * 255).round().byte().numpy()
                )
                ax = grid[top + r, axis]
                ax.imshow(pixels, interpolation="nearest", aspect=aspects[axis])
                name = f"{'DHW'[axis]}={voxel[axis]} of {shape[axis]}"
                title = f"{label} {b}" if maps is None else f"{label}"
                title = f"{title}\n{name}" + (f"\n({where} {list(voxel)})" if r == 0 and axis == 0 else "")
                bare(ax, title, fontsize)
                axes[(top + r, column)], titles[(top + r, column)] = ax, title
    for cax in grid[rows]:
        cax.set_axis_off()
    grid[rows, 1].set_axis_on()
    add_colorbar(fig, grid[rows, 1], colormap, fontsize)
    return render(fig, axes, PLANES, titles)


def montage_figure(
    volume: Tensor,
    maps: Any,
    *,
    axis: int = 0,
    count: int = 12,
    columns: int = 6,
    spacing: Sequence[float] | None = None,
    colormap: str = "jet",
    alpha: float = 0.5,
    panel: float = 1.5,
    dpi: int = 100,
) -> ExplanationFigure:
    """A montage of one volume's slices across ``axis`` with its map blended over them, on one colour scale.

    ``count`` slices, evenly spaced from the first to the last (fewer when the axis is shorter),
    fill rows of ``columns`` panels; each is titled with its index. One colorbar (0 to 1) serves
    every panel: a slice's colours are the map's own values, never rescaled per slice. Panel
    keys are ``(row, "slice N")``.

    Args:
        volume: one volume [D, H, W] or [C, D, H, W] (channel 0 is shown).
        maps: its map [D, H, W] in [0, 1] (a tensor, or an :class:`~camkit.Explanation` of one volume).
        axis: 0, 1 or 2: the axis the slices cut across.
        count, columns: how many slices, and how many per row.
        spacing, colormap, alpha, panel, dpi: as in :func:`volume_figure`.

    Example:
        >>> import torch
        >>> from camkit.viz.volume import montage_figure
        >>> fig = montage_figure(torch.rand(10, 8, 8), torch.rand(10, 8, 8), count=4, columns=2, panel=1.0, dpi=40)
        >>> fig.columns
        ('slice 0', 'slice 3', 'slice 6', 'slice 9')
    """
    Figure, *_ = matplotlib_parts()
    if isinstance(volume, Tensor) and volume.dim() == 5:
        raise InvalidInputError("montage_figure draws one volume [D, H, W] or [C, D, H, W]; pick one: volume[b]")
    gray = _volumes(volume)[0]
    if axis not in (0, 1, 2):
        raise InvalidInputError(f"axis must be 0, 1 or 2 (D, H or W), got {axis}")
    named = as_maps(maps, None, tuple(gray.shape))
    if len(named) != 1:
        raise InvalidInputError(f"a montage shows one map, got {len(named)}: {list(named)}")
    label, heat = next(iter(named.items()))
    length = gray.shape[axis]
    picks = sorted({round(v) for v in np.linspace(0, length - 1, max(1, min(count, length)))})
    ncols = max(1, min(columns, len(picks)))
    nrows = -(-len(picks) // ncols)
    images = gray.movedim(axis, 0)[picks]
    drawn = blend(images, heat.movedim(axis, 0)[picks], alpha, colormap)
    aspect = _aspects(spacing)[axis]
    tall = panel * min(2.0, images.shape[1] * aspect / images.shape[2])  # a row as high as its slices
    fig = Figure(figsize=(ncols * panel, nrows * (tall + TITLE_INCHES) + COLORBAR_INCHES), dpi=dpi,
                 layout="constrained")  # fmt: skip
    grid = fig.subplots(nrows + 1, ncols, squeeze=False, gridspec_kw={"height_ratios": [1.0] * nrows + [0.08]})
    fontsize = max(5.0, 4.0 * panel)
    axes: dict[tuple[int, str], Any] = {}
    titles: dict[tuple[int, str], str] = {}
    names = tuple(f"slice {i}" for i in picks)
    for n, index in enumerate(picks):
        ax = grid[n // ncols, n % ncols]
        ax.imshow(drawn[n], interpolation="nearest", aspect=aspect)
        title = f"{label}: {'DHW'[axis]}={index}"
        bare(ax, title, fontsize)
        axes[(n // ncols, names[n])], titles[(n // ncols, names[n])] = ax, title
    for n in range(len(picks), nrows * ncols):
        grid[n // ncols, n % ncols].set_axis_off()
    for cax in grid[nrows]:
        cax.set_axis_off()
    grid[nrows, ncols // 2].set_axis_on()
    add_colorbar(fig, grid[nrows, ncols // 2], colormap, fontsize)
    return render(fig, axes, names, titles)
