"""An evaluation's output folder read into plain rows: the ranking with intervals, the verdict, per-image scores.

The audit side and the shared readers are in :mod:`camkit.explorer.tables` (which re-exports these).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError
from ._read import cell, folder_of, holds, order, read_csv, read_json

__all__ = ["EvaluationFolder", "ranking_view", "read_evaluation", "scores_view"]


@dataclass(frozen=True)
class EvaluationFolder:
    """An evaluation's output folder, read: ``summary.json`` and the rows of ``scores.csv`` ([] when absent)."""

    folder: Path
    summary: dict[str, Any]
    scores: list[dict[str, Any]] = field(default_factory=list)

    @property
    def methods(self) -> list[str]:
        """The methods, in the summary's order (the controls last)."""
        return [str(m) for m in self.summary.get("methods") or self.summary.get("scores") or []]

    @property
    def metrics(self) -> list[str]:
        """The metrics, in the summary's order."""
        return [str(m) for m in self.summary.get("metrics") or []]

    @property
    def verdict(self) -> str:
        """The verdict sentence (which method to trust, or why none can be named)."""
        verdict = self.summary.get("verdict") or {}
        return str(verdict.get("text") or "") if isinstance(verdict, Mapping) else str(verdict)


def read_evaluation(path: str | os.PathLike[str]) -> EvaluationFolder:
    """Read an evaluation folder (``summary.json`` with ``scores`` required; ``scores.csv`` when present).

    Raises:
        InvalidInputError: the folder is missing, holds no evaluation summary (an audit is named as such).

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from camkit.explorer.tables import read_evaluation
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "summary.json").write_text(json.dumps({"methods": ["gradcam"], "scores": {"gradcam": {}}}))
        >>> read_evaluation(folder).methods, read_evaluation(folder).scores
        (['gradcam'], [])
    """
    folder = folder_of(path, "evaluate")
    summary = read_json(folder / "summary.json")
    if summary is None or not isinstance(summary.get("scores"), Mapping):
        hint = " (it looks like an audit: pass it as an audit, --audit)" if (folder / "results.csv").is_file() else ""
        raise InvalidInputError(
            f"{folder} holds no evaluation summary.json (with per-method scores){hint}; it holds {holds(folder)}. "
            "Pass the --out folder of a finished `camkit evaluate`"
        )
    scores: list[dict[str, Any]] = []
    if (folder / "scores.csv").is_file():
        _columns, scores = read_csv(folder / "scores.csv")
    return EvaluationFolder(folder, summary, scores)


def ranking_view(evaluation: EvaluationFolder) -> tuple[list[str], list[list[Any]]]:
    """The ranking: one row per method, best mean rank first; per metric "mean [low, high]"; controls marked.

    Example:
        >>> from camkit.explorer.tables import EvaluationFolder, ranking_view
        >>> summary = {"methods": ["a", "b"], "controls": ["b"], "metrics": {"m": {"higher_is_better": True}},
        ...            "overall": {"a": {"mean_rank": 1.25}, "b": {"mean_rank": 1.75}},
        ...            "scores": {"a": {"m": {"mean": 0.5, "low": 0.4, "high": 0.6}}, "b": {"m": {"mean": 0.1}}}}
        >>> ranking_view(EvaluationFolder(Path("."), summary))
        (['method', 'control', 'mean rank', 'm (higher is better)'], [['a', False, 1.25, '0.5 [0.4, 0.6]'], ['b', True, 1.75, '0.1']])
    """
    s = evaluation.summary
    metrics = s.get("metrics") or {}
    controls = set(s.get("controls") or [])
    overall = s.get("overall") or {}
    headers = ["method", "control", "mean rank"]
    for name in evaluation.metrics:
        spec = metrics.get(name) if isinstance(metrics, Mapping) else None
        better = (spec or {}).get("higher_is_better") if isinstance(spec, Mapping) else None
        headers.append(name + ("" if better is None else " (higher is better)" if better else " (lower is better)"))
    rows = []
    for method in evaluation.methods:
        rank = (overall.get(method) or {}).get("mean_rank")
        cells: list[Any] = [method, method in controls, cell(rank) if isinstance(rank, float) else rank]
        per = (s.get("scores") or {}).get(method) or {}
        for name in evaluation.metrics:
            cells.append(_interval(per.get(name) or {}))
        rows.append(cells)
    rows.sort(key=lambda r: order(r[2]))
    return headers, rows


def _interval(stats: Mapping[str, Any]) -> str:
    def g(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, (int, float)) and math.isfinite(value) else "-"

    if not isinstance(stats.get("mean"), (int, float)):
        return "-"
    if isinstance(stats.get("low"), (int, float)) and isinstance(stats.get("high"), (int, float)):
        return f"{g(stats['mean'])} [{g(stats['low'])}, {g(stats['high'])}]"
    return g(stats["mean"])


_SCORE_COLUMNS = ("key", "label", "target", "method", "metric", "value")


def scores_view(
    evaluation: EvaluationFolder, *, method: str | None = None, metric: str | None = None, text: str = ""
) -> tuple[list[str], list[list[Any]]]:
    """The per-image scores of one method and/or metric (all when None), whose key holds ``text``.

    Example:
        >>> from camkit.explorer.tables import EvaluationFolder, scores_view
        >>> scores = [{"key": "a.png", "label": "cat", "target": 0, "method": "gradcam", "metric": "m", "value": 0.25},
        ...           {"key": "a.png", "label": "cat", "target": 0, "method": "edge", "metric": "m", "value": 0.5}]
        >>> scores_view(EvaluationFolder(Path("."), {}, scores), method="edge")[1]
        [['a.png', 'cat', 0, 'edge', 'm', 0.5]]
    """
    needle = text.strip().lower()
    rows = [
        [cell(r.get(c)) for c in _SCORE_COLUMNS]
        for r in evaluation.scores
        if (not method or r.get("method") == method)
        and (not metric or r.get("metric") == metric)
        and (not needle or needle in str(r.get("key", "")).lower())
    ]
    return list(_SCORE_COLUMNS), rows
