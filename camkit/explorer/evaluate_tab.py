"""The explorer's Evaluate tab: an evaluation's verdict, its ranking with intervals and gates, per-image scores.

:class:`EvaluationBrowser` holds the callbacks as plain Python; :func:`build_evaluate_tab` lays
them out with gradio (imported when the tab is built).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .audit_tab import ALL, SHOWN_ROWS, markdown_text, read_labelled
from .evaluation_tables import EvaluationFolder, ranking_view, read_evaluation, scores_view

__all__ = ["EvaluationBrowser", "build_evaluate_tab", "gates_view"]


def gates_view(evaluation: EvaluationFolder) -> tuple[list[str], list[list[Any]]]:
    """The sanity gates: one row per method, one column per gate, "passed (rho)" or "failed (rho)".

    Example:
        >>> from pathlib import Path
        >>> from camkit.explorer.evaluate_tab import gates_view
        >>> from camkit.explorer.evaluation_tables import EvaluationFolder
        >>> summary = {"methods": ["gradcam"], "scores": {}, "gates": {"gradcam": {"random_logit": {"spearman": 0.1, "passed": True}}}}
        >>> gates_view(EvaluationFolder(Path("."), summary))
        (['method', 'random_logit'], [['gradcam', 'passed (0.10)']])
    """
    gates = evaluation.summary.get("gates") or {}
    names = list(dict.fromkeys(g for per in gates.values() if isinstance(per, Mapping) for g in per))
    rows = []
    for method in evaluation.methods:
        per = gates.get(method) or {}
        cells: list[Any] = [method]
        for name in names:
            gate = per.get(name)
            if not isinstance(gate, Mapping):
                cells.append("-")
                continue
            rho = gate.get("spearman")
            value = f" ({rho:.2f})" if isinstance(rho, (int, float)) else ""
            cells.append(("passed" if gate.get("passed") else "failed") + value + (f": {gate['note']}" if gate.get("note") else ""))
        rows.append(cells)
    return ["method", *names], rows if names else []


class EvaluationBrowser:
    """The Evaluate tab's state and callbacks (no gradio).

    Args:
        evaluations: evaluation folders (``camkit evaluate --out``); one that cannot be read is
            listed with its error.

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from camkit.explorer.evaluate_tab import EvaluationBrowser
        >>> folder = Path(tempfile.mkdtemp()) / "eval"
        >>> folder.mkdir()
        >>> summary = {"methods": ["gradcam"], "scores": {}, "verdict": {"text": "gradcam is best."}}
        >>> _ = (folder / "summary.json").write_text(json.dumps(summary))
        >>> browser = EvaluationBrowser([folder])
        >>> browser.labels, browser.verdict("eval").endswith("gradcam is best.")
        (['eval'], True)
    """

    def __init__(self, evaluations: Sequence[str | os.PathLike[str]]) -> None:
        self.labels, self.evaluations, self.errors = read_labelled(evaluations, read_evaluation)

    def verdict(self, label: str) -> str:
        """The verdict as Markdown (or why the folder cannot be shown)."""
        if label in self.errors:
            return f"**This evaluation cannot be shown.** {self.errors[label]}"
        evaluation = self.evaluations.get(label)
        if evaluation is None:
            return "No evaluation chosen."
        s = evaluation.summary
        counts = (f"{s['images']} images, {s.get('scored', s['images'])} scored, {s.get('errors', 0)} failed. "
                  if isinstance(s.get("images"), int) else "")  # fmt: skip
        text = evaluation.verdict or "The summary holds no verdict."
        return f"**Verdict** ({markdown_text(str(evaluation.folder))})\n\n{markdown_text(counts + text)}"

    def ranking(self, label: str) -> tuple[list[str], list[list[Any]]]:
        """The ranking table (best mean rank first)."""
        evaluation = self.evaluations.get(label)
        return ranking_view(evaluation) if evaluation is not None else (["method"], [])

    def gates(self, label: str) -> tuple[list[str], list[list[Any]]]:
        """The sanity-gate table ([] rows when the run had none)."""
        evaluation = self.evaluations.get(label)
        return gates_view(evaluation) if evaluation is not None else (["method"], [])

    def choices(self, label: str) -> dict[str, list[str]]:
        """The score filters' choices: ``method`` and ``metric``."""
        evaluation = self.evaluations.get(label)
        if evaluation is None:
            return {"method": [ALL], "metric": [ALL]}
        return {"method": [ALL, *evaluation.methods], "metric": [ALL, *evaluation.metrics]}

    def scores(self, label: str, method: str = ALL, metric: str = ALL, text: str = "") -> tuple[list[str], list[list[Any]], str]:
        """Headers, the first :data:`~camkit.explorer.audit_tab.SHOWN_ROWS` per-image scores asked for, a count line."""
        evaluation = self.evaluations.get(label)
        if evaluation is None:
            return ["key"], [], ""
        if not evaluation.scores:
            return ["key"], [], "no scores.csv in this folder"
        headers, rows = scores_view(evaluation, method=None if method == ALL else method,
                                    metric=None if metric == ALL else metric, text=text or "")  # fmt: skip
        shown = f"showing the first {SHOWN_ROWS} of " if len(rows) > SHOWN_ROWS else ""
        return headers, rows[:SHOWN_ROWS], f"{shown}{len(rows)} of {len(evaluation.scores)} scores"


def build_evaluate_tab(session: Any, evaluations: Sequence[str | os.PathLike[str]] = ()) -> EvaluationBrowser:
    """Lay out the Evaluate tab inside the current ``gr.Tab`` (call it inside ``with gr.Tab("Evaluate"):``).

    Args:
        session: the explorer's model session (unused: an evaluation is read, not recomputed).
        evaluations: evaluation folders; with none, the tab says how to give one.

    Returns:
        The :class:`EvaluationBrowser` behind the tab.
    """
    import gradio as gr
    import pandas as pd

    from .explain_tab import PRIVATE  # events of the page, not API endpoints

    browser = EvaluationBrowser(evaluations)
    if not browser.labels:
        gr.Markdown("No evaluation was given. Start the app with `camkit app --model SPEC --evaluate DIR` "
                    "(DIR: the `--out` folder of `camkit evaluate`).", elem_id="evaluate-none")  # fmt: skip
        return browser
    first = browser.labels[0]

    def frame(headers: list[str], cells: list[list[Any]]) -> pd.DataFrame:
        return pd.DataFrame(cells, columns=headers)

    chooser = gr.Dropdown(browser.labels, value=first, label="Evaluation", visible=len(browser.labels) > 1)
    verdict = gr.Markdown(browser.verdict(first), elem_id="evaluate-verdict")
    gr.Markdown("**Ranking**: methods by mean rank over the metrics (1 = best); each metric's mean with its 95% "
                "bootstrap interval. Controls (edge, centre, RandomCAM) need no model: a method should beat them.")  # fmt: skip
    ranking = gr.Dataframe(frame(*browser.ranking(first)), interactive=False, elem_id="evaluate-ranking")
    with gr.Accordion("Sanity gates", open=False):
        gates = gr.Dataframe(frame(*browser.gates(first)), interactive=False, elem_id="evaluate-gates")
    choices = browser.choices(first)
    with gr.Row():
        method = gr.Dropdown(choices["method"], value=ALL, label="Method")
        metric = gr.Dropdown(choices["metric"], value=ALL, label="Metric")
        text = gr.Textbox(label="Key contains", placeholder="part of a file name")
    headers, rows, count = browser.scores(first)
    counted = gr.Markdown(count, elem_id="evaluate-count")
    scores = gr.Dataframe(frame(headers, rows), interactive=False, elem_id="evaluate-scores", max_height=420)

    def on_filter(label: str, m: str, k: str, t: str) -> tuple[Any, str]:
        h, cells, line = browser.scores(label, m, k, t)
        return frame(h, cells), line

    def on_choose(label: str) -> tuple[Any, ...]:
        opts = browser.choices(label)
        h, cells, line = browser.scores(label)
        return (browser.verdict(label), frame(*browser.ranking(label)), frame(*browser.gates(label)),
                gr.update(choices=opts["method"], value=ALL), gr.update(choices=opts["metric"], value=ALL), "",
                frame(h, cells), line)  # fmt: skip

    chooser.change(on_choose, [chooser], [verdict, ranking, gates, method, metric, text, scores, counted], **PRIVATE)
    for control in (method, metric, text):
        control.change(on_filter, [chooser, method, metric, text], [scores, counted], **PRIVATE)
    return browser
