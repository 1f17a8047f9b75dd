"""The Audit and Evaluate tabs' callbacks in plain Python, on a real demo audit and evaluation and the demo Session."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
from explorer_helpers import DEMO_IMAGES, demo_runs

import camkit
from camkit.explorer import Session
from camkit.explorer import audit_tab as audit_tab_module
from camkit.explorer.audit_tab import ALL, AuditBrowser, enlarge, markdown_text
from camkit.explorer.evaluate_tab import EvaluationBrowser

pytestmark = pytest.mark.heavy  # a module fixture runs the command-line tool in subprocesses or builds the page: tens of seconds

gr = pytest.importorskip("gradio")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return demo_runs(tmp_path_factory)


@pytest.fixture(scope="module")
def session():
    return Session("demo", device="cpu")


@pytest.fixture(scope="module")
def browser(runs, session):
    return AuditBrowser(session, [runs["audit"]])


def results(runs):
    with open(runs["audit"] / "results.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_table_filters_and_sorts_every_row_on_the_server(browser, runs):
    raw = results(runs)
    headers, rows, count = browser.rows("gradcam")
    assert count == f"{DEMO_IMAGES} of {DEMO_IMAGES} images" and [r[0] for r in rows] == [r["key"] for r in raw]
    headers, rows, count = browser.rows("gradcam", cls="circle", sort="energy_watermark", descending=True)
    circles = sorted((r for r in raw if r["label"] == "circle"), key=lambda r: -float(r["energy_watermark"]))
    assert [r[0] for r in rows] == [r["key"] for r in circles] and count == f"{len(circles)} of {DEMO_IMAGES} images"
    column = headers.index("energy_watermark")
    assert [r[column] for r in rows] == [round(float(r["energy_watermark"]), 4) for r in circles]
    wrong = [r["key"] for r in raw if r["correct"] == "0"]
    assert [r[0] for r in browser.rows("gradcam", correctness="incorrect")[1]] == wrong
    strategy = raw[0]["strategy"]
    assert {r[headers.index("strategy")] for r in browser.rows("gradcam", strategy=strategy)[1]} == {strategy}
    choices = browser.choices("gradcam")
    assert choices["class"] == [ALL, "circle", "cross", "square", "triangle"]
    assert "energy_object" in choices["sort"] and choices["strategy"][0] == ALL


def test_the_table_shows_a_bounded_number_of_rows(browser, monkeypatch):
    monkeypatch.setattr(audit_tab_module, "SHOWN_ROWS", 5)
    _, rows, count = browser.rows("gradcam", sort="confidence")
    assert len(rows) == 5 and count == f"showing the first 5 of {DEMO_IMAGES} of {DEMO_IMAGES} images"


def test_the_findings_and_strategies_are_shown(browser):
    text = browser.findings("gradcam")
    assert text.startswith("**Findings**") and "attention energy on the watermark region" in text
    headers, rows = browser.strategies("gradcam")
    assert headers[:2] == ["class", "strategy"] and {r[0] for r in rows} == {"circle", "cross", "square", "triangle"}


def test_a_row_shows_its_saved_overlay_and_is_re_explained_live(browser, runs, session):
    row = results(runs)[4]
    overlay, image, note = browser.saved("gradcam", row["key"])
    assert overlay is not None and np.array_equal(camkit.read_rgb(overlay), camkit.read_rgb(runs["audit"] / row["overlay"]))
    assert image is not None and np.array_equal(camkit.read_rgb(image), camkit.read_rgb(runs["data"] / row["key"]))
    assert note == markdown_text(row["key"])
    live, line = browser.explain("gradcam", row["key"], "gradcam", "last_conv")
    target = int(row["target"])  # the class the audit explained, not whatever is predicted now
    expected = session.explain(str(runs["data"] / row["key"]), "gradcam", layer="last_conv", target=target)
    assert np.array_equal(live, enlarge(expected.overlay)) and live.shape == (256, 256, 3)
    assert line == f"live: gradcam, layer last\\_conv, class {target}"
    x = session.preprocess(camkit.read_rgb(runs["data"] / row["key"]))[0][None]
    assert np.array_equal(expected.map, camkit.GradCAM(session.model, layer="last_conv")(x, target)[0].numpy())
    # the audit saved the same Grad-CAM (method, layer, class) drawn the same way: pixel for pixel
    assert np.array_equal(expected.overlay, camkit.read_rgb(runs["audit"] / row["overlay"]))


def test_another_method_and_the_automatic_layer(browser, runs):
    key = results(runs)[0]["key"]
    live, line = browser.explain("gradcam", key, "saliency", "")
    assert live is not None and live.shape == (256, 256, 3) and line.startswith("live: saliency, layer auto")


@pytest.mark.parametrize(
    "method, layer, message",
    [("gradcam", "no.such.layer", "could not explain this image"), ("attentionrollout", "", "could not explain this image")],
    ids=["bad-layer", "method-that-does-not-fit"],
)
def test_bad_choices_become_a_message_and_the_tab_keeps_working(browser, runs, method, layer, message):
    key = results(runs)[0]["key"]
    live, line = browser.explain("gradcam", key, method, layer)
    assert live is None and message in line
    live, line = browser.explain("gradcam", key, "gradcam", "last_conv")
    assert live is not None


def test_several_audits_a_broken_one_and_moved_images(runs, session, tmp_path):
    moved = tmp_path / "b" / "gradcam"
    shutil.copytree(runs["audit"], moved)
    (moved / "run.json").unlink()
    summary = json.loads((moved / "summary.json").read_text())
    summary["data"]["path"] = str(tmp_path / "gone.csv")
    (moved / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "empty").mkdir()
    browser = AuditBrowser(session, [runs["audit"], moved, tmp_path / "empty"])
    assert browser.labels == [f"{runs['audit'].parent.name}/gradcam", "b/gradcam", "empty"]
    assert "holds no results.csv" in browser.findings("empty") and browser.rows("empty")[1] == []
    key = results(runs)[0]["key"]
    overlay, image, note = browser.saved("b/gradcam", key)
    assert overlay is not None and image is None and "data folder of this audit was not found" in note
    live, line = browser.explain("b/gradcam", key, "gradcam", "")
    assert live is None and line.startswith("no live explanation")
    assert browser.saved("b/gradcam", "nope.png")[2].startswith("no row 'nope.png'")


def test_text_from_the_data_is_not_markdown_or_html():
    assert markdown_text("<img src=x onerror=alert(1)> *a* [b](c) `d`") == (
        "&lt;img src=x onerror=alert(1)&gt; \\*a\\* \\[b\\](c) \\`d\\`"
    )


def test_the_evaluate_tab_reads_verdict_ranking_gates_and_scores(runs):
    browser = EvaluationBrowser([runs["evaluation"]])
    summary = json.loads((runs["evaluation"] / "summary.json").read_text())
    label = browser.labels[0]
    assert browser.verdict(label).endswith(markdown_text(summary["verdict"]["text"]))
    assert f"{DEMO_IMAGES} images, {DEMO_IMAGES} scored, 0 failed." in browser.verdict(label)
    headers, rows = browser.ranking(label)
    assert [r[0] for r in rows] == sorted(summary["overall"], key=lambda m: summary["overall"][m]["mean_rank"])
    headers, rows = browser.gates(label)
    assert headers == ["method", "model_randomisation", "random_logit"] and len(rows) == len(summary["methods"])
    gate = summary["gates"]["gradcam"]["random_logit"]
    row = next(r for r in rows if r[0] == "gradcam")
    assert row[2] == f"{'passed' if gate['passed'] else 'failed'} ({gate['spearman']:.2f})"
    headers, rows, count = browser.scores(label, method="gradcam++", metric="insertion")
    assert len(rows) == DEMO_IMAGES and {(r[3], r[4]) for r in rows} == {("gradcam++", "insertion")}
    total = DEMO_IMAGES * len(summary["methods"]) * len(summary["metrics"])
    assert count == f"{DEMO_IMAGES} of {total} scores"
    assert browser.choices(label)["metric"] == [ALL, *summary["metrics"]]


def test_the_evaluate_tab_without_scores_and_with_a_wrong_folder(runs, tmp_path):
    folder = tmp_path / "evaluation"
    shutil.copytree(runs["evaluation"], folder)
    (folder / "scores.csv").unlink()
    browser = EvaluationBrowser([folder, runs["audit"]])
    assert browser.scores("evaluation") == (["key"], [], "no scores.csv in this folder")
    assert "it looks like an audit" in browser.verdict("gradcam")


def test_the_page_holds_both_tabs_with_the_folders(runs, session):
    from camkit.explorer.app import build_app

    blocks = build_app(session, [runs["audit"]], [runs["evaluation"]])
    ids = {getattr(b, "elem_id", None) for b in blocks.blocks.values()}
    assert {"audit-table", "audit-live", "audit-findings", "evaluate-ranking", "evaluate-scores"} <= ids
    public = sorted(fn.api_name for fn in blocks.fns.values() if getattr(fn, "api_visibility", "public") == "public")
    assert public == ["compare", "explain"]  # the tabs' events are not API endpoints
    empty = build_app(session)
    texts = [getattr(b, "value", "") for b in empty.blocks.values() if isinstance(b, gr.Markdown)]
    assert any("No audit was given" in str(t) for t in texts) and any("No evaluation was given" in str(t) for t in texts)
