"""``feature_grid``: a layer's channels for one input, tiled into one image ready to save as PNG."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from .features import extract_features

__all__ = ["FeatureGrid", "feature_grid", "tile_maps"]


class FeatureGrid(NamedTuple):
    """What :func:`feature_grid` returns.

    Attributes:
        image: uint8 RGB [H, W, 3] (grey tiles); ``camkit.save_png(path, grid.image)`` writes it.
        channels: the channel shown in each tile, row by row.
        columns: tiles per row.
        tile: ``(height, width)`` of one tile in pixels.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> from camkit.debug import feature_grid
        >>> net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU())
        >>> grid = feature_grid(net, torch.rand(1, 3, 8, 8), "1", n=4, columns=2, scale=1)
        >>> grid.channels, grid.columns, grid.tile, grid.image.shape
        ([0, 1, 2, 3], 2, (8, 8), (19, 19, 3))
    """

    image: np.ndarray
    channels: list[int]
    columns: int
    tile: tuple[int, int]


def tile_maps(
    maps: Tensor,
    *,
    columns: int | None = None,
    padding: int = 1,
    pad_value: int = 255,
    normalize: str = "each",
    scale: int = 1,
) -> Tensor:
    """Tile N maps [N, h, w] into one uint8 image [H, W], row by row.

    Tile ``i`` sits in row ``i // columns`` and column ``i % columns``, its top-left pixel at
    ``(padding + row * (h * scale + padding), padding + col * (w * scale + padding))``; the
    padding (between tiles and around the border) and unused tiles are ``pad_value``.
    Each map is min-max scaled to 0..255 and rounded (a constant map is 0): per map with
    ``normalize="each"``, over all maps with ``"all"`` (keeps their relative strength).
    ``scale`` enlarges every pixel to a ``scale x scale`` block. Pure tensor math on ``maps``'s device.

    Example:
        >>> import torch
        >>> from camkit.debug.grid import tile_maps
        >>> tile_maps(torch.tensor([[[0.0, 1.0]], [[2.0, 2.0]], [[0.0, 4.0]]]), columns=2).tolist()
        [[255, 255, 255, 255, 255, 255, 255], [255, 0, 255, 255, 0, 0, 255], [255, 255, 255, 255, 255, 255, 255], [255, 0, 255, 255, 255, 255, 255], [255, 255, 255, 255, 255, 255, 255]]
    """
    if maps.dim() != 3 or maps.shape[0] == 0:
        raise InvalidInputError(f"maps must be [N, h, w] with N >= 1, got shape {list(maps.shape)}")
    if normalize not in ("each", "all"):
        raise InvalidInputError(f"normalize must be 'each' or 'all', got {normalize!r}")
    if scale < 1 or padding < 0 or not 0 <= pad_value <= 255:
        raise InvalidInputError(f"need scale >= 1, padding >= 0, 0 <= pad_value <= 255; got {scale}, {padding}, {pad_value}")
    n, h, w = maps.shape
    cols = columns if columns is not None else math.ceil(math.sqrt(n))
    if cols < 1:
        raise InvalidInputError(f"columns must be >= 1, got {cols}")
    rows = math.ceil(n / cols)
    m = maps.detach().double()
    if normalize == "each":
        lo = m.amin(dim=(1, 2), keepdim=True)
        hi = m.amax(dim=(1, 2), keepdim=True)
    else:
        lo, hi = m.amin(), m.amax()
    span = hi - lo
    unit = torch.where(span > 0, (m - lo) / torch.where(span > 0, span, 1.0), torch.zeros_like(m))
    tiles = (unit * 255).round().to(torch.uint8)
    if scale > 1:
        tiles = tiles.repeat_interleave(scale, dim=1).repeat_interleave(scale, dim=2)
    th, tw = h * scale, w * scale
    canvas = torch.full(
        (rows * (th + padding) + padding, cols * (tw + padding) + padding), pad_value, dtype=torch.uint8, device=maps.device
    )
    # Place all tiles at once: view the inner area as [rows, th + padding, cols, tw + padding].
    padded = torch.full((rows * cols, th + padding, tw + padding), pad_value, dtype=torch.uint8, device=maps.device)
    padded[:n, :th, :tw] = tiles
    inner = padded.view(rows, cols, th + padding, tw + padding).permute(0, 2, 1, 3).reshape(rows * (th + padding), -1)
    canvas[padding:, padding:] = inner
    return canvas


def feature_grid(
    model: nn.Module,
    x: Tensor,
    layer: str | nn.Module,
    n: int = 64,
    *,
    order: str = "first",
    columns: int | None = None,
    padding: int = 1,
    pad_value: int = 255,
    normalize: str = "each",
    scale: int | None = None,
    call: int = -1,
) -> FeatureGrid:
    """Show ``n`` channels of a layer's output for one input as a grid of grey tiles.

    Args:
        model: the model (run once in eval mode under ``torch.no_grad()``; nothing is changed).
        x: one input, [1, C, H, W] or [C, H, W].
        layer: dotted name or module whose output is [1, C', h, w].
        n: how many channels (all of them if the layer has fewer).
        order: ``"first"``: channels 0..n-1; ``"top"``: the n channels with the largest mean
            activation, largest first (ties in channel order).
        columns: tiles per row (default ``ceil(sqrt(n))``).
        padding, pad_value, normalize: see :func:`tile_maps`.
        scale: pixel enlargement; default: the smallest integer making tiles at least 32 px.
        call: which call of a module that runs several times (-1: the last).

    Returns:
        A :class:`FeatureGrid`; ``camkit.save_png("grid.png", grid.image)`` saves it.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.debug import feature_grid
        >>> net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        >>> grid = feature_grid(net, torch.randn(1, 3, 8, 8), "1", n=4, order="top")
        >>> grid.image.shape, grid.columns, grid.tile, len(grid.channels)
        ((67, 67, 3), 2, (32, 32), 4)
    """
    if order not in ("first", "top"):
        raise InvalidInputError(f"order must be 'first' or 'top', got {order!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidInputError(f"n must be a positive int, got {n!r}")
    if x.dim() == 3:
        x = x.unsqueeze(0)
    if x.dim() != 4 or x.shape[0] != 1:
        raise InvalidInputError(
            f"feature_grid shows one input: pass [1, C, H, W] or [C, H, W], got shape {list(x.shape)}; "
            "for a batch, pick one sample (x[i:i+1])."
        )
    ((name, fmap),) = extract_features(model, x, [layer], call=call).items()
    if fmap.dim() != 4:
        raise InvalidInputError(
            f"layer '{name}' outputs shape {list(fmap.shape)}; feature_grid needs [1, C, h, w] maps. "
            "Pick a convolutional layer (see camkit.list_layers(model, x))."
        )
    maps = fmap[0]
    count = min(n, maps.shape[0])
    if order == "first":
        channels = torch.arange(count)
    else:
        strength = maps.double().mean(dim=(1, 2))
        channels = torch.sort(strength, descending=True, stable=True).indices[:count].cpu()
    h, w = maps.shape[1:]
    factor = scale if scale is not None else max(1, math.ceil(32 / max(h, w)))
    gray = tile_maps(
        maps[channels.to(maps.device)],
        columns=columns,
        padding=padding,
        pad_value=pad_value,
        normalize=normalize,
        scale=factor,
    )
    image = gray.cpu().numpy()[:, :, None].repeat(3, axis=2)
    cols = columns if columns is not None else math.ceil(math.sqrt(count))
    return FeatureGrid(image=image, channels=channels.tolist(), columns=cols, tile=(h * factor, w * factor))
