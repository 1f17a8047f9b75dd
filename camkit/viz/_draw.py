"""Pieces shared by the pictures of signals, volumes and videos: which maps, how shown, one colour scale."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import InvalidInputError
from ..functional.overlay import colorize, colormap_lut
from .canvas import matplotlib_parts

__all__ = ["add_colorbar", "as_maps", "bare", "colour", "unit_gray"]


def _one(label: str, value: Any, batch: int | None, shape: Sequence[int]) -> Tensor:
    maps = value.maps if hasattr(value, "maps") and not isinstance(value, Tensor) else value
    if not isinstance(maps, Tensor):
        raise InvalidInputError(f"{label!r} is a {type(value).__name__}: give a camkit.Explanation or maps as a tensor")
    maps = maps.detach().float().cpu()
    if batch is not None and maps.dim() == len(shape):
        maps = maps[None]
    if batch is None and maps.dim() == len(shape) + 1 and maps.shape[0] == 1:
        maps = maps[0]  # one item's explanation, [1, *shape]
    want = ([batch] if batch is not None else []) + list(shape)
    if list(maps.shape) != want:
        raise InvalidInputError(
            f"{label!r}: maps of shape {list(maps.shape)} do not fit the input; expected {want} "
            "(one map per item, at the input's size; for [B, K] targets explain one target per item)"
        )
    return maps


def as_maps(explanations: Any, batch: int | None, shape: Sequence[int]) -> dict[str, Tensor]:
    """``{label: maps [B, *shape]}`` (or ``[*shape]`` with ``batch=None``) from explanations or tensors.

    Accepts one :class:`~camkit.Explanation` (or any object with ``maps``), a tensor of maps,
    a sequence of them, or a ``{label: ...}`` mapping. Labels default to the method's name.
    """
    if isinstance(explanations, Mapping):
        items = list(explanations.items())
    elif isinstance(explanations, (list, tuple)):
        items = [(getattr(e, "method", f"map {i}"), e) for i, e in enumerate(explanations)]
    else:
        items = [(getattr(explanations, "method", "map"), explanations)]
    named: dict[str, Tensor] = {}
    for label, value in items:
        key = str(label) if str(label) not in named else f"{label} ({len(named)})"
        named[key] = _one(key, value, batch, shape)
    if not named:
        raise InvalidInputError("a figure needs at least one explanation or map")
    return named


def unit_gray(values: Tensor) -> Tensor:
    """Intensities scaled to [0, 1] over the whole tensor (one grey scale for every slice or frame)."""
    values = values.detach().float().cpu()
    low, high = values.min(), values.max()
    return (values - low) / (high - low) if bool(high > low) else torch.zeros_like(values)


def colour(maps: Tensor, colormap: str) -> np.ndarray:
    """Maps [..., H, W] in [0, 1] coloured: uint8 [..., H, W, 3] (values never renormalised)."""
    return colorize(maps, colormap).movedim(-3, -1).numpy()


def add_colorbar(fig: Any, cax: Any, colormap: str, fontsize: float, label: str = "map value") -> None:
    """A horizontal colorbar 0..1 of ``colormap`` in ``cax``: the one scale of every map panel."""
    _, _, ScalarMappable, ListedColormap, Normalize = matplotlib_parts()
    table = ListedColormap(colormap_lut(colormap).numpy() / 255.0)
    bar = fig.colorbar(ScalarMappable(norm=Normalize(0.0, 1.0), cmap=table), cax=cax, orientation="horizontal")
    bar.ax.tick_params(labelsize=fontsize)
    bar.set_label(label, fontsize=fontsize)


def bare(ax: Any, title: str, fontsize: float) -> None:
    """No ticks, a title."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=fontsize)
