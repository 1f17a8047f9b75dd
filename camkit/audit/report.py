"""Merged audit outputs: ``results.csv``, ``summary.json`` and a self-contained ``report.html``.

The report is one HTML file with no network access (a Content-Security-Policy forbids any
fetch; gallery images are embedded as ``data:`` URIs, styles and the small table-sorting
script are inline). Every string that comes from the data (file names, labels, region
names, error messages) is HTML-escaped.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["summarize", "write_outputs"]

_GALLERY = 8
_TABLE_ROWS = 5000


def _mean(values: Sequence[Any]) -> float | None:
    nums = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(nums) / len(nums) if nums else None


def _stats(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> dict[str, Any]:
    ok = [r for r in rows if not r["error"]]
    graded = [r["correct"] for r in ok if r.get("correct") is not None]
    stats: dict[str, Any] = {
        "images": len(rows),
        "errors": len(rows) - len(ok),
        "accuracy": sum(bool(c) for c in graded) / len(graded) if graded else None,
        "confidence": _mean([r.get("confidence") for r in ok]),
        "spread": _mean([r.get("spread") for r in ok]),
        "border": _mean([r.get("border") for r in ok]),
        "energy": {c[len("energy_") :]: _mean([r.get(c) for r in ok]) for c in columns if c.startswith("energy_")},
    }
    for extra in ("pointing_object", "deletion_auc", "insertion_auc"):
        if extra in columns:
            stats[extra] = _mean([r.get(extra) for r in ok])
    return stats


def summarize(rows: Sequence[dict[str, Any]], columns: Sequence[str], meta: dict[str, Any]) -> dict[str, Any]:
    """The audit summary: run metadata, overall and per-class statistics, and the errors.

    Classes are the labels when the data has labels, else the predicted classes. Means skip
    missing values (absent regions, failed images). ``error_reasons`` counts reasons with
    the file's own name replaced by ``FILE``.

    Example:
        >>> from camkit.audit.report import summarize
        >>> rows = [{"key": "a.png", "label": "cat", "correct": True, "confidence": 0.5, "error": ""},
        ...         {"key": "b.png", "label": "cat", "correct": None, "error": "b.png is empty (0 bytes)"}]
        >>> s = summarize(rows, ["key", "confidence", "error"], {})
        >>> s["images"], s["errors"], s["accuracy"], s["error_reasons"], s["per_class"]["cat"]["images"]
        (2, 1, 1.0, {'FILE is empty (0 bytes)': 1}, 2)
    """
    labelled = any(r.get("label") for r in rows)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        key = r.get("label") if labelled else r.get("prediction_name")
        groups[str(key) if key not in (None, "") else "(no label)" if labelled else "(failed)"].append(r)
    reasons = Counter(r["error"].replace(Path(r["key"]).name, "FILE") for r in rows if r["error"])
    overall = _stats(rows, columns)
    return {
        **meta,
        **overall,
        "processed": overall["images"] - overall["errors"],
        "classes_from": "label" if labelled else "prediction",
        "per_class": {k: _stats(v, columns) for k, v in sorted(groups.items())},
        "error_reasons": dict(reasons.most_common(50)),
        "failed": [{"key": r["key"], "error": r["error"]} for r in rows if r["error"]][:1000],
    }


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


def _csv_text(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        writer.writerow([_cell(r.get(c)) for c in columns])
    return buffer.getvalue()


def write_outputs(
    out: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str], meta: dict[str, Any]
) -> dict[str, Any]:
    """Write ``results.csv``, ``summary.json`` and ``report.html`` into ``out`` (each atomically); the summary."""
    from .run import atomic_write

    summary = summarize(rows, columns, meta)
    atomic_write(out / "results.csv", _csv_text(rows, columns))
    atomic_write(out / "summary.json", json.dumps(summary, indent=2, allow_nan=False, default=str))
    atomic_write(out / "report.html", render_html(out, rows, columns, summary))
    return summary


# ---------------------------------------------------------------- HTML

_e = html.escape  # quote=True by default: safe in text and in attribute values

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 7px;text-align:right}
th{background:#f3f3f3;cursor:pointer;user-select:none}td.t,th.t{text-align:left}
th.asc::after{content:" \\25B2"}th.desc::after{content:" \\25BC"}
.meta td{text-align:left}.gallery{display:flex;flex-wrap:wrap;gap:10px}
figure{margin:0;width:120px;font-size:12px;word-break:break-all}figure img{width:120px;height:120px;
image-rendering:pixelated;border:1px solid #ccc}.err{color:#a00}.scroll{max-height:600px;overflow:auto}
"""

_SCRIPT = """
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var up = !th.classList.contains('asc');
      table.querySelectorAll('th').forEach(function (h) { h.classList.remove('asc', 'desc'); });
      th.classList.add(up ? 'asc' : 'desc');
      rows.sort(function (a, b) {
        var x = a.cells[col].getAttribute('data-v'), y = b.cells[col].getAttribute('data-v');
        var nx = parseFloat(x), ny = parseFloat(y), r;
        if (x === '' && y !== '') return 1;
        if (y === '' && x !== '') return -1;
        r = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
        return up ? r : -r;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _td(value: Any, text: bool = False) -> str:
    sort = _cell(value)
    return f'<td{" class=t" if text else ""} data-v="{_e(sort)}">{_e(_fmt(value))}</td>'


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], text: Sequence[str] = ()) -> str:
    """A sortable table; columns named in ``text`` (and the first) are left-aligned text."""
    left = [i == 0 or h in text for i, h in enumerate(headers)]
    head = "".join(f"<th{' class=t' if left[i] else ''}>{_e(h)}</th>" for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(_td(v, left[i]) for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _image_uri(out: Path, rel: str) -> str:
    path = out / rel
    if not rel or not path.is_file():
        return ""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _gallery(out: Path, title: str, rows: Sequence[dict[str, Any]], caption: str) -> str:
    if not rows:
        return ""
    figures = []
    for r in rows[:_GALLERY]:
        uri = _image_uri(out, r.get("overlay", ""))
        value = r.get(caption)
        label = f"label {r['label']}, " if r.get("label") else ""
        text = f"{_e(r['key'])}<br>{_e(label)}pred {_e(str(r.get('prediction_name', '')))} ({_e(_fmt(r.get('confidence')))})"
        figures.append(
            f'<figure><img alt="{_e(r["key"])}" src="{_e(uri)}"><figcaption>{text}<br>'
            f"{_e(caption)} = {_e(_fmt(value))}</figcaption></figure>"
        )
    return f'<h3>{_e(title)}</h3><div class="gallery">{"".join(figures)}</div>'


def _ranked(rows: Sequence[dict[str, Any]], column: str, high_first: bool) -> list[dict[str, Any]]:
    have = [r for r in rows if isinstance(r.get(column), (int, float)) and not math.isnan(float(r[column]))]
    return sorted(have, key=lambda r: (-float(r[column]) if high_first else float(r[column]), r["key"]))


def _galleries(out: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    ok = [r for r in rows if not r["error"]]
    regions = [c[len("energy_") :] for c in columns if c.startswith("energy_")]
    parts = []
    if "object" in regions:
        parts.append(
            _gallery(out, "Attention most outside the object", _ranked(ok, "energy_object", False), "energy_object")
        )
    for region in regions:
        if region != "object":
            column = f"energy_{region}"
            parts.append(_gallery(out, f"Most attention inside '{region}'", _ranked(ok, column, True), column))
    if not regions:
        wrong = [r for r in ok if r.get("correct") is False]
        parts.append(
            _gallery(out, "Misclassified (most confident first)", _ranked(wrong, "confidence", True), "confidence")
        )
        parts.append(_gallery(out, "Least confident", _ranked(ok, "confidence", False), "confidence"))
        parts.append(
            _gallery(out, "Most diffuse maps (lowest top-10% energy share)", _ranked(ok, "spread", False), "spread")
        )
        parts.append(_gallery(out, "Most border-concentrated maps", _ranked(ok, "border", True), "border"))
    return "".join(p for p in parts if p) or "<p>No images to show.</p>"


def render_html(out: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str], summary: dict[str, Any]) -> str:
    """The report page as a string (see the module docstring)."""
    model = summary.get("model") or {}
    meta_rows = [
        ("model", f"{model.get('spec', '')} (weights: {model.get('weights') or 'none given'})"),
        (
            "method / layer / target",
            f"{summary.get('method')} / {summary.get('layer') or 'auto'} / {summary.get('target')}",
        ),
        ("data", f"{(summary.get('data') or {}).get('path', '')} ({(summary.get('data') or {}).get('kind', '')})"),
        ("images", f"{summary['images']} ({summary['processed']} audited, {summary['errors']} failed)"),
        ("accuracy", _fmt(summary.get("accuracy")) or "no labels"),
        ("versions", f"camkit {summary.get('camkit_version')}, torch {summary.get('torch_version')}"),
    ]
    meta = "".join(f"<tr><th class=t>{_e(k)}</th><td>{_e(str(v))}</td></tr>" for k, v in meta_rows)
    regions = list(summary.get("energy", {}))
    class_head = ["class", "images", "errors", "accuracy", "confidence", "spread", "border"]
    class_head += [f"energy {r}" for r in regions]
    extras = [x for x in ("pointing_object", "deletion_auc", "insertion_auc") if x in summary]
    class_head += extras
    class_rows = [
        [name, s["images"], s["errors"], s["accuracy"], s["confidence"], s["spread"], s["border"]]
        + [s["energy"].get(r) for r in regions] + [s.get(x) for x in extras]
        for name, s in summary["per_class"].items()
    ]  # fmt: skip
    shown_cols = [c for c in columns if c not in ("overlay",)]
    text_columns = ("label", "prediction_name", "note", "error")
    table_rows = [[r.get(c) for c in shown_cols] for r in rows[:_TABLE_ROWS]]
    more = (
        f"<p>Showing the first {_TABLE_ROWS} of {len(rows)} rows; all are in results.csv.</p>"
        if len(rows) > _TABLE_ROWS
        else ""
    )
    errors = ""
    if summary["errors"]:
        reasons = [[k, v] for k, v in summary["error_reasons"].items()]
        errors = f'<h2 class="err">Errors ({summary["errors"]})</h2>' + _table(["reason", "images"], reasons)
    body = (
        f"<h1>camkit audit</h1><table class=meta>{meta}</table>{errors}"
        f"<h2>Per class</h2><p>Classes from the {_e(summary['classes_from'])}s. Energy = share of the map "
        "inside each region; spread = share in the map's top 10% pixels (high = concentrated); border = share "
        f"in the outer 10% frame.</p>{_table(class_head, class_rows)}"
        f"<h2>Galleries</h2>{_galleries(out, rows, columns)}"
        f'<h2>All images</h2><p>Click a column to sort.</p>{more}<div class="scroll">'
        f"{_table(shown_cols, table_rows, text=text_columns)}</div>"
    )
    csp = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f"<title>camkit audit</title><style>{_STYLE}</style></head><body>{body}<script>{_SCRIPT}</script></body></html>"
    )
