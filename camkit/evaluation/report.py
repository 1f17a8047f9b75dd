"""``report.html`` of an evaluation: one self-contained page drawn from ``summary.json``.

No network access (a Content-Security-Policy forbids any fetch), no script: the diagrams are
inline SVG. Every string that comes from the data or the user (method names, file names, error
messages) is HTML-escaped. The look follows the audit's report (:mod:`camkit.audit.report`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..runs.html import escape as _e
from ..runs.html import page, table

__all__ = ["cd_diagram", "render"]

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}h3{font-size:15px;margin:16px 0 4px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td.t,th.t{text-align:left}.meta td{text-align:left}
.control{color:#777;font-style:italic}.best{font-weight:bold;background:#eef6ee}.small{color:#666;font-size:12px}
.verdict{border:2px solid #888;padding:10px 14px;background:#fafafa;font-size:15px}.ok{color:#070}.bad{color:#a00}
.bar{display:inline-block;height:10px;background:#4a7;vertical-align:middle}.err{color:#a00}
"""


def _f(value: Any, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _p(value: float | None) -> str:
    """A p-value: 3 decimals, or 2 significant digits below 0.001."""
    if value is None:
        return "n/a"
    return f"{value:.3f}" if value >= 0.001 else f"{value:.1e}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], text: int = 1) -> str:
    """An HTML table; cells are already HTML. The first ``text`` columns are left-aligned."""
    th = [f'<th class="t">{h}</th>' if i < text else f"<th>{h}</th>" for i, h in enumerate(head)]
    body = [[c if c.startswith("<td") else (f'<td class="t">{c}</td>' if i < text else f"<td>{c}</td>")
             for i, c in enumerate(r)] for r in rows]  # fmt: skip
    return table(th, body)


def _name(method: str, controls: Sequence[str]) -> str:
    return f'<span class="control">{_e(method)} (control)</span>' if method in controls else _e(method)


def cd_diagram(mean_ranks: Mapping[str, float], cd: float | None, controls: Sequence[str] = ()) -> str:
    """A critical-difference diagram (Demšar 2006) as inline SVG.

    Methods sit on an axis of mean rank (1, the best, on the left); a thick bar joins each
    largest group of methods whose mean ranks lie within ``cd`` of each other (not told apart
    by the Nemenyi test). A segment of length ``cd`` is drawn above the axis.

    Example:
        >>> from camkit.evaluation.report import cd_diagram
        >>> svg = cd_diagram({"a": 1.2, "b": 2.0, "c": 2.8}, cd=1.0)
        >>> svg.startswith("<svg") and svg.count("<line") >= 5
        True
    """
    k = len(mean_ranks)
    order = sorted(mean_ranks, key=lambda m: mean_ranks[m])
    width, left, right = 760, 150, 150
    span = width - left - right
    rows = (k + 1) // 2
    height = 66 + 18 * rows

    def x(rank: float) -> float:
        return left + span * (rank - 1) / max(k - 1, 1)

    parts = [f'<svg width="{width}" height="{height}" font-size="12">']
    parts.append(f'<line x1="{x(1)}" y1="40" x2="{x(k)}" y2="40" stroke="#333"/>')
    for r in range(1, k + 1):
        parts.append(f'<line x1="{x(r)}" y1="35" x2="{x(r)}" y2="40" stroke="#333"/>')
        parts.append(f'<text x="{x(r)}" y="30" text-anchor="middle">{r}</text>')
    if cd is not None and k > 1:
        parts.append(f'<line x1="{x(1)}" y1="12" x2="{x(1 + cd)}" y2="12" stroke="#a00" stroke-width="2"/>')
        parts.append(f'<text x="{x(1 + cd) + 6}" y="16" fill="#a00">CD {cd:.2f}</text>')
    for i, m in enumerate(order):
        rank = mean_ranks[m]
        on_left = i < (k + 1) // 2
        depth = 56 + 18 * (i if on_left else k - 1 - i)
        end = left - 10 if on_left else width - right + 10
        colour = "#888" if m in controls else "#222"
        parts.append(f'<polyline points="{x(rank)},40 {x(rank)},{depth} {end},{depth}" fill="none" stroke="{colour}"/>')
        anchor = "end" if on_left else "start"
        tx = end - 4 if on_left else end + 4
        parts.append(f'<text x="{tx}" y="{depth + 4}" text-anchor="{anchor}" fill="{colour}">{_e(m)} ({rank:.2f})</text>')
    if cd is not None:
        groups: list[tuple[int, int]] = []
        for i in range(k):
            j = i
            while j + 1 < k and mean_ranks[order[j + 1]] - mean_ranks[order[i]] <= cd:
                j += 1
            if j > i and not any(a <= i and j <= b for a, b in groups):
                groups.append((i, j))
        for g, (a, b) in enumerate(groups):
            y = 46 + 5 * g
            parts.append(
                f'<line x1="{x(mean_ranks[order[a]]) - 3}" y1="{y}" x2="{x(mean_ranks[order[b]]) + 3}" y2="{y}" '
                'stroke="#000" stroke-width="3"/>'
            )
    parts.append("</svg>")
    return "".join(parts)


def _scores_table(s: Mapping[str, Any]) -> str:
    methods, controls, metrics = s["methods"], s["controls"], s["metrics"]
    head = ["method", *[f"{_e(m)} {'&uarr;' if i['higher_is_better'] else '&darr;'}" for m, i in metrics.items()],
            "mean rank (all metrics)"]  # fmt: skip
    rows = []
    for method in sorted(methods, key=lambda m: s["overall"][m]["mean_rank"] or float("inf")):
        cells = [_name(method, controls)]
        for metric, info in metrics.items():
            v = s["scores"][method][metric]
            cls = ' class="best"' if info["best"] == method else ""
            cells.append(
                f"<td{cls}>{_f(v['mean'])} <span class=small>[{_f(v['low'])}, {_f(v['high'])}]<br>"
                f"rank {_f(v['mean_rank'], 2)}</span></td>"
            )
        cells.append(_f(s["overall"][method]["mean_rank"], 2))
        rows.append(cells)
    return _table(head, rows)


def _unranked_table(s: Mapping[str, Any]) -> str:
    unranked = s.get("unranked") or {}
    if not unranked:
        return ""
    rows = [[_name(method, s["controls"]), *[
        f"{_f(u['scores'][method]['mean'])} <span class=small>[{_f(u['scores'][method]['low'])}, "
        f"{_f(u['scores'][method]['high'])}]</span>" for u in unranked.values()]] for method in s["methods"]]  # fmt: skip
    notes = "".join(f"<li>{_e(m)}: {_e(u['summary'])}</li>" for m, u in unranked.items())
    return ("<h2>Not ranked</h2><p>Metrics without a better direction: mean and 95% bootstrap interval, kept out "
            f"of the ranks and the verdict.</p><ul class=small>{notes}</ul>"
            + _table(["method", *[_e(m) for m in unranked]], rows))  # fmt: skip


def _gates_table(s: Mapping[str, Any]) -> str:
    rows = []
    for method in s["methods"]:
        cells = [_name(method, s["controls"])]
        for gate in ("model_randomisation", "random_logit"):
            g = s["gates"].get(method, {}).get(gate)
            if not g or g.get("passed") is None:
                cells.append(f"not run {_e((g or {}).get('note', ''))[:80]}")
            else:
                word = '<span class="ok">pass</span>' if g["passed"] else '<span class="bad">FAIL</span>'
                cells.append(f"{word} (rho {_f(g['spearman'], 2)})")
        rows.append(cells)
    return _table(["method", "model randomisation", "random logit"], rows)


def _per_metric(s: Mapping[str, Any]) -> str:
    parts = []
    for metric, info in s["metrics"].items():
        ranks = {m: s["scores"][m][metric]["mean_rank"] for m in s["methods"]}
        if any(v is None for v in ranks.values()):
            parts.append(f"<h3>{_e(metric)}</h3><p>No image has a score for every method.</p>")
            continue
        fr = info["friedman"]
        parts.append(
            f"<h3>{_e(metric)}</h3><p class=small>{_e(info['summary'])}. {info['images']} images; "
            f"{'Wilcoxon W' if len(ranks) == 2 else 'Friedman chi2'} {_f(fr['chi2'], 2)}, p {_p(fr['p'])}; Nemenyi critical difference {_f(info['nemenyi_cd'], 2)} "
            "(methods joined by a bar are not told apart at 5%).</p>"
            f"{cd_diagram(ranks, info['nemenyi_cd'], s['controls'])}"
        )
    return "".join(parts)


def _first_table(s: Mapping[str, Any]) -> str:
    metrics = list(s["metrics"])
    rows = []
    for method in s["methods"]:
        cells = [_name(method, s["controls"])]
        for metric in metrics:
            p = s["scores"][method][metric]["prob_first"]
            width = 0 if p is None else round(80 * p)
            cells.append(f'<span class="bar" style="width:{width}px"></span> {_f(p, 2)}')
        rows.append(cells)
    return _table(["method", *[_e(m) for m in metrics]], rows)


def _reliability_table(s: Mapping[str, Any]) -> str:
    rows = []
    for metric, i in s["metrics"].items():
        rows.append([
            _e(metric), _e(i["family"]), str(i["images"]), _f(i["alpha"], 2), _f(i["split_half"]["rho"], 2),
            _f(i["split_half"]["spearman_brown"], 2), _p(i["friedman"]["p"]),
            '<span class="ok">yes</span>' if i["reliable"] else '<span class="bad">no</span>',
            "yes" if i["separates"] else "no",
        ])  # fmt: skip
    head = ["metric", "family", "images", "Krippendorff alpha", "split-half rho", "Spearman-Brown", "Friedman p",
            "reliable", "separates"]  # fmt: skip
    agreement = [[_e(a["family"]), _e(a["a"]), _e(a["b"]), _f(a["spearman"], 2)] for a in s["agreement"]]
    more = _table(["family", "metric", "metric", "Spearman of mean ranks"], agreement, text=3) if agreement else (
        "<p>No two metrics of the same family were run.</p>")  # fmt: skip
    return _table(head, rows, text=2) + "<h3>Agreement between metrics of the same family</h3>" + more


def render(summary: Mapping[str, Any]) -> str:
    """The report's HTML for an evaluation summary (as :func:`camkit.evaluation.outputs.finish` writes it).

    Example:
        >>> from camkit.evaluation.analysis import analyse
        >>> from camkit.evaluation.report import render
        >>> from camkit.evaluation.table import METRICS
        >>> import numpy as np
        >>> s = analyse({"deletion": np.array([[0.1, 0.5, 0.9]] * 5)}, METRICS, ["a", "b", "c"], controls=["c"])
        >>> page = render({**s, "images": 5, "scored": 5, "errors": 0, "error_reasons": {}, "model": {}})
        >>> page.startswith("<!DOCTYPE html>"), "http" in page.split("</head>")[1]
        (True, False)
    """
    s = summary
    model = s.get("model", {})
    meta = [
        ["model", _e(str(model.get("spec", model)))], ["data", _e(str(s.get("data", {}).get("path", "")))],
        ["images", f"{s['scored']} scored of {s['images']} ({s['errors']} failed)"],
        ["target", _e(str(s.get("target", "")))], ["region", _e(str(s.get("region")))],
        ["gate images", str(s.get("gate_images", ""))], ["seed", str(s.get("seed", ""))],
        ["seconds", str(s.get("seconds", ""))], ["camkit", _e(str(s.get("camkit_version", "")))],
    ]  # fmt: skip
    errors = ""
    if s["errors"]:
        errors = '<h2 class="err">Errors</h2>' + _table(["reason", "images"], [[_e(k), str(v)] for k, v in s["error_reasons"].items()])
    body = (
        "<h1>camkit evaluate: which method can I trust?</h1>"
        f'<table class="meta">{"".join(f"<tr><td>{a}</td><td>{b}</td></tr>" for a, b in meta)}</table>'
        f'<h2>Verdict</h2><p class="verdict">{_e(s["verdict"]["text"])}</p>'
        "<h2>Methods by metric</h2><p>Mean score, its 95% bootstrap interval and the mean rank over images (1 = best; "
        "&uarr; higher is better, &darr; lower is better). The best mean per metric is highlighted. Controls need no "
        f"model: a method that does not beat them says little.</p>{_scores_table(s)}{_unranked_table(s)}"
        f"<h2>Sanity gates</h2><p>Spearman correlation of each method's maps with the maps of a fully re-initialised "
        "model copy, and with the maps of a random other class, on the first images; above 0.5 fails (the map does "
        f"not depend on what it claims to explain).</p>{_gates_table(s)}"
        f"<h2>Per-image ranks</h2>{_per_metric(s)}"
        "<h2>Probability of ranking first</h2><p>Share of 2000 bootstrap resamples of the images in which each "
        f"method has the best mean.</p>{_first_table(s)}"
        "<h2>Reliability of each metric on this data</h2><p>After Tomsett et al. 2020: Krippendorff's alpha treats "
        "each image as a rater ranking the methods (1: every image agrees); split-half compares the mean ranks of two "
        "random halves of the images. A metric is reliable here at alpha &ge; 0.667 and Spearman-Brown &ge; 0.7."
        f"</p>{_reliability_table(s)}{errors}"
    )
    return page("camkit evaluate", _STYLE, body)
