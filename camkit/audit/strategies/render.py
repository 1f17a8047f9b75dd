"""The report's strategies: the ranking, then per class the embedding, each strategy's mean map and prototypes.

Everything is inline (SVG scatter plots, PNG ``data:`` URIs) and every string from the data is
escaped, like the rest of :mod:`camkit.audit.report`. Its size is bounded: at most
:data:`CLASSES_SHOWN` classes (the highest-ranked), :data:`POINTS` points per plot.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...runs.html import escape as _e
from ...runs.html import table
from .analysis import ClassStrategies, Strategies, Strategy

__all__ = ["CLASSES_SHOWN", "POINTS", "render_strategies"]

CLASSES_SHOWN = 30
POINTS = 1500
_RANKED = 10
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")



def _fmt(value: Any, pct: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.0%}" if pct else f"{value:.2f}"


def _map_png(mean_map: np.ndarray | None) -> str:
    """A mean map as an inline PNG (jet colours, normalised to its maximum, enlarged)."""
    if mean_map is None:
        return ""
    import cv2

    from ...functional import colormap_lut
    from ...runs.files import encode_image

    m = np.asarray(mean_map, dtype=np.float32)
    if m.ndim == 1:
        m = m[None]
    elif m.ndim == 3:
        m = m.max(axis=0)  # a volume or a clip: the maximum over its first axis
    peak = float(m.max())
    m = m / peak if peak > 0 else m
    lut = colormap_lut("jet").numpy()
    rgb = lut[np.clip(np.round(m * 255), 0, 255).astype(np.int64)]
    scale = max(1, 64 // max(m.shape))
    rgb = cv2.resize(rgb, (m.shape[1] * scale, m.shape[0] * scale), interpolation=cv2.INTER_NEAREST)
    return "data:image/png;base64," + base64.b64encode(encode_image(np.ascontiguousarray(rgb), "png")).decode("ascii")


def _thumb(out: Path, row: dict[str, Any] | None, caption: str = "") -> str:
    from ...runs.files import image_uri

    if row is None:
        return ""
    uri = image_uri(out, row.get("overlay"))
    title = f"{row.get('key')} (pred {row.get('prediction_name')}, {_fmt(row.get('confidence'))}){caption}"
    return f'<img alt="{_e(str(row.get("key")))}" title="{_e(title)}" src="{_e(uri)}">'


def _scatter(group: ClassStrategies) -> str:
    """The class's spectral embedding, one dot per image coloured by strategy (inline SVG)."""
    emb = np.asarray(group.clustering.embedding, dtype=np.float64)
    labels = group.clustering.labels
    n = len(labels)
    if n == 0 or emb.shape[1] < 2:
        return ""
    step = max(1, math.ceil(n / POINTS))
    pick = np.arange(0, n, step)
    xy = emb[pick]
    lo, hi = xy.min(axis=0), xy.max(axis=0)
    span = np.where(hi - lo > 0, hi - lo, 1.0)
    pts = 10 + 200 * (xy - lo) / span
    dots = "".join(
        f'<circle cx="{p[0]:.1f}" cy="{220 - p[1]:.1f}" r="2.6" fill="{_PALETTE[int(labels[i]) % len(_PALETTE)]}" '
        'fill-opacity="0.75"/>'
        for p, i in zip(pts, pick)
    )
    label = f"{group.kind}: spectral embedding" + (f" (every {step}th image)" if step > 1 else "")
    return (
        f'<svg width="230" height="250" viewBox="0 0 230 250" role="img" aria-label="{_e(label)}">{dots}'
        f'<text x="8" y="243" font-size="11">{_e(label)}</text></svg>'
    )


def _strategy_row(out: Path, s: Strategy, rows: dict[str, dict[str, Any]], keys: Sequence[str], kind: str) -> str:
    colour = _PALETTE[int(s.name.rsplit("/", 1)[1]) % len(_PALETTE)]
    text = (
        f'<span class="chip" style="background:{colour}"></span><b>{_e(s.name)}</b>: {s.size} images '
        f"({_fmt(s.share, True)}), accuracy {_fmt(s.accuracy, True)}, confidence {_fmt(s.confidence)}, "
        f"focus {_fmt(s.focus)}<br>{_e(s.why)}"
    )
    mean = _map_png(s.mean_map)
    cells = [f'<div class="lab">{text}</div>', f'<img alt="mean map" title="mean map of {_e(s.name)}" src="{mean}">']
    cells += [_thumb(out, rows.get(keys[i]), " prototype") for i in s.prototypes]
    line = f'<div class="srow">{"".join(cells)}</div>'
    if kind == "concepts" and s.channels:
        for channel, lift in s.channels:
            refs = "".join(_thumb(out, rows.get(keys[i]), f" channel {channel}") for i in s.references.get(channel, []))
            line += (
                f'<div class="srow"><div class="lab">&nbsp;&nbsp;channel {channel}: +{lift:.1%} of the relevance over the '
                f"rest of the class; its reference images</div>{refs}</div>"
            )
    return line


def render_strategies(out: Path, found: Strategies | None, keys: Sequence[str], rows: dict[str, dict[str, Any]],
                      section: dict[str, Any]) -> str:  # fmt: skip
    """The report's strategies section (HTML)."""
    head = (
        "<h2>Strategies (found without masks)</h2><p>Per class, the images' downsampled maps (SpRAy) and their concept "
        "relevance vectors at the audited layer are clustered (a kNN graph, its spectral embedding, the eigengap's "
        "number of clusters). Each cluster is a <i>strategy</i>: one way the model decides the class. Focus = share of a "
        "strategy's mean map in its top 10% cells: high when its images all look at one fixed place. "
        "Prototypes are the images nearest the strategy's centre.</p>"
    )
    if found is None:
        return head + f"<p>{_e(str(section.get('note', 'no strategies')))}</p>"
    notes = [str(section[k]) for k in ("concepts_note",) if section.get(k)]
    head += "".join(f"<p>Concepts: {_e(n)}</p>" for n in notes)
    ranked = [
        [kind, s.name, s.size, _fmt(s.share, True), _fmt(s.accuracy, True), _fmt(s.confidence), _fmt(s.focus),
         f"{s.score:.2f}", s.why]
        for kind, s in found.ranking[:_RANKED]
    ]  # fmt: skip
    cells = [[f"<td class=t>{_e(str(v))}</td>" for v in r] for r in ranked]
    hdr = [f"<th class=t>{h}</th>" for h in ("kind", "strategy", "images", "share", "accuracy", "confidence", "focus",
                                             "score", "why")]  # fmt: skip
    body = [head, f"<h3>Look at these first</h3>{table(hdr, cells)}"]
    order: list[str] = []
    for _, s in found.ranking:
        cls = s.name.rsplit("/", 1)[0]
        if cls not in order:
            order.append(cls)
    for cls in order[:CLASSES_SHOWN]:
        body.append(f"<h3>Class {_e(cls)}</h3>")
        for kind, groups in (("maps", found.maps), ("concepts", found.concepts)):
            group = groups.get(cls)
            if group is None:
                continue
            why = f" ({_e(group.reason)})" if group.reason else ""
            strategies = "".join(_strategy_row(out, s, rows, keys, kind) for s in group.strategies)
            outliers = "".join(_thumb(out, rows.get(keys[i]), " outlier") for i in group.outliers)
            extra = f'<div class="srow"><div class="lab">outliers</div>{outliers}</div>' if outliers else ""
            body.append(
                f"<h4>{'From the maps' if kind == 'maps' else 'From the concepts'}: {len(group.strategies)} "
                f'strateg{"y" if len(group.strategies) == 1 else "ies"}{why}</h4>'
                f'<div class="strat">{_scatter(group)}<div>{strategies}{extra}</div></div>'
            )
    if len(order) > CLASSES_SHOWN:
        body.append(f"<p>{len(order) - CLASSES_SHOWN} more classes: see summary.json.</p>")
    return "".join(body)
