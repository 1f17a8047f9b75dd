"""The explorer's Audit tab: an audit's findings, strategies and rows; a row's saved overlay and a live one.

:class:`AuditBrowser` holds the callbacks as plain Python (tested without a browser);
:func:`build_audit_tab` lays them out with gradio (imported when the tab is built). Filtering and
sorting happen on the server, over every row, so the table shows the first :data:`SHOWN_ROWS`
of the rows asked for however large the audit is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..errors import CamkitError
from ..explain.media import media_kind
from ..registry import list_methods
from .inputs import IMAGE_BUTTONS
from .media import explain_media, media_view
from .tables import (
    AuditFolder,
    audit_findings,
    audit_view,
    class_strategies,
    filter_rows,
    read_audit,
    resolve_row,
    sort_rows,
)

__all__ = [
    "ALL", "CORRECTNESS", "IMAGE_BUTTONS", "SHOWN_ROWS", "AuditBrowser", "build_audit_tab", "enlarge", "folder_labels",
    "markdown_text", "read_labelled",
]  # fmt: skip

_F = TypeVar("_F")

SHOWN_ROWS = 1000
"""Rows the table shows at once (the first of the filtered, sorted rows)."""
ALL = "(all)"
CORRECTNESS = (ALL, "correct", "incorrect")
_EXPLAIN_ERRORS = (CamkitError, ValueError, KeyError, TypeError, RuntimeError, OSError)


def read_labelled(
    folders: Sequence[str | os.PathLike[str]], read: Callable[[Path], _F]
) -> tuple[list[str], dict[str, _F], dict[str, str]]:
    """``(labels, read, errors)``: each folder read under its label (:func:`folder_labels`), or why it could not be."""
    paths = [Path(f) for f in folders]
    labels = folder_labels(paths)
    found: dict[str, _F] = {}
    errors: dict[str, str] = {}
    for label, path in zip(labels, paths):
        try:
            found[label] = read(path)
        except CamkitError as err:
            errors[label] = str(err)
    return labels, found, errors


def folder_labels(paths: Sequence[Path]) -> list[str]:
    """Short unique names for the folders: the folder's name, with its parent's when two share it, numbered if still alike.

    Example:
        >>> from pathlib import Path
        >>> from camkit.explorer.audit_tab import folder_labels
        >>> folder_labels([Path("a/gradcam"), Path("b/gradcam"), Path("b/gradcam"), Path("x/scorecam")])
        ['a/gradcam', 'b/gradcam', 'b/gradcam (3)', 'scorecam']
    """
    names = [p.name or str(p) for p in paths]
    labels = [str(Path(p.parent.name) / p.name) if names.count(n) > 1 else n for p, n in zip(paths, names)]
    return [label if label not in labels[:i] else f"{label} ({i + 1})" for i, label in enumerate(labels)]


class AuditBrowser:
    """The Audit tab's state and callbacks (no gradio): audits by label, the rows asked for, live explanations.

    Args:
        session: the explorer's model session (its ``explain(image, method, layer, target)`` is called).
        audits: audit folders (``camkit audit --out``). A folder that cannot be read is listed with
            its error instead of its rows; the others still work.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from camkit.explorer.audit_tab import AuditBrowser
        >>> folder = Path(tempfile.mkdtemp()) / "run"
        >>> folder.mkdir()
        >>> _ = (folder / "results.csv").write_text("key,label,correct\\na.png,cat,1\\nb.png,dog,0\\n")
        >>> browser = AuditBrowser(None, [folder])
        >>> browser.labels, browser.rows("run", correctness="incorrect")[1]
        (['run'], [['b.png', 'dog', False]])
    """

    def __init__(self, session: Any, audits: Sequence[str | os.PathLike[str]]) -> None:
        self.session = session
        self.labels, self.audits, self.errors = read_labelled(audits, read_audit)

    def _audit(self, label: str) -> AuditFolder | None:
        return self.audits.get(label)

    def findings(self, label: str) -> str:
        """The findings as Markdown (or why the folder cannot be shown)."""
        if label in self.errors:
            return f"**This audit cannot be shown.** {self.errors[label]}"
        audit = self._audit(label)
        if audit is None:
            return "No audit chosen."
        lines = "\n".join(f"- {markdown_text(line)}" for line in audit_findings(audit))
        return f"**Findings** ({markdown_text(str(audit.folder))})\n\n{lines}"

    def strategies(self, label: str) -> tuple[list[str], list[list[Any]]]:
        """Headers and rows of the per-class strategies ([] rows when there are none)."""
        audit = self._audit(label)
        return class_strategies(audit) if audit is not None else (["class", "strategy"], [])

    def choices(self, label: str) -> dict[str, list[str]]:
        """The filters' and the sort's choices for one audit: ``class``, ``strategy``, ``sort``."""
        audit = self._audit(label)
        if audit is None:
            return {"class": [ALL], "strategy": [ALL], "sort": ["key"]}
        return {"class": [ALL, *audit.classes], "strategy": [ALL, *audit.strategies], "sort": audit_view(audit, [])[0]}

    def rows(self, label: str, cls: str = ALL, correctness: str = ALL, strategy: str = ALL, text: str = "",
             sort: str = "", descending: bool = False) -> tuple[list[str], list[list[Any]], str]:  # fmt: skip
        """The table: headers, the first :data:`SHOWN_ROWS` rows that pass the filters (sorted), and a count line."""
        audit = self._audit(label)
        if audit is None:
            return ["key"], [], ""
        correct = {"correct": True, "incorrect": False}.get(correctness)
        kept = filter_rows(audit.rows, cls=None if cls == ALL else cls, correct=correct,
                           strategy=None if strategy == ALL else strategy, text=text or "")  # fmt: skip
        if sort:
            kept = sort_rows(kept, sort, descending)
        headers, cells = audit_view(audit, kept[:SHOWN_ROWS])
        shown = f"showing the first {SHOWN_ROWS} of " if len(kept) > SHOWN_ROWS else ""
        return headers, cells, f"{shown}{len(kept)} of {len(audit.rows)} images"

    def saved(self, label: str, key: str) -> tuple[str | None, str | None, str]:
        """The saved overlay's path, the image's path and a note, for the row ``key``."""
        audit = self._audit(label)
        if audit is None or not key:
            return None, None, "Click a row of the table."
        try:
            files = resolve_row(audit, key)
        except CamkitError as err:
            return None, None, str(err)
        note = markdown_text(key) + (f": {markdown_text(files.note)}" if files.note else "")
        return (None if files.overlay is None else str(files.overlay)), (None if files.image is None else str(files.image)), note

    def explain(self, label: str, key: str, method: str, layer: str = "") -> tuple[Any, str]:
        """The live overlay (uint8 [H, W, 3]) of the row ``key`` with ``method``, for the class the audit explained.

        A volume's row shows the slice along axis 0 through the map's peak, a video's the frame
        with the most map, as the audit's saved overlay does.

        Returns ``(None, why)`` when it cannot be made (no image, a method that does not fit the model...).
        """
        audit = self._audit(label)
        if audit is None or not key:
            return None, ""
        _overlay, image, note = self.saved(label, key)
        if image is None:
            return None, f"no live explanation: {note}"
        row = next(r for r in audit.rows if r.get("key") == key)
        target = row.get("target") if isinstance(row.get("target"), int) else None
        try:
            if media_kind(image) is not None:  # a volume or video audit: the slice or frame its overlay shows
                result = explain_media(self.session, image, method, layer.strip() or None, target)
                picture = media_view(result)
            else:
                picture = self.session.explain(image, method, layer=layer.strip() or None, target=target).overlay
        except _EXPLAIN_ERRORS as err:
            return None, f"**{markdown_text(method)} could not explain this image:** {markdown_text(str(err))}"
        used = f"class {target}" if target is not None else "the predicted class"
        return enlarge(picture), f"live: {markdown_text(method)}, layer {markdown_text(layer.strip() or 'auto')}, {used}"


def enlarge(rgb: Any, side: int = 256) -> Any:
    """A small uint8 image [H, W, 3] enlarged by a whole factor (nearest) to about ``side`` pixels; None stays None.

    Example:
        >>> import numpy as np
        >>> from camkit.explorer.audit_tab import enlarge
        >>> enlarge(np.zeros((64, 32, 3), np.uint8)).shape, enlarge(np.zeros((300, 300, 3), np.uint8)).shape
        ((256, 128, 3), (300, 300, 3))
    """
    if rgb is None:
        return None
    factor = side // max(rgb.shape[0], rgb.shape[1])
    return rgb.repeat(factor, axis=0).repeat(factor, axis=1) if factor > 1 else rgb


def markdown_text(text: str) -> str:
    """``text`` safe inside Markdown: no HTML, no emphasis or links from the data."""
    out = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for ch in "\\`*_[]|":
        out = out.replace(ch, "\\" + ch)
    return out


def build_audit_tab(session: Any, audits: Sequence[str | os.PathLike[str]] = ()) -> AuditBrowser:
    """Lay out the Audit tab inside the current ``gr.Tab`` (call it inside ``with gr.Tab("Audit"):``).

    Args:
        session: the explorer's model session.
        audits: audit folders; with none, the tab says how to give one.

    Returns:
        The :class:`AuditBrowser` behind the tab.
    """
    import gradio as gr

    browser = AuditBrowser(session, audits)
    if not browser.labels:
        gr.Markdown("No audit was given. Start the app with `camkit app --model SPEC --audit DIR` "
                    "(DIR: the `--out` folder of `camkit audit`, e.g. `camkit-demo/gradcam` after `make demo`).")  # fmt: skip
        return browser
    _wire(browser, _lay_out(browser))
    return browser


def _frame(headers: list[str], cells: list[list[Any]]) -> Any:
    """A table's rows as the ``pandas.DataFrame`` gradio's tables show."""
    import pandas as pd

    return pd.DataFrame(cells, columns=headers)


def _lay_out(browser: AuditBrowser) -> dict[str, Any]:
    """The tab's components, by name, showing the first audit."""
    import gradio as gr

    first = browser.labels[0]
    methods = list_methods()
    audit = browser.audits.get(first)
    summary = audit.summary if audit is not None else {}
    method0 = summary.get("method") if summary.get("method") in methods else "gradcam"
    choices = browser.choices(first)
    ui: dict[str, Any] = {}
    ui["chooser"] = gr.Dropdown(browser.labels, value=first, label="Audit", visible=len(browser.labels) > 1, elem_id="audit-chooser")
    ui["findings"] = gr.Markdown(browser.findings(first), elem_id="audit-findings")
    with gr.Accordion("Strategies per class", open=False):
        ui["strategies"] = gr.Dataframe(_frame(*browser.strategies(first)), interactive=False, elem_id="audit-strategies")
    with gr.Row():
        ui["cls"] = gr.Dropdown(choices["class"], value=ALL, label="Class")
        ui["correctness"] = gr.Radio(list(CORRECTNESS), value=ALL, label="Prediction")
        ui["strategy"] = gr.Dropdown(choices["strategy"], value=ALL, label="Strategy")
        ui["text"] = gr.Textbox(label="Key contains", placeholder="part of a file name")
    with gr.Row():
        ui["sort"] = gr.Dropdown(choices["sort"], value="key", label="Sort by")
        ui["descending"] = gr.Checkbox(False, label="Descending")
    headers, cells, count = browser.rows(first, sort="key")
    ui["counted"] = gr.Markdown(count, elem_id="audit-count")
    ui["table"] = gr.Dataframe(_frame(headers, cells), interactive=False, elem_id="audit-table", max_height=420)
    ui["key"] = gr.State("")
    with gr.Row():
        ui["method"] = gr.Dropdown(methods, value=method0, label="Method (live)", elem_id="audit-method")
        ui["layer"] = gr.Textbox(str(summary.get("layer") or ""), label="Layer (empty: automatic)")
        ui["again"] = gr.Button("Re-explain", elem_id="audit-reexplain")
    ui["note"] = gr.Markdown("Click a row of the table.", elem_id="audit-note")
    with gr.Row():
        ui["saved"] = gr.Image(label="Saved overlay (from the audit)", type="numpy", interactive=False,
                               elem_id="audit-saved", buttons=list(IMAGE_BUTTONS))  # fmt: skip
        ui["live"] = gr.Image(label="Live explanation", type="numpy", interactive=False, elem_id="audit-live",
                              buttons=list(IMAGE_BUTTONS))  # fmt: skip
    ui["live_note"] = gr.Markdown("", elem_id="audit-live-note")
    return ui


def _wire(browser: AuditBrowser, ui: dict[str, Any]) -> None:
    """The tab's events: choosing an audit, filtering and sorting the table, picking a row, re-explaining it."""
    import gradio as gr

    from ..io import read_rgb
    from .explain_tab import PRIVATE  # events of the page, not API endpoints

    def on_filter(label: str, c: str, k: str, s: str, t: str, by: str, desc: bool) -> tuple[Any, str]:
        h, rows, line = browser.rows(label, c, k, s, t, by, desc)
        return _frame(h, rows), line

    def on_choose(label: str) -> tuple[Any, ...]:
        opts = browser.choices(label)
        h, rows, line = browser.rows(label, sort="key")
        layer0 = (browser.audits[label].summary.get("layer") or "") if label in browser.audits else ""
        return (browser.findings(label), _frame(*browser.strategies(label)),
                gr.update(choices=opts["class"], value=ALL), gr.update(choices=opts["strategy"], value=ALL),
                gr.update(choices=opts["sort"], value="key"), ALL, "", False, _frame(h, rows), line, str(layer0), "",
                None, None, "Click a row of the table.", "")  # fmt: skip

    def on_select(label: str, evt: gr.SelectData) -> tuple[Any, Any, str]:
        row = evt.row_value or []
        picked = str(row[0]) if row else ""
        overlay, _image, line = browser.saved(label, picked)
        return picked, None if overlay is None else enlarge(read_rgb(overlay)), line

    on_select.__annotations__["evt"] = gr.SelectData  # gradio finds the event by its type, not a string

    def on_explain(label: str, picked: str, m: str, lay: str) -> tuple[Any, str]:
        return browser.explain(label, picked, m, lay)

    chosen = ["findings", "strategies", "cls", "strategy", "sort", "correctness", "text", "descending", "table",
              "counted", "layer", "key", "saved", "live", "note", "live_note"]  # fmt: skip
    ui["chooser"].change(on_choose, [ui["chooser"]], [ui[name] for name in chosen], **PRIVATE)
    filters: list[Any] = [ui[name] for name in ("chooser", "cls", "correctness", "strategy", "text", "sort", "descending")]
    for control in filters[1:]:
        control.change(on_filter, filters, [ui["table"], ui["counted"]], **PRIVATE)
    explain_in, explain_out = [ui["chooser"], ui["key"], ui["method"], ui["layer"]], [ui["live"], ui["live_note"]]
    ui["table"].select(on_select, [ui["chooser"]], [ui["key"], ui["saved"], ui["note"]], **PRIVATE).then(
        on_explain, explain_in, explain_out, **PRIVATE
    )
    for trigger in (ui["method"].change, ui["again"].click):
        trigger(on_explain, explain_in, explain_out, **PRIVATE)
