"""Signals for people: each channel's waveform, with the attribution as a colour strip beneath it.

The strip's column ``t`` is the map's value at sample ``t`` (drawn as it is, one colour scale for
every strip, shown by the colorbar), under the waveform's sample ``t``: where the evidence lies
in time. Needs matplotlib (``pip install camkit[plot]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from ..errors import InvalidInputError
from ._draw import add_colorbar, as_maps, bare, colour
from .canvas import COLORBAR_INCHES, TITLE_INCHES, ExplanationFigure, matplotlib_parts, render

__all__ = ["SIGNAL_COLUMNS", "signal_figure"]

SIGNAL_COLUMNS = ("signal", "map")
"""The panels of each row of :func:`signal_figure`: the waveform, and the map's strip under it."""


def signal_figure(
    signal: Tensor,
    explanations: Any,
    *,
    channels: Sequence[str] | None = None,
    rate: float | None = None,
    colormap: str = "jet",
    width: float = 8.0,
    height: float = 1.6,
    dpi: int = 100,
) -> ExplanationFigure:
    """One row per signal and explanation: the waveform (every channel), and the map as colour beneath it.

    Each row is a waveform panel (key ``(row, "signal")``) over a strip (key ``(row, "map")``)
    that shares its time axis; a colorbar (0 to 1) under the rows serves every strip. The
    figure is ``width`` inches wide and ``rows * (height + 0.5) + 0.7`` high.

    Args:
        signal: one signal [C, T] (or [T]) or a batch [B, C, T].
        explanations: an :class:`~camkit.Explanation` (maps [B, T]), a tensor of maps,
            several in a sequence, or a ``{label: ...}`` mapping.
        channels: channel names for the legend (default ``ch 0``, ``ch 1``...).
        rate: samples per second; the time axis is then in seconds, else in samples.
        colormap: the strip's colour table.
        width, height: the figure's width and a row's height, in inches; ``dpi`` pixels per inch.

    Example:
        >>> import torch
        >>> from camkit.viz.signal import signal_figure
        >>> fig = signal_figure(torch.randn(2, 100), torch.rand(100), width=4, height=1, dpi=40)
        >>> fig.columns, sorted(fig.panels)
        (('signal', 'map'), [(0, 'map'), (0, 'signal')])
    """
    Figure, *_ = matplotlib_parts()
    batch_signal, single = _signal_batch(signal)
    batch, count, length = batch_signal.shape
    named = as_maps(explanations, None if single else batch, (length,))
    if single:
        named = {k: v[None] for k, v in named.items()}
    names = list(channels) if channels is not None else [f"ch {c}" for c in range(count)]
    if len(names) != count:
        raise InvalidInputError(f"{len(names)} channel name(s) for a signal of {count} channel(s)")
    rows = batch * len(named)
    fig = Figure(figsize=(width, rows * (height + TITLE_INCHES) + COLORBAR_INCHES), dpi=dpi, layout="constrained")
    grid = fig.subplots(2 * rows + 1, 1, squeeze=False, gridspec_kw={"height_ratios": [3.0, 1.0] * rows + [0.3]})
    fontsize = max(5.0, 3.5 * height)
    axes: dict[tuple[int, str], Any] = {}
    titles: dict[tuple[int, str], str] = {}
    row = 0
    for b in range(batch):
        for label, maps in named.items():
            title = f"signal {b}: {label}"
            wave, strip = grid[2 * row, 0], grid[2 * row + 1, 0]
            _draw_wave(wave, batch_signal[b], names, rate, title, fontsize)
            _draw_strip(strip, maps[b], rate, colormap, fontsize)
            axes[(row, "signal")], axes[(row, "map")] = wave, strip
            titles[(row, "signal")], titles[(row, "map")] = title, f"{label} map"
            row += 1
    bare(grid[2 * rows, 0], "", fontsize)
    add_colorbar(fig, grid[2 * rows, 0], colormap, fontsize)
    return render(fig, axes, SIGNAL_COLUMNS, titles)


def _signal_batch(signal: Tensor) -> tuple[Tensor, bool]:
    """The signal as a float CPU batch [B, C, T], and whether one signal was given."""
    if not isinstance(signal, Tensor) or signal.dim() not in (1, 2, 3):
        got = list(signal.shape) if isinstance(signal, Tensor) else type(signal).__name__
        raise InvalidInputError(f"a signal is [T], [C, T] or a batch [B, C, T]; got {got}")
    batch_signal = (signal if signal.dim() == 3 else (signal[None] if signal.dim() == 2 else signal[None, None]))
    return batch_signal.detach().float().cpu(), signal.dim() < 3


def _time_axis(length: int, rate: float | None) -> tuple[float, float, list[float]]:
    """The time axis's limits and each sample's time: seconds at ``rate``, else samples."""
    scale = 1.0 / rate if rate else 1.0
    return -0.5 * scale, (length - 0.5) * scale, [t * scale for t in range(length)]


def _draw_wave(wave: Any, channels: Tensor, names: list[str], rate: float | None, title: str, fontsize: float) -> None:
    """Every channel [C, T] of one signal as a line, with a legend for more than one."""
    count = channels.shape[0]
    left, right, time = _time_axis(channels.shape[1], rate)
    for c in range(count):
        wave.plot(time, channels[c].numpy(), linewidth=0.8, label=names[c])
    wave.set_xlim(left, right)
    wave.set_xticks([])
    wave.tick_params(labelsize=fontsize)
    if count > 1:
        wave.legend(fontsize=fontsize, loc="upper right", ncols=min(count, 6))
    wave.set_title(title, fontsize=fontsize)


def _draw_strip(strip: Any, values: Tensor, rate: float | None, colormap: str, fontsize: float) -> None:
    """One map [T] as a strip of colour on the waveform's time axis."""
    left, right, _ = _time_axis(values.shape[-1], rate)
    strip.imshow(colour(values[None], colormap), aspect="auto", interpolation="nearest",
                 extent=(left, right, 0.0, 1.0))  # fmt: skip
    strip.set_xlim(left, right)
    strip.set_yticks([])
    strip.tick_params(labelsize=fontsize)
    strip.set_xlabel("seconds" if rate else "sample", fontsize=fontsize)
