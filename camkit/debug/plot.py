"""Line plots of statistics over steps, drawn with OpenCV (no plotting library needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["plot_series"]

# A colour-blind-friendly palette (Okabe-Ito) followed by a few more distinct colours, RGB.
PALETTE = [
    (0, 114, 178),
    (230, 159, 0),
    (0, 158, 115),
    (204, 121, 167),
    (86, 180, 233),
    (213, 94, 0),
    (240, 228, 66),
    (0, 0, 0),
    (128, 128, 128),
    (153, 0, 0),
    (0, 102, 0),
    (102, 0, 153),
]

Panel = tuple[str, dict[str, tuple[list[int], list[float]]]]


def _log10(value: float) -> float:
    return math.log10(value) if value > 0 else math.nan


def _fmt(value: float) -> str:
    if value == 0 or (1e-3 <= abs(value) < 1e4):
        return f"{value:.4g}"
    return f"{value:.2e}"


def plot_series(
    panels: Sequence[Panel],
    *,
    title: str = "",
    panel_size: tuple[int, int] = (420, 260),
    columns: int = 2,
    max_legend: int = 24,
    log: Sequence[str] = (),
) -> np.ndarray:
    """Draw panels of line series; every panel shares the same line labels and colours.

    Args:
        panels: ``(panel title, {line label: (steps, values)})`` per panel. Non-finite values
            break the line.
        title: figure title.
        panel_size: ``(width, height)`` of one panel in pixels.
        columns: panels per row.
        max_legend: legend entries shown (the rest is summarised as "+N more").
        log: titles of panels drawn on a log10 axis (values <= 0 break the line there).

    Returns:
        uint8 RGB image [H, W, 3].

    Example:
        >>> from camkit.debug.plot import plot_series
        >>> plot_series([("loss", {"a": ([0, 1, 2], [3.0, 2.0, 1.5])})]).shape
        (318, 860, 3)
    """
    import cv2

    labels: list[str] = []
    for _, lines in panels:
        labels.extend(label for label in lines if label not in labels)
    colours = {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}

    width, height = panel_size
    rows = max(1, math.ceil(len(panels) / columns))
    shown = labels[:max_legend]
    legend_cols = max(1, (columns * width) // 200)
    legend_rows = math.ceil((len(shown) + (len(labels) > len(shown))) / legend_cols)
    top, margin = 30, 10
    canvas = np.full((top + rows * height + legend_rows * 18 + margin, columns * width + 2 * margin, 3), 255, np.uint8)
    cv2.putText(canvas, title, (margin, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.55, (0, 0, 0), 1, cv2.LINE_AA)
    for index, (name, lines) in enumerate(panels):
        origin = (margin + (index % columns) * width, top + (index // columns) * height)
        _draw_panel(canvas, name, lines, origin, panel_size, name in log, colours)
    entries = [*shown, *([f"+{len(labels) - len(shown)} more"] if len(labels) > len(shown) else [])]
    _draw_legend(canvas, entries, colours, (margin, top + rows * height + 12), legend_cols)
    return canvas


def _draw_panel(
    canvas: np.ndarray,
    name: str,
    lines: dict[str, tuple[list[int], list[float]]],
    origin: tuple[int, int],
    panel_size: tuple[int, int],
    on_log: bool,
    colours: dict[str, tuple[int, int, int]],
) -> None:
    """One panel: its title, frame, axis labels and lines, with its top-left corner at ``origin``."""
    import cv2

    font, scale, thin = cv2.FONT_HERSHEY_SIMPLEX, 0.4, 1
    if on_log:
        lines = {label: (steps, [_log10(v) for v in values]) for label, (steps, values) in lines.items()}
    (ox, oy), (width, height) = origin, panel_size
    left, right, upper, lower = ox + 64, ox + width - 12, oy + 20, oy + height - 28
    cv2.putText(canvas, name + (" (log10 axis)" if on_log else ""), (ox + 64, oy + 14), font, 0.45, (0, 0, 0), thin, cv2.LINE_AA)
    cv2.rectangle(canvas, (left, upper), (right, lower), (160, 160, 160), 1)
    finite = [(s, v) for steps, values in lines.values() for s, v in zip(steps, values) if math.isfinite(v)]
    if not finite:
        cv2.putText(canvas, "no finite values", (left + 10, (upper + lower) // 2), font, scale, (120, 120, 120), thin)
        return
    s_lo, s_hi = min(s for s, _ in finite), max(s for s, _ in finite)
    v_lo, v_hi = min(v for _, v in finite), max(v for _, v in finite)
    if v_hi == v_lo:
        v_lo, v_hi = v_lo - 0.5, v_hi + 0.5
    s_span = max(s_hi - s_lo, 1)

    def to_px(step: int, value: float) -> tuple[int, int]:
        x = left + round((step - s_lo) / s_span * (right - left))
        y = lower - round((value - v_lo) / (v_hi - v_lo) * (lower - upper))
        return x, y

    labels_y = (10**v_hi, 10**v_lo) if on_log else (v_hi, v_lo)
    for text, y in ((_fmt(labels_y[0]), upper + 4), (_fmt(labels_y[1]), lower)):
        cv2.putText(canvas, text, (ox + 2, y), font, scale, (60, 60, 60), thin, cv2.LINE_AA)
    cv2.putText(canvas, str(s_lo), (left, lower + 14), font, scale, (60, 60, 60), thin, cv2.LINE_AA)
    cv2.putText(canvas, f"step {s_hi}", (right - 60, lower + 14), font, scale, (60, 60, 60), thin, cv2.LINE_AA)
    for label, (steps, values) in lines.items():
        _draw_line(canvas, [to_px(s, v) if math.isfinite(v) else None for s, v in zip(steps, values)], colours[label])


def _draw_line(canvas: np.ndarray, points: list[tuple[int, int] | None], colour: tuple[int, int, int]) -> None:
    """A series' finite runs as polylines (a lone point as a dot); ``None`` breaks the line."""
    import cv2

    segment: list[tuple[int, int]] = []
    for point in [*points, None]:
        if point is not None:
            segment.append(point)
            continue
        if len(segment) == 1:
            cv2.circle(canvas, segment[0], 2, colour, -1)
        elif segment:
            cv2.polylines(canvas, [np.array(segment, np.int32)], False, colour, 1, cv2.LINE_AA)
        segment = []


def _draw_legend(
    canvas: np.ndarray,
    entries: list[str],
    colours: dict[str, tuple[int, int, int]],
    origin: tuple[int, int],
    legend_cols: int,
) -> None:
    import cv2

    margin, ly = origin
    for i, label in enumerate(entries):
        x = margin + (i % legend_cols) * 200
        y = ly + (i // legend_cols) * 18
        if label in colours:
            cv2.line(canvas, (x, y - 4), (x + 18, y - 4), colours[label], 2)
        cv2.putText(canvas, label[:28], (x + 24, y), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 1, cv2.LINE_AA)
