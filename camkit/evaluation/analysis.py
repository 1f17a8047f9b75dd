"""From score tables to the summary: intervals, ranks, tests, reliability and the verdict.

:func:`analyse` takes one table per metric (images x methods, NaN where a score is missing) and
returns the content of ``summary.json``. A metric is *reliable* on the data when its per-image
rankings agree (Krippendorff's alpha >= :data:`ALPHA_MIN`) and two random halves of the images
rank the methods alike (Spearman-Brown >= :data:`SPLIT_MIN`); it *separates* methods when the
Friedman test rejects equal ranks (p < :data:`P_MAX`). The verdict names a best method only
when every reliable, separating metric names the same non-control method, its bootstrap interval
is apart from every other method's, and it passes the sanity gates; otherwise it says why not.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from .stats import (
    bootstrap_interval,
    complete_rows,
    friedman,
    image_ranks,
    nemenyi_cd,
    prob_first,
    rank_alpha,
    rank_correlation,
    split_half,
)
from .table import MetricSpec

__all__ = ["ALPHA_MIN", "P_MAX", "SPLIT_MIN", "analyse", "verdict"]

ALPHA_MIN = 0.667
"""Krippendorff's lowest alpha for tentative conclusions (Krippendorff 2004)."""
SPLIT_MIN = 0.7
"""Lowest split-half agreement (Spearman-Brown corrected) for a reliable metric."""
P_MAX = 0.05
"""Friedman p-value below which a metric is said to separate the methods."""


def _num(value: float) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _metric_part(
    table: np.ndarray, spec: MetricSpec, methods: Sequence[str], seed: int
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    higher = spec.higher_is_better
    if higher is None:  # analyse() summarises these apart (_unranked)
        raise InvalidInputError(f"metric {spec.name!r} has no better direction and cannot be ranked")
    rows = complete_rows(table)
    n, k = rows.shape
    per_method: dict[str, dict[str, Any]] = {}
    info: dict[str, Any] = {
        "family": spec.family, "higher_is_better": spec.higher_is_better, "images": int(n),
        "images_scored": int((~np.isnan(table)).any(axis=1).sum()), "summary": spec.summary,
    }  # fmt: skip
    ranks = image_ranks(rows, higher) if n else np.zeros((0, k))
    chi2, p = friedman(rows)
    alpha = rank_alpha(ranks)
    rho, sb = split_half(ranks, seed)
    wins = prob_first(rows, higher, seed) if n else np.full(k, math.nan)
    for j, method in enumerate(methods):
        low, high = bootstrap_interval(rows[:, j], seed + j) if n else (math.nan, math.nan)
        per_method[method] = {
            "mean": _num(float(rows[:, j].mean())) if n else None, "low": _num(low), "high": _num(high),
            "mean_rank": _num(float(ranks[:, j].mean())) if n else None, "prob_first": _num(float(wins[j])),
        }  # fmt: skip
    reliable = not math.isnan(alpha) and alpha >= ALPHA_MIN and (math.isnan(sb) or sb >= SPLIT_MIN)
    info.update(
        friedman={"chi2": _num(chi2), "p": _num(p)}, nemenyi_cd=_num(nemenyi_cd(k, n)), alpha=_num(alpha),
        split_half={"rho": _num(rho), "spearman_brown": _num(sb)}, reliable=reliable,
        separates=not math.isnan(p) and p < P_MAX,
    )  # fmt: skip
    info.update(_leader(per_method, higher))
    return info, per_method


def _unranked(table: np.ndarray, spec: MetricSpec, methods: Sequence[str], seed: int) -> dict[str, Any]:
    """A metric without a better direction: per method, the mean and its 95% bootstrap interval only."""
    per_method = {}
    for j, method in enumerate(methods):
        column = table[:, j]
        scored = column[~np.isnan(column)]
        low, high = bootstrap_interval(column, seed + j) if scored.size else (math.nan, math.nan)
        per_method[method] = {"mean": _num(float(scored.mean())) if scored.size else None, "low": _num(low),
                              "high": _num(high)}  # fmt: skip
    return {"family": spec.family, "summary": spec.summary, "scores": per_method}


def _leader(per_method: Mapping[str, Mapping[str, Any]], higher: bool) -> dict[str, Any]:
    """The method with the best mean, and whether its interval is apart from every other's."""
    scored = {m: v for m, v in per_method.items() if v["mean"] is not None}
    if not scored:
        return {"best": None, "tied": [], "runner_up": None, "separated": False}
    order = sorted(scored, key=lambda m: scored[m]["mean"], reverse=higher)
    best = scored[order[0]]
    tied = [m for m in order if scored[m]["mean"] == best["mean"]]
    apart = True
    for other in order[1:]:
        o = scored[other]
        if None in (best["low"], best["high"], o["low"], o["high"]):
            apart = False
        elif higher and not best["low"] > o["high"]:
            apart = False
        elif not higher and not best["high"] < o["low"]:
            apart = False
    return {
        "best": order[0], "tied": tied, "runner_up": order[1] if len(order) > 1 else None,
        "separated": apart and len(order) > 1,
    }  # fmt: skip


def analyse(
    tables: Mapping[str, np.ndarray],
    specs: Mapping[str, MetricSpec],
    methods: Sequence[str],
    *,
    controls: Sequence[str] = (),
    gates: Mapping[str, Mapping[str, Any]] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The statistics of an evaluation (the ``summary.json`` content without the run's metadata).

    Args:
        tables: metric name -> scores [N images, K methods] (NaN: no score), columns in ``methods`` order.
        specs: metric name -> its :class:`~camkit.evaluation.table.MetricSpec` (family, direction).
        methods: the column names; controls: the columns that are controls.
        gates: method -> gate name -> ``{"passed": bool | None, ...}``.
        seed: seeds every bootstrap and the split-half shuffle.

    Returns:
        ``{"methods", "controls", "metrics", "scores", "overall", "agreement", "gates", "unranked", "verdict"}``;
        ``scores[method][metric]`` holds ``mean``, ``low``, ``high`` (95% bootstrap), ``mean_rank`` and
        ``prob_first``. A metric without a better direction (``higher_is_better=None``) is not ranked:
        it is left out of ``metrics`` and ``scores`` and summarised in ``unranked[metric]`` (family,
        summary, and per method the mean and its interval).

    Example:
        >>> import numpy as np
        >>> from camkit.evaluation.analysis import analyse
        >>> from camkit.evaluation.table import METRICS
        >>> rng = np.random.default_rng(0)
        >>> table = np.stack([rng.normal(m, 0.05, 30) for m in (0.9, 0.5, 0.1)], axis=1)  # [30, 3]
        >>> s = analyse({"insertion": table}, METRICS, ["a", "b", "edge"], controls=["edge"])
        >>> s["metrics"]["insertion"]["best"], s["metrics"]["insertion"]["reliable"], s["verdict"]["best"]
        ('a', True, 'a')
    """
    gates = gates or {}
    metrics: dict[str, Any] = {}
    scores: dict[str, dict[str, Any]] = {m: {} for m in methods}
    unranked = {name: _unranked(np.asarray(t, dtype=float), specs[name], methods, seed)
                for name, t in tables.items() if specs[name].higher_is_better is None}  # fmt: skip
    tables = {name: t for name, t in tables.items() if name not in unranked}
    for name, table in tables.items():
        info, per_method = _metric_part(np.asarray(table, dtype=float), specs[name], methods, seed)
        metrics[name] = info
        for method, values in per_method.items():
            scores[method][name] = values
    overall = {}
    for method in methods:
        ranks = [v["mean_rank"] for v in scores[method].values() if v["mean_rank"] is not None]
        overall[method] = {"mean_rank": _num(float(np.mean(ranks))) if ranks else None}
    agreement = []
    names = list(tables)
    for a, b in itertools.combinations(names, 2):
        if specs[a].family != specs[b].family:
            continue
        ra = [scores[m][a]["mean_rank"] for m in methods]
        rb = [scores[m][b]["mean_rank"] for m in methods]
        if None in ra or None in rb:
            continue
        rho = rank_correlation(np.array(ra, dtype=float), np.array(rb, dtype=float))
        agreement.append({"family": specs[a].family, "a": a, "b": b, "spearman": _num(rho)})
    summary = {
        "methods": list(methods), "controls": list(controls), "metrics": metrics, "scores": scores,
        "overall": overall, "agreement": agreement, "gates": {m: dict(g) for m, g in gates.items()},
        "unranked": unranked,
    }  # fmt: skip
    summary["verdict"] = verdict(summary)
    return summary


def _failed_gates(gates: Mapping[str, Any], method: str) -> list[str]:
    return [name for name, g in gates.get(method, {}).items() if g.get("passed") is False]


def verdict(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The plain verdict: ``{"best": method or None, "text": one paragraph, "usable": [metrics]}``.

    Example:
        >>> from camkit.evaluation.analysis import verdict
        >>> verdict({"metrics": {}, "controls": [], "gates": {}})["text"]
        'No best method can be named: no metric was computed.'
    """
    metrics: Mapping[str, Any] = summary["metrics"]
    controls = set(summary["controls"])
    gates = summary["gates"]
    if not metrics:
        return {"best": None, "usable": [], "text": "No best method can be named: no metric was computed."}
    usable = [m for m, i in metrics.items() if i["reliable"] and i["separates"]]

    def fmt(value: Any) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    if not usable:
        why = "; ".join(
            f"{m}: alpha {fmt(i['alpha'])}, split-half {fmt(i['split_half']['spearman_brown'])}, "
            f"Friedman p {fmt(i['friedman']['p'])}"
            for m, i in metrics.items()
        )
        text = (
            f"No best method can be named: no metric is both reliable on this data (Krippendorff's alpha >= "
            f"{ALPHA_MIN}, split-half >= {SPLIT_MIN}) and separating the methods (Friedman p < {P_MAX}). {why}."
        )
        return {"best": None, "usable": [], "text": text}
    leaders = {m: metrics[m]["best"] for m in usable}
    problems = []
    tied = {m: metrics[m]["tied"] for m in usable if len(metrics[m]["tied"]) > 1}
    if tied:
        problems.append("methods tie for the best mean on " + ", ".join(f"{m} ({', '.join(t)})" for m, t in tied.items()))
    on_control = {m: b for m, b in leaders.items() if b in controls}
    if on_control:
        problems.append(
            "a control leads on " + ", ".join(f"{m} ({b})" for m, b in on_control.items())
            + ": there the methods do no better than a map that ignores the model"
        )
    if len(set(leaders.values())) > 1 and not set.intersection(*(set(metrics[m]["tied"]) for m in usable)):
        problems.append("the reliable metrics disagree: " + ", ".join(f"{m} -> {b}" for m, b in leaders.items()))
    blurred = [m for m in usable if not metrics[m]["separated"] and m not in tied]
    if blurred:
        problems.append(
            "the leader's 95% interval overlaps another method's on "
            + ", ".join(f"{m} ({metrics[m]['best']} vs {metrics[m]['runner_up']})" for m in blurred)
        )
    failing = {b: _failed_gates(gates, b) for b in dict.fromkeys(leaders.values())}  # in the leaders' order
    failing = {b: f for b, f in failing.items() if f}
    if failing:
        problems.append("; ".join(f"{b} fails the {', '.join(f)} gate" for b, f in failing.items()))
    context = "Counted (reliable and separating the methods): " + ", ".join(
        f"{m} (led by {b})" for m, b in leaders.items()
    ) + "."
    if problems:
        text = f"No best method can be named: {'; '.join(problems)}. {context}"
        return {"best": None, "usable": usable, "text": text}
    best = next(iter(leaders.values()))
    text = (
        f"Best method on this model and data: {best}. It leads on every reliable metric that separates the methods "
        f"({', '.join(usable)}), its 95% interval is apart from every other method's there, and it passes the sanity "
        "gates."
    )
    unreliable = [m for m in metrics if m not in usable]
    if unreliable:
        text += f" Not counted (unreliable or not separating here): {', '.join(unreliable)}."
    return {"best": best, "usable": usable, "text": text}
