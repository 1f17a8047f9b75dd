"""The merged outputs of an evaluation: ``scores.csv``, ``summary.json`` and ``report.html``.

Rank 0 reads the batches' rows from ``parts/`` (:func:`camkit.runs.outdir.iter_part_rows`),
builds one table per metric (images x methods, in the data's order), writes every score to
``scores.csv`` and the statistics of :func:`camkit.evaluation.analysis.analyse` to ``summary.json``,
then draws the report (:mod:`camkit.evaluation.report`).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._version import __version__
from ..runs.files import atomic_write
from ..runs.outdir import iter_part_rows
from .analysis import analyse
from .report import render

if TYPE_CHECKING:
    from .plan import Plan

__all__ = ["GATES", "SCORE_COLUMNS", "finish"]

GATES = "gates.json"
SCORE_COLUMNS = ["key", "label", "target", "confidence", "method", "control", "metric", "value"]


def _read_rows(out: Path) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for line in iter_part_rows(out):
        row = json.loads(line)
        rows[row["key"]] = row
    return rows


def finish(out: Path, keys: Sequence[str], plan: Plan, meta: dict[str, Any]) -> dict[str, Any]:
    """Merge the parts of ``out`` for the images ``keys`` (in order); write the outputs; return the summary."""
    rows = _read_rows(out)
    methods, names = plan.methods, [m.name for m in plan.metrics]
    tables = {name: np.full((len(keys), len(methods)), math.nan) for name in names}
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(SCORE_COLUMNS)
    reasons: Counter[str] = Counter()
    missing = 0
    for i, key in enumerate(keys):
        row = rows.get(key)
        if row is None:
            missing += 1
            continue
        if row.get("error"):
            reasons[row["error"]] += 1
            continue
        for j, method in enumerate(methods):
            per = row["scores"].get(method, {})
            for name in names:
                value = per.get(name)
                if value is not None:
                    tables[name][i, j] = value
                writer.writerow([key, row.get("label") or "", row["target"], f"{row['confidence']:.6g}", method,
                                 int(method in plan.controls), name, "" if value is None else f"{value:.6g}"])  # fmt: skip
    atomic_write(out / "scores.csv", buffer.getvalue())
    gates_file = out / GATES
    gates: dict[str, Any] = {"images": 0, "gates": {}}
    if gates_file.is_file():
        gates = json.loads(gates_file.read_text(encoding="utf-8"))
    specs = {m.name: m for m in plan.metrics}
    stats = analyse(tables, specs, methods, controls=plan.controls, gates=gates["gates"], seed=plan.seed)
    summary = {
        "camkit_version": __version__, "images": len(keys), "scored": len(keys) - missing - sum(reasons.values()),
        "errors": sum(reasons.values()), "error_reasons": dict(reasons.most_common()), "missing": missing,
        "gate_images": gates["images"], **meta, **stats,
        "metric_costs": {m.name: m.cost for m in plan.metrics},
    }  # fmt: skip
    atomic_write(out / "summary.json", json.dumps(summary, indent=1, allow_nan=False))
    atomic_write(out / "report.html", render(summary))
    return summary
