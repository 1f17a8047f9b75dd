"""Figures for notebooks and papers: a batch as rows of image | map(s) | overlay(s).

matplotlib is used for the layout, titles and colorbars only; it is an optional dependency
(``pip install camkit[plot]``), imported when a figure is drawn. The colours themselves come
from camkit's own tables (:mod:`camkit.viz.colormaps`, OpenCV's), so a figure shows exactly what
:func:`camkit.overlay` and :func:`camkit.functional.attribution_view` return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from ..errors import InvalidInputError
from ..functional.overlay import colorize, colormap_lut, overlay_batch
from ..functional.views import DEFAULT_COLORMAP, blended_heat_map, heat_map, scale_attribution
from ..io import check_unit_range, denormalize
from .canvas import COLORBAR_INCHES, TITLE_INCHES, ExplanationFigure, matplotlib_parts
from .ranks import rank_figure

__all__ = ["Explained", "figure"]  # ExplanationFigure lives in camkit.viz.canvas (imported here too)


@runtime_checkable
class Explained(Protocol):
    """What a figure reads from an explanation: any object with these attributes is drawn.

    :class:`camkit.Explanation` is one; so is any result type with the same fields, which is
    why this module never imports :mod:`camkit.explanation`.

    Attributes:
        maps: [B, H, W] in [0, 1] at the images' size.
        raw: the unnormalised map; a pixel-space method's attributions [B, C, H, W] are drawn as views.
        target: class indices [B], or ``None``.
        scores: target scores [B].
        method: the method's name, the default column title.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> from camkit.viz.figures import Explained
        >>> isinstance(SimpleNamespace(maps=torch.zeros(1, 2, 2), raw=None, target=None, scores=torch.zeros(1),
        ...                            method="mine"), Explained)
        True
    """

    @property
    def maps(self) -> Tensor: ...

    @property
    def raw(self) -> Tensor | tuple[Tensor, ...]: ...

    @property
    def target(self) -> Tensor | None: ...

    @property
    def scores(self) -> Tensor: ...

    @property
    def method(self) -> str: ...

def _is_pixel_space(e: Explained) -> bool:
    """Raw values at the input's size (Saliency, IG, Guided Grad-CAM, Occlusion...), not a layer's CAM."""
    raw = e.raw
    return (
        isinstance(raw, Tensor)
        and raw.dim() in (3, 4)
        and raw.shape[0] == e.maps.shape[0]
        and tuple(raw.shape[-2:]) == tuple(e.maps.shape[-2:])
    )


def _images_float(images: Tensor, mean: Sequence[float] | None, std: Sequence[float] | None) -> Tensor:
    if not isinstance(images, Tensor) or images.dim() != 4 or images.shape[1] != 3:
        got = list(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise InvalidInputError(
            f"images must be a tensor [B, 3, H, W] (or signals [B, C, T], volumes or videos [B, C, D, H, W]), got {got}"
        )
    if (mean is None) != (std is None):
        raise InvalidInputError("give both mean and std (the values the images were normalised with), or neither")
    if images.dtype == torch.uint8:
        return images.float() / 255
    out = denormalize(images, mean, std) if mean is not None and std is not None else images.float()
    check_unit_range(out)
    return out


def figure(
    images: Tensor,
    explanations: Explained | Sequence[Explained] | Mapping[str, Explained],
    classes: Sequence[str] | None = None,
    sign: str | None = None,
    outlier_perc: float = 2.0,
    colormap: str | None = None,
    alpha: float = 0.5,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    panel: float = 2.0,
    dpi: int = 100,
    kind: str | None = None,
) -> ExplanationFigure:
    """Lay out a batch as rows of image | map per explanation | overlay per explanation.

    Each map panel is titled with the method, the target's class name and its score; every
    map column has a colorbar under it. CAM maps are drawn as they are (``maps`` in [0, 1],
    ``jet``); pixel-space attributions (``raw`` at the input's size: Saliency, Integrated
    Gradients, Guided Grad-CAM, Occlusion...) as their signed view (``sign="all"``, outliers clipped,
    diverging ``bwr``: red for evidence for the class, blue against) with a blended heat map as
    the overlay. Give ``sign`` to use one sign mode for every explanation.

    The figure is ``(1 + 2 * E) * panel`` inches wide and ``B * (panel + 0.5) + 0.7`` high
    (``E`` explanations, ``B`` images; 0.5 inch for the titles, 0.7 for the colorbars), at
    ``dpi`` pixels per inch.

    Other ranks are drawn by their own pictures (:func:`camkit.viz.ranks.rank_figure`): a
    signal batch [B, C, T] as waveforms with the map as colour beneath; a 5-D batch
    [B, C, D, H, W] as three orthogonal slices through the map's peak (a volume) or a strip of
    frames (a video: ``kind="video"``, the default for three channels), every map panel on one
    colour scale. ``sign``, ``classes`` and ``outlier_perc`` apply to images only.

    Args:
        images: the images explained, [B, 3, H, W]: float in [0, 1], uint8, or normalised
            (then give ``mean``/``std``, see :func:`camkit.denormalize`).
        explanations: one :class:`~camkit.Explanation`, several, or a ``{label: explanation}``
            mapping; each with one map per image ([B, H, W]).
        classes: class names, indexed by the explanations' targets.
        sign: ``None`` (as above) or a sign mode for all (see :func:`camkit.functional.scale_attribution`).
        outlier_perc: percent of each attribution's mass clipped as outliers.
        colormap: the map colormap (default ``jet`` for CAMs, ``bwr`` for signed views).
        alpha: the heat map's weight in the overlays.
        mean: per-channel mean the images were normalised with.
        std: per-channel standard deviation, with ``mean``.
        panel: a panel's side in inches.
        dpi: pixels per inch.
        kind: for a 5-D input, ``"volume"`` or ``"video"`` (default: video for three channels).

    Returns:
        An :class:`ExplanationFigure` (RGB pixels, panel boxes, titles; ``save(path)``).

    Raises:
        ImportError: matplotlib is not installed.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> x = torch.rand(3, 3, 16, 16)
        >>> both = {"Grad-CAM": camkit.GradCAM(net, "1").explain(x), "Saliency": camkit.Saliency(net).explain(x)}
        >>> fig = camkit.figure(x, both, classes=["cat", "dog"], panel=1.0, dpi=40)
        >>> fig.image.shape  # 3 rows of 1.5 inches + 0.7; 5 columns of 1 inch; at 40 dpi
        (208, 200, 3)
    """
    if isinstance(images, Tensor) and images.dim() in (3, 5):  # signals, volumes and videos
        return rank_figure(images, explanations, kind=kind, sign=sign, mean=mean, std=std, colormap=colormap,
                           alpha=alpha, panel=panel, dpi=dpi)  # fmt: skip
    parts = matplotlib_parts()
    named = _named(explanations)
    base = _images_float(images, mean, std)
    _check_maps(named, base.shape[0])
    drawn = {label: _coloured(e, base, sign, colormap, outlier_perc, alpha) for label, e in named.items()}
    return _lay_out(parts, base, named, drawn, classes, panel, dpi)


# Per explanation: coloured maps, overlays (uint8 [B, 3, H, W]), the colorbar's table and range.
_Drawn = tuple[Tensor, Tensor, str, tuple[float, float]]


def _named(explanations: Explained | Sequence[Explained] | Mapping[str, Explained]) -> dict[str, Explained]:
    """The explanations by column label: their methods, numbered where a method repeats."""
    if isinstance(explanations, Explained):
        named = {explanations.method: explanations}
    elif isinstance(explanations, Mapping):
        named = dict(explanations)
    else:
        named = {}
        for e in explanations:
            label = e.method if e.method not in named else f"{e.method} ({len(named)})"
            named[label] = e
    if not named:
        raise InvalidInputError("figure needs at least one explanation")
    return named


def _check_maps(named: Mapping[str, Explained], batch: int) -> None:
    for label, e in named.items():
        if not isinstance(e, Explained):
            raise InvalidInputError(
                f"{label!r} is a {type(e).__name__}, not a camkit.Explanation (nor an object with maps, raw, "
                "target, scores and method)"
            )
        if e.maps.dim() != 3 or e.maps.shape[0] != batch:
            raise InvalidInputError(
                f"{label!r}: figure draws one map per image, [B={batch}, H, W]; got maps of shape "
                f"{list(e.maps.shape)} (for [B, K] targets, explain one target per image)"
            )


def _coloured(
    e: Explained, base: Tensor, sign: str | None, colormap: str | None, outlier_perc: float, alpha: float
) -> _Drawn:
    """One explanation's coloured maps and overlays: a CAM as it is, pixel-space attributions as a signed view."""
    mode = sign if sign is not None else ("all" if _is_pixel_space(e) else None)
    if mode is None:
        cmap = colormap or "jet"
        maps = e.maps.detach().to(base.device)
        coloured = colorize(maps, cmap)
        over = overlay_batch(base, maps, alpha=alpha, colormap=cmap)
        low = 0.0
    else:
        cmap = colormap or DEFAULT_COLORMAP[mode]
        attr = (e.raw if _is_pixel_space(e) else e.maps).detach().to(base.device)  # type: ignore[union-attr]
        scale_attribution(attr, mode, outlier_perc)  # checks the sign mode early
        coloured = heat_map(attr, mode, outlier_perc, cmap)
        over = blended_heat_map(base, attr, mode, outlier_perc, cmap, alpha)
        low = -1.0 if mode == "all" else 0.0
    return coloured.cpu(), over.cpu(), cmap, (low, 1.0)


def _lay_out(
    parts: tuple[Any, ...],
    base: Tensor,
    named: Mapping[str, Explained],
    drawn: Mapping[str, _Drawn],
    classes: Sequence[str] | None,
    panel: float,
    dpi: int,
) -> ExplanationFigure:
    """The grid of panels, one row per image, with a colorbar under every map column, drawn to pixels."""
    Figure, Canvas, ScalarMappable, ListedColormap, Normalize = parts
    shown = (base * 255).round().clamp(0, 255).to(torch.uint8).cpu()
    batch = base.shape[0]
    columns = ["image"] + [f"map: {k}" for k in named] + [f"overlay: {k}" for k in named]
    width = len(columns) * panel
    height = batch * (panel + TITLE_INCHES) + COLORBAR_INCHES
    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    # One row per image, then a thin row holding the colorbars (so every panel row stays aligned).
    grid = fig.subplots(
        batch + 1, len(columns), squeeze=False, gridspec_kw={"height_ratios": [1.0] * batch + [0.08]}
    )
    axes, bars = grid[:batch], grid[batch]
    for cax in bars:
        cax.set_axis_off()
    fontsize = max(5.0, 4.0 * panel)
    titles = _draw_panels(axes, shown, named, drawn, columns, classes, fontsize)
    for label in named:
        index = columns.index(f"map: {label}")
        _, _, cmap, (low, high) = drawn[label]
        table = ListedColormap(colormap_lut(cmap).numpy() / 255.0)
        bars[index].set_axis_on()
        bar = fig.colorbar(
            ScalarMappable(norm=Normalize(low, high), cmap=table), cax=bars[index], orientation="horizontal"
        )
        bar.ax.tick_params(labelsize=fontsize)
    canvas = Canvas(fig)  # Agg: no display, whatever pyplot's backend is
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    panels = _panel_boxes(axes, columns, batch, rgba.shape[0])
    return ExplanationFigure(image=np.ascontiguousarray(rgba[:, :, :3]), columns=tuple(columns), panels=panels, titles=titles)


def _draw_panels(
    axes: Any,
    shown: Tensor,
    named: Mapping[str, Explained],
    drawn: Mapping[str, _Drawn],
    columns: list[str],
    classes: Sequence[str] | None,
    fontsize: float,
) -> dict[tuple[int, str], str]:
    """Every image, map and overlay in its panel, titled; the titles by (row, column)."""
    titles: dict[tuple[int, str], str] = {}
    for b in range(shown.shape[0]):
        size = f"{shown.shape[-2]}x{shown.shape[-1]}"
        cells: list[tuple[str, Tensor, str]] = [("image", shown[b], f"image {b}\n{size}")]
        for label, e in named.items():
            name = _class_name(e, b, classes)
            score = float(e.scores[b]) if e.scores.dim() == 1 else float("nan")
            cells.append((f"map: {label}", drawn[label][0][b], f"{label}\n{name}: {score:.3g}"))
            cells.append((f"overlay: {label}", drawn[label][1][b], f"{label}\noverlay"))
        cells.sort(key=lambda c: columns.index(c[0]))
        for c, (column, pixels, title) in enumerate(cells):
            ax = axes[b, c]
            ax.imshow(pixels.permute(1, 2, 0).numpy(), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(title, fontsize=fontsize)
            titles[(b, column)] = title
    return titles


def _panel_boxes(axes: Any, columns: list[str], batch: int, pixels_h: int) -> dict[tuple[int, str], tuple[int, int, int, int]]:
    """Each panel's box in the drawn figure's pixels: (left, top, right, bottom)."""
    panels: dict[tuple[int, str], tuple[int, int, int, int]] = {}
    for b in range(batch):
        for c, column in enumerate(columns):
            box = axes[b, c].get_window_extent()
            panels[(b, column)] = (
                int(np.ceil(box.x0)),
                int(np.ceil(pixels_h - box.y1)),
                int(np.floor(box.x1)),
                int(np.floor(pixels_h - box.y0)),
            )
    return panels


def _class_name(e: Explained, b: int, classes: Sequence[str] | None) -> str:
    if e.target is None or e.target.dim() != 1:
        return "target"
    index = int(e.target[b])
    if classes is not None and 0 <= index < len(classes):
        return str(classes[index])
    return f"class {index}"
