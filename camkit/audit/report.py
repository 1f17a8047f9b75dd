"""Merged audit outputs: ``results.csv``, ``summary.json`` and a self-contained ``report.html``.

The merge streams: rows are read from the part files one at a time and folded into running
sums per class (:class:`Summary`), the few rows the galleries show (top and bottom
``GALLERY`` by each measure) and the first ``TABLE_ROWS`` rows of the table, so memory and the
report's size do not grow with the number of images; ``results.csv`` holds every row.

The report is one HTML file with no network access (a Content-Security-Policy forbids any
fetch; gallery images are embedded as ``data:`` URIs, styles and the small table-sorting
script are inline). Every string that comes from the data (file names, labels, region
names, error messages) is HTML-escaped.
"""

from __future__ import annotations

import csv
import heapq
import json
import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..runs.files import image_uri
from ..runs.html import escape as _e
from ..runs.html import page, table

__all__ = ["GALLERY", "TABLE_ROWS", "Summary", "summarize", "write_outputs"]

GALLERY = 8
"""Images per gallery in the report."""
TABLE_ROWS = 500
"""Rows of the report's table (the first ones, in the dataset's order); every row is in results.csv."""
_FAILED = 1000


class _Mean:
    __slots__ = ("n", "total")

    def __init__(self) -> None:
        self.total = 0.0
        self.n = 0

    def add(self, value: Any) -> None:
        if value is None or isinstance(value, str):
            return
        v = float(value)
        if not math.isnan(v):
            self.total += v
            self.n += 1

    @property
    def value(self) -> float | None:
        return self.total / self.n if self.n else None


class _Group:
    """Running statistics of a set of rows (all of them, or one class)."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.images = 0
        self.errors = 0
        self.graded = 0
        self.right = 0
        self.extras = [x for x in ("pointing_object", "deletion_auc", "insertion_auc") if x in columns]
        self.regions = [c for c in columns if c.startswith("energy_")]
        self.means = {k: _Mean() for k in ("confidence", "spread", "border", *self.regions, *self.extras)}

    def add(self, row: dict[str, Any]) -> None:
        self.images += 1
        if row["error"]:
            self.errors += 1
            return
        if row.get("correct") is not None:
            self.graded += 1
            self.right += bool(row["correct"])
        for key, mean in self.means.items():
            mean.add(row.get(key))

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "images": self.images,
            "errors": self.errors,
            "accuracy": self.right / self.graded if self.graded else None,
            "confidence": self.means["confidence"].value,
            "spread": self.means["spread"].value,
            "border": self.means["border"].value,
            "energy": {c[len("energy_") :]: self.means[c].value for c in self.regions},
        }
        for extra in self.extras:
            out[extra] = self.means[extra].value
        return out


def _galleries_wanted(columns: Sequence[str]) -> list[tuple[str, str, bool, bool]]:
    """(title, column, highest first, misclassified only) for each gallery of the report."""
    regions = [c[len("energy_") :] for c in columns if c.startswith("energy_")]
    wanted = []
    if "object" in regions:
        wanted.append(("Attention most outside the object", "energy_object", False, False))
    for region in regions:
        if region != "object":
            wanted.append((f"Most attention inside '{region}'", f"energy_{region}", True, False))
    if not regions:
        wanted += [
            ("Misclassified (most confident first)", "confidence", True, True),
            ("Least confident", "confidence", False, False),
            ("Most diffuse maps (lowest top-10% energy share)", "spread", False, False),
            ("Most border-concentrated maps", "border", True, False),
        ]
    return wanted


class Summary:
    """Folds rows one at a time into the summary, the galleries and the report's table.

    Example:
        >>> from camkit.audit.report import Summary
        >>> acc = Summary(["key", "confidence", "spread", "border", "overlay", "error"])
        >>> for i in range(3):
        ...     acc.add({"key": f"{i}.png", "label": "", "prediction_name": "a", "confidence": i / 4,
        ...              "spread": 0.5, "border": 0.1, "error": ""})
        >>> s = acc.summary({})
        >>> s["images"], s["confidence"], [r["key"] for r in acc.gallery("confidence", False)]
        (3, 0.25, ['0.png', '1.png', '2.png'])
    """

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)
        self.overall = _Group(columns)
        self.by_label: dict[str, _Group] = defaultdict(lambda: _Group(columns))
        self.by_prediction: dict[str, _Group] = defaultdict(lambda: _Group(columns))
        self.labelled = False
        self.reasons: Counter[str] = Counter()
        self.failed: list[dict[str, str]] = []
        self.table: list[dict[str, Any]] = []
        self.wanted = _galleries_wanted(columns)
        self._heaps: dict[tuple[str, bool, bool], list[tuple[float, int, dict[str, Any]]]] = {
            (c, high, wrong): [] for _, c, high, wrong in self.wanted
        }
        self._seq = 0

    def add(self, row: dict[str, Any]) -> None:
        """Fold one row in."""
        self.overall.add(row)
        label = row.get("label")
        if label:
            self.labelled = True
        self.by_label[str(label) if label else "(no label)"].add(row)
        name = row.get("prediction_name")
        self.by_prediction[str(name) if name not in (None, "") else "(failed)"].add(row)
        if len(self.table) < TABLE_ROWS:
            self.table.append(row)
        if row["error"]:
            self.reasons[row["error"].replace(Path(row["key"]).name, "FILE")] += 1
            if len(self.failed) < _FAILED:
                self.failed.append({"key": row["key"], "error": row["error"]})
            return
        self._seq += 1
        slim = {k: row.get(k) for k in ("key", "label", "prediction_name", "confidence", "overlay")}
        for (column, high, wrong), heap in self._heaps.items():
            value = row.get(column)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(float(value)):
                continue
            if wrong and row.get("correct") is not False:
                continue
            # keep the GALLERY best: a min-heap on "goodness", ties to the earlier row
            item = (float(value) if high else -float(value), -self._seq, {**slim, column: value})
            if len(heap) < GALLERY:
                heapq.heappush(heap, item)
            elif item[:2] > heap[0][:2]:
                heapq.heapreplace(heap, item)

    def gallery(self, column: str, high: bool, wrong: bool = False) -> list[dict[str, Any]]:
        """The rows of a gallery, best first."""
        heap = self._heaps[(column, high, wrong)]
        return [item[2] for item in sorted(heap, key=lambda t: (t[0], t[1]), reverse=True)]

    def summary(self, meta: dict[str, Any]) -> dict[str, Any]:
        """The summary dict (see :func:`summarize`)."""
        overall = self.overall.stats()
        groups = self.by_label if self.labelled else self.by_prediction
        return {
            **meta,
            **overall,
            "processed": overall["images"] - overall["errors"],
            "classes_from": "label" if self.labelled else "prediction",
            "per_class": {k: g.stats() for k, g in sorted(groups.items())},
            "error_reasons": dict(self.reasons.most_common(50)),
            "failed": list(self.failed),
        }


def summarize(rows: Iterable[dict[str, Any]], columns: Sequence[str], meta: dict[str, Any]) -> dict[str, Any]:
    """The audit summary: run metadata, overall and per-class statistics, and the errors.

    Classes are the labels when the data has labels, else the predicted classes. Means skip
    missing values (absent regions, failed images). ``error_reasons`` counts reasons with
    the file's own name replaced by ``FILE``; ``failed`` lists the first 1000 failed images.

    Example:
        >>> from camkit.audit.report import summarize
        >>> rows = [{"key": "a.png", "label": "cat", "correct": True, "confidence": 0.5, "error": ""},
        ...         {"key": "b.png", "label": "cat", "correct": None, "error": "b.png is empty (0 bytes)"}]
        >>> s = summarize(rows, ["key", "confidence", "error"], {})
        >>> s["images"], s["errors"], s["accuracy"], s["error_reasons"], s["per_class"]["cat"]["images"]
        (2, 1, 1.0, {'FILE is empty (0 bytes)': 1}, 2)
    """
    acc = Summary(columns)
    for row in rows:
        acc.add(row)
    return acc.summary(meta)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


def write_outputs(
    out: Path, keys: Sequence[str], columns: Sequence[str], meta: dict[str, Any], *, strategies: bool = False,
    device: Any = None,
) -> dict[str, Any]:
    """Merge the parts of ``out`` into ``results.csv``, ``summary.json`` and ``report.html`` (each atomically).

    ``keys`` gives the rows' order (the dataset's); a key in no part is left out. Returns the summary.
    With ``strategies``, each class's strategies are found from the parts' sidecars
    (:func:`camkit.audit.strategies.store.merge_strategies`): rows get ``strategy`` and
    ``concept_strategy``, the summary a ``strategies`` section, the report its section; their
    clustering runs on ``device`` (a ``torch.device``; default the CPU).
    """
    from ..runs.files import atomic_write, file_mode
    from ..runs.outdir import iter_part_rows

    lines: dict[str, str] = {}
    for line in iter_part_rows(out):
        lines[json.loads(line)["key"]] = line  # later parts win (a redone image)
    section: dict[str, Any] | None = None
    strategies_html = ""
    names: dict[str, tuple[str, str]] = {}
    if strategies:
        from .strategies.render import render_strategies
        from .strategies.store import merge_strategies

        found, covered, slim, section = merge_strategies(
            out, lines, keys, str(meta.pop("concepts_note", "") or ""), device=device
        )
        if found is not None:
            names = dict(zip(covered, zip(found.names("maps"), found.names("concepts") if found.concepts else [""] * len(covered))))
        strategies_html = render_strategies(out, found, covered, slim, section)
    acc = Summary(columns)
    tmp = out / f".tmp-results-{os.getpid()}.csv"
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as handle:
            os.chmod(tmp, file_mode())
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(columns)
            for key in keys:
                if key not in lines:
                    continue
                line = lines.pop(key)
                row = json.loads(line)
                if strategies:
                    row["strategy"], row["concept_strategy"] = names.get(key, ("", ""))
                acc.add(row)
                writer.writerow([_cell(row.get(c)) for c in columns])
        os.replace(tmp, out / "results.csv")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    summary = acc.summary(meta)
    if section is not None:
        summary["strategies"] = _finite(section)
    atomic_write(out / "summary.json", json.dumps(summary, indent=2, allow_nan=False, default=str))
    atomic_write(out / "report.html", render_html(out, acc, summary, strategies_html))
    return summary


# ---------------------------------------------------------------- HTML

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

_STRATEGY_STYLE = """
.strat{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}.strat svg{border:1px solid #ddd;background:#fff}
.srow{display:flex;gap:8px;align-items:center;margin:4px 0}.srow img{width:72px;height:72px;image-rendering:pixelated;
border:1px solid #ccc}.srow .lab{width:260px;font-size:12px}.chip{display:inline-block;width:10px;height:10px;margin-right:4px}
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
    head = [f"<th{' class=t' if left[i] else ''}>{_e(h)}</th>" for i, h in enumerate(headers)]
    return table(head, [[_td(v, left[i]) for i, v in enumerate(r)] for r in rows], attrs=' class="sortable"')


def _gallery(out: Path, title: str, rows: Sequence[dict[str, Any]], caption: str) -> str:
    if not rows:
        return ""
    figures = []
    for r in rows[:GALLERY]:
        uri = image_uri(out, r.get("overlay", ""))
        value = r.get(caption)
        label = f"label {r['label']}, " if r.get("label") else ""
        text = f"{_e(r['key'])}<br>{_e(label)}pred {_e(str(r.get('prediction_name', '')))} ({_e(_fmt(r.get('confidence')))})"
        figures.append(
            f'<figure><img alt="{_e(r["key"])}" src="{_e(uri)}"><figcaption>{text}<br>'
            f"{_e(caption)} = {_e(_fmt(value))}</figcaption></figure>"
        )
    return f'<h3>{_e(title)}</h3><div class="gallery">{"".join(figures)}</div>'


def _galleries(out: Path, acc: Summary) -> str:
    parts = [
        _gallery(out, title, acc.gallery(column, high, wrong), column) for title, column, high, wrong in acc.wanted
    ]
    return "".join(p for p in parts if p) or "<p>No images to show.</p>"


def _mapping_text(mapping: dict[str, Any]) -> str:
    source = mapping.get("source") or "none"
    names = mapping.get("classes") or []
    shown = ", ".join(f"{i}={n}" for i, n in enumerate(names[:20])) + (" ..." if len(names) > 20 else "")
    return f"{source}" + (f": {shown}" if shown else "")


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by ``None`` (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def render_html(out: Path, acc: Summary, summary: dict[str, Any], strategies: str = "") -> str:
    """The report page as a string (see the module docstring); its size does not grow with the images."""
    columns, rows = acc.columns, acc.table
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
        ("label mapping", _mapping_text(summary.get("label_mapping") or {})),
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
    table_rows = [[r.get(c) for c in shown_cols] for r in rows]
    more = (
        f"<p>Showing the first {len(rows)} of {summary['images']} rows; all are in results.csv.</p>"
        if summary["images"] > len(rows)
        else ""
    )
    errors = ""
    if summary["errors"]:
        reasons = [[k, v] for k, v in summary["error_reasons"].items()]
        errors = f'<h2 class="err">Errors ({summary["errors"]})</h2>' + _table(["reason", "images"], reasons)
    body = (
        f"<h1>camkit audit</h1><table class=meta>{meta}</table>{errors}"
        f"<h2>Per class</h2><p>Classes from the {_e(summary['classes_from'])}s. Energy = share of the map "
        "inside each region; spread = share in the map's top 10% pixels or voxels (high = concentrated); border = share "
        f"in the outer 10% frame.</p>{_table(class_head, class_rows)}"
        f"{strategies}<h2>Galleries</h2>{_galleries(out, acc)}"
        f'<h2>All images</h2><p>Click a column to sort.</p>{more}<div class="scroll">'
        f"{_table(shown_cols, table_rows, text=text_columns)}</div>"
    )
    return page("camkit audit", _STYLE + (_STRATEGY_STYLE if strategies else ""), body, script=_SCRIPT)
