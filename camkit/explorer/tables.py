"""The explorer's tables: an audit's or an evaluation's output folder read into plain rows (no gradio).

An audit folder (``camkit audit --out DIR``) holds ``results.csv`` (one row per image),
``summary.json`` (run settings, per-class statistics, the strategies) and ``overlays/``. An
evaluation folder (``camkit evaluate --out DIR``) holds ``summary.json`` (per method and metric:
mean, interval, mean rank; the verdict) and ``scores.csv`` (one row per image x method x metric).
These functions read them into lists of dicts, filter and sort them, write the findings as
sentences, and resolve a row to its image file and saved overlay. Only ``results.csv`` with a
``key`` column (audit) or ``summary.json`` with ``scores`` (evaluation) is required: a missing
column, a missing summary or a moved data folder gives less to show, never a wrong row. A folder
that is not a camkit run gives an :class:`~camkit.errors.InvalidInputError` saying what it holds.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError
from ._read import cell, folder_of, holds, order, read_csv, read_json
from .evaluation_tables import EvaluationFolder, ranking_view, read_evaluation, scores_view

__all__ = [
    "AuditFolder", "EvaluationFolder", "RowFiles", "audit_findings", "audit_view", "class_strategies",
    "filter_rows", "ranking_view", "read_audit", "read_evaluation", "resolve_row", "scores_view", "sort_rows",
]  # fmt: skip

_SHOWN = ("key", "class", "prediction_name", "confidence", "correct")
_AFTER = ("pointing_object", "spread", "border", "deletion_auc", "insertion_auc", "strategy", "error")


@dataclass(frozen=True)
class AuditFolder:
    """An audit's output folder, read.

    Attributes:
        folder: the folder.
        columns: the columns of ``results.csv``, in order.
        rows: one dict per image (numbers parsed, empty cells None), plus ``class``: the label when
            the audit had labels, else the predicted class (as the summary's ``per_class``).
        summary: ``summary.json`` ({} when absent).
        data_root: the folder the rows' keys are relative to, when it can still be found.
    """

    folder: Path
    columns: list[str]
    rows: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    data_root: Path | None = None

    @property
    def regions(self) -> list[str]:
        """The region names of the ``energy_*`` columns."""
        return [c[len("energy_") :] for c in self.columns if c.startswith("energy_")]

    @property
    def classes(self) -> list[str]:
        """The classes of the rows, sorted."""
        return sorted({r["class"] for r in self.rows if r.get("class")})

    @property
    def strategies(self) -> list[str]:
        """The strategy names of the rows, sorted ([] when the audit found none)."""
        return sorted({r["strategy"] for r in self.rows if r.get("strategy")})


def _data_root(folder: Path, summary: Mapping[str, Any]) -> Path | None:
    """Where the keys live: run.json's resolved data path, else summary's (absolute, or from here or the cwd)."""
    candidates: list[Path] = []
    run = None
    try:
        run = read_json(folder / "run.json")
    except InvalidInputError:
        pass
    if run and isinstance(run.get("data"), str):
        candidates.append(Path(run["data"]))
    data = summary.get("data")
    if isinstance(data, Mapping) and isinstance(data.get("path"), str):
        given = Path(data["path"])
        candidates += [given] if given.is_absolute() else [Path.cwd() / given, folder.parent / given]
    for path in candidates:
        if path.is_file() and path.suffix.lower() == ".csv":
            return path.parent
        if path.is_dir():
            return path
    return None


def read_audit(path: str | os.PathLike[str]) -> AuditFolder:
    """Read an audit folder (``results.csv`` required; ``summary.json`` and ``run.json`` when present).

    Raises:
        InvalidInputError: the folder is missing, holds no ``results.csv`` (an evaluation folder is
            named as such), or its ``results.csv`` has no ``key`` column.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from camkit.explorer.tables import read_audit
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "results.csv").write_text("key,label,correct,energy_object\\na.png,cat,1,0.25\\n")
        >>> audit = read_audit(folder)
        >>> audit.rows[0]["correct"], audit.rows[0]["energy_object"], audit.regions, audit.classes
        (True, 0.25, ['object'], ['cat'])
    """
    folder = folder_of(path, "audit")
    results = folder / "results.csv"
    if not results.is_file():
        hint = " (it looks like an evaluation: pass it as an evaluation, --evaluate)" if (folder / "scores.csv").is_file() else ""
        raise InvalidInputError(
            f"{folder} holds no results.csv, so it is not a finished camkit audit{hint}; it holds {holds(folder)}. "
            "Pass the --out folder of a finished `camkit audit`"
        )
    columns, rows = read_csv(results)
    if "key" not in columns:
        raise InvalidInputError(
            f"{results} has no 'key' column (its columns: {columns[:8]}); it was not written by `camkit audit`"
        )
    summary = read_json(folder / "summary.json") or {}
    labelled = summary.get("classes_from") == "label" if "classes_from" in summary else any(r.get("label") for r in rows)
    for row in rows:
        name = row.get("label") if labelled else row.get("prediction_name")
        row["class"] = "" if name is None else str(name)
    return AuditFolder(folder, columns, rows, summary, _data_root(folder, summary))


def filter_rows(
    rows: Iterable[Mapping[str, Any]],
    *,
    cls: str | None = None,
    correct: bool | None = None,
    strategy: str | None = None,
    text: str = "",
) -> list[dict[str, Any]]:
    """The rows of one class, of right (``correct=True``) or wrong predictions, of one strategy, whose key holds ``text``.

    ``None`` (or "") leaves a filter out; ``correct`` keeps only graded rows when given.

    Example:
        >>> from camkit.explorer.tables import filter_rows
        >>> rows = [{"key": "a", "class": "cat", "correct": True}, {"key": "b", "class": "cat", "correct": False},
        ...         {"key": "c", "class": "dog", "correct": None}]
        >>> [r["key"] for r in filter_rows(rows, cls="cat", correct=False)], len(filter_rows(rows, correct=True))
        (['b'], 1)
    """
    needle = text.strip().lower()
    return [
        dict(r)
        for r in rows
        if (not cls or r.get("class") == cls)
        and (correct is None or r.get("correct") is correct)
        and (not strategy or r.get("strategy") == strategy)
        and (not needle or needle in str(r.get("key", "")).lower())
    ]


def sort_rows(rows: Iterable[Mapping[str, Any]], column: str, descending: bool = False) -> list[dict[str, Any]]:
    """The rows sorted by ``column``: numbers by value, then text, then empty cells last in either direction.

    Ties keep their order (the dataset's). An unknown column leaves the order as it is.

    Example:
        >>> from camkit.explorer.tables import sort_rows
        >>> rows = [{"k": "a", "x": 0.5}, {"k": "b", "x": None}, {"k": "c", "x": 0.9}]
        >>> [r["k"] for r in sort_rows(rows, "x", descending=True)], [r["k"] for r in sort_rows(rows, "x")]
        (['c', 'a', 'b'], ['a', 'c', 'b'])
    """
    items = [dict(r) for r in rows]
    present = [r for r in items if order(r.get(column))[0] < 2]
    empty = [r for r in items if order(r.get(column))[0] == 2]
    present.sort(key=lambda r: order(r.get(column)), reverse=descending)  # stable both ways
    return present + empty


def audit_view(audit: AuditFolder, rows: Sequence[Mapping[str, Any]] | None = None) -> tuple[list[str], list[list[Any]]]:
    """The headers and cells of the audit table: key, class, prediction, confidence, correct, energy per region, ...

    Columns the audit did not write are left out; floats are rounded to 4 digits.

    Example:
        >>> from camkit.explorer.tables import AuditFolder, audit_view
        >>> audit = AuditFolder(Path("."), ["key", "correct", "energy_object"],
        ...                     [{"key": "a.png", "class": "cat", "correct": True, "energy_object": 0.123456}])
        >>> audit_view(audit)
        (['key', 'class', 'correct', 'energy_object'], [['a.png', 'cat', True, 0.1235]])
    """
    shown = [c for c in _SHOWN if c == "class" or c in audit.columns]
    shown += [c for c in audit.columns if c.startswith("energy_")]
    shown += [c for c in _AFTER if c in audit.columns]
    cells = [[cell(r.get(c)) for c in shown] for r in (audit.rows if rows is None else rows)]
    return shown, cells


@dataclass(frozen=True)
class RowFiles:
    """A row's files: the image (None when the data folder is gone), the saved overlay (None when absent), a note."""

    key: str
    image: Path | None
    overlay: Path | None
    note: str = ""


def resolve_row(audit: AuditFolder, key: str) -> RowFiles:
    """The image file and saved overlay of the row ``key``; the note says what could not be found.

    The overlay must lie inside the audit folder and the image inside the data folder: a
    ``results.csv`` edited to point elsewhere (``../../etc/passwd``) resolves to nothing.

    Raises:
        InvalidInputError: ``key`` is not a row of the audit.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from camkit.explorer.tables import read_audit, resolve_row
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "results.csv").write_text("key,overlay\\na.png,overlays/a.png\\n")
        >>> resolve_row(read_audit(folder), "a.png").note
        'the saved overlay overlays/a.png is missing; the data folder of this audit was not found'
    """
    row = next((r for r in audit.rows if r.get("key") == key), None)
    if row is None:
        raise InvalidInputError(f"no row {key!r} in {audit.folder / 'results.csv'}; pick a row of the table")
    notes = []
    overlay = _inside(audit.folder, row.get("overlay"), absolute=False)
    if overlay is None:
        notes.append(f"the saved overlay {row['overlay']} is missing" if row.get("overlay") else "no overlay was saved")
    image = _inside(audit.data_root, key, absolute=True) if audit.data_root is not None else None
    if audit.data_root is None:
        notes.append("the data folder of this audit was not found")
    elif image is None:
        notes.append(f"the image {key} is no longer under {audit.data_root}")
    return RowFiles(key, image, overlay, "; ".join(notes))


def _inside(root: Path | None, rel: Any, *, absolute: bool) -> Path | None:
    """``root / rel`` when it is a file inside ``root`` (or, with ``absolute``, an absolute ``rel`` as the manifest gave it)."""
    if root is None or not isinstance(rel, str) or not rel:
        return None
    if Path(rel).is_absolute():
        return Path(rel) if absolute and Path(rel).is_file() else None
    base = Path(os.path.abspath(root))
    path = Path(os.path.normpath(base / rel))  # lexical: "../" cannot climb out, symlinked data folders still work
    return path if path.is_file() and base in path.parents else None


def _pct(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def _region_findings(per_class: Mapping[str, Any], region: str) -> str | None:
    shares = {
        name: float(stats["energy"][region])
        for name, stats in per_class.items()
        if isinstance(stats, Mapping) and isinstance((stats.get("energy") or {}).get(region), (int, float))
    }
    if not shares:
        return None
    if region == "object":  # the class that looks least at its object
        low = min(shares, key=lambda k: shares[k])
        others = [v for k, v in shares.items() if k != low]
        rest = f" (other classes: at least {_pct(min(others))})" if others else ""
        return f"class {low!r}: only {_pct(shares[low])} of attention energy on the object{rest}"
    top = max(shares, key=lambda k: shares[k])
    others = [v for k, v in shares.items() if k != top]
    rest = f" (other classes: at most {_pct(max(others))})" if others else ""
    return f"class {top!r}: {_pct(shares[top])} of attention energy on the {region} region{rest}"


def audit_findings(audit: AuditFolder) -> list[str]:
    """What the audit found, as sentences: the run, accuracy, attention per region, errors, strategies.

    Read from ``summary.json``; with none, from the rows alone.

    Example:
        >>> from camkit.explorer.tables import AuditFolder, audit_findings
        >>> summary = {"method": "gradcam", "layer": "conv", "images": 4, "processed": 4, "errors": 0,
        ...            "accuracy": 0.75, "per_class": {"cat": {"energy": {"mark": 0.6}}, "dog": {"energy": {"mark": 0.1}}}}
        >>> audit_findings(AuditFolder(Path("."), ["key"], [], summary))
        ['gradcam on layer conv: 4 images, 4 audited, 0 failed; accuracy 75%', "class 'cat': 60% of attention energy on the mark region (other classes: at most 10%)"]
    """
    s = audit.summary
    if not s:
        return [f"{len(audit.rows)} images in results.csv; no summary.json, so no per-class findings"]
    images = s.get("images", len(audit.rows))
    accuracy = s.get("accuracy")
    lines = [
        f"{s.get('method', 'unknown method')} on layer {s.get('layer') or 'auto'}: {images} images, "
        f"{s.get('processed', images)} audited, {s.get('errors', 0)} failed; "
        + (f"accuracy {_pct(accuracy)}" if isinstance(accuracy, (int, float)) else "no labels, so no accuracy")
    ]
    per_class = s.get("per_class") or {}
    found = [*(s.get("energy") or {}), *audit.regions]
    found += [r for stats in per_class.values() if isinstance(stats, Mapping) for r in stats.get("energy") or {}]
    regions = list(dict.fromkeys(found))
    lines += [line for r in regions if (line := _region_findings(per_class, r))]
    graded = {k: v["accuracy"] for k, v in per_class.items() if isinstance(v, Mapping) and isinstance(v.get("accuracy"), (int, float))}
    if len(graded) > 1 and min(graded.values()) < max(graded.values()):
        worst = min(graded, key=lambda k: graded[k])
        lines.append(f"lowest accuracy: class {worst!r}, {_pct(graded[worst])}")
    for reason, count in list((s.get("error_reasons") or {}).items())[:3]:
        lines.append(f"{count} image(s) failed: {reason}")
    section = s.get("strategies") or {}
    ranked = [r for r in section.get("ranking") or [] if isinstance(r, Mapping) and r.get("kind") == "maps"]
    if ranked:
        top = ranked[0]
        lines.append(
            f"strategy ranked first: {top.get('name')} ({top.get('size')} images, {_pct(top.get('share'))} of its class, "
            f"accuracy {_pct(top.get('accuracy'))}): {top.get('why') or '-'}"
        )
    elif section.get("note"):
        lines.append(f"strategies: {section['note']}")
    return lines


_STRATEGY_COLUMNS = ("class", "strategy", "images", "share", "accuracy", "confidence", "focus", "why")


def class_strategies(audit: AuditFolder) -> tuple[list[str], list[list[Any]]]:
    """Headers and rows of the per-class strategies (found on the maps); no rows when the audit has none.

    Example:
        >>> from camkit.explorer.tables import AuditFolder, class_strategies
        >>> per = {"name": "cat/0", "size": 3, "share": 1.0, "accuracy": 1.0, "confidence": 0.9, "focus": 0.5, "why": "like the rest"}
        >>> summary = {"strategies": {"maps": {"cat": {"per_strategy": [per]}}}}
        >>> class_strategies(AuditFolder(Path("."), ["key"], [], summary))[1]
        [['cat', 'cat/0', 3, 1.0, 1.0, 0.9, 0.5, 'like the rest']]
    """
    maps = (audit.summary.get("strategies") or {}).get("maps") or {}
    rows = [
        [cls, s.get("name"), s.get("size"), *(cell(s.get(k)) for k in ("share", "accuracy", "confidence", "focus")), s.get("why")]
        for cls, group in sorted(maps.items())
        if isinstance(group, Mapping)
        for s in group.get("per_strategy") or []
        if isinstance(s, Mapping)
    ]
    return list(_STRATEGY_COLUMNS), rows
