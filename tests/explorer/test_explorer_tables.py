"""The explorer's tables on a real audit and evaluation of the demo model, and on folders that are not camkit runs."""

from __future__ import annotations

import csv
import json
import math
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
from explorer_helpers import DEMO_IMAGES, demo_runs

from camkit.errors import CamkitError, InvalidInputError
from camkit.explorer.tables import (
    audit_findings,
    audit_view,
    class_strategies,
    filter_rows,
    ranking_view,
    read_audit,
    read_evaluation,
    resolve_row,
    scores_view,
    sort_rows,
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return demo_runs(tmp_path_factory)


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_an_audit_reads_every_row_with_its_numbers(runs):
    audit = read_audit(runs["audit"])
    raw = csv_rows(runs["audit"] / "results.csv")
    assert len(audit.rows) == len(raw) == DEMO_IMAGES
    assert audit.regions == ["object", "watermark"]
    assert audit.classes == sorted({r["label"] for r in raw})
    assert audit.data_root == runs["data"].resolve() or audit.data_root == runs["data"]
    for row, cells in zip(audit.rows, raw):
        assert row["key"] == cells["key"] and row["class"] == cells["label"]  # the demo has labels
        assert row["correct"] is (cells["correct"] == "1")
        assert row["energy_watermark"] == float(cells["energy_watermark"])
        assert row["target"] == int(cells["target"]) and row["error"] is None
        assert row["strategy"] == cells["strategy"] != ""


def test_the_view_shows_the_audit_columns_and_rounds_floats(runs):
    audit = read_audit(runs["audit"])
    headers, cells = audit_view(audit)
    assert headers == ["key", "class", "prediction_name", "confidence", "correct", "energy_object",
                       "energy_watermark", "pointing_object", "spread", "border", "strategy", "error"]  # fmt: skip
    assert len(cells) == DEMO_IMAGES and "overlay" not in headers
    first = audit.rows[0]
    assert cells[0][headers.index("energy_object")] == round(first["energy_object"], 4)
    assert cells[0][headers.index("key")] == first["key"]


def test_filters_match_the_csv_counted_by_hand(runs):
    audit = read_audit(runs["audit"])
    raw = csv_rows(runs["audit"] / "results.csv")
    for name in audit.classes:
        assert [r["key"] for r in filter_rows(audit.rows, cls=name)] == [r["key"] for r in raw if r["label"] == name]
    wrong = [r["key"] for r in raw if r["correct"] == "0"]
    right = [r["key"] for r in raw if r["correct"] == "1"]
    assert [r["key"] for r in filter_rows(audit.rows, correct=False)] == wrong
    assert [r["key"] for r in filter_rows(audit.rows, correct=True)] == right
    strategy = raw[0]["strategy"]
    assert [r["key"] for r in filter_rows(audit.rows, strategy=strategy)] == [r["key"] for r in raw if r["strategy"] == strategy]
    assert [r["key"] for r in filter_rows(audit.rows, text="00003")] == [r["key"] for r in raw if "00003" in r["key"]]
    assert filter_rows(audit.rows, cls="no such class") == []


def test_sorting_by_any_column_numbers_text_and_empty_cells():
    rows = [{"k": "a", "x": 0.5, "t": "b"}, {"k": "b", "x": None, "t": "a"}, {"k": "c", "x": 0.9, "t": None},
            {"k": "d", "x": 0.5, "t": "c"}, {"k": "e", "x": float("nan"), "t": "a"}]  # fmt: skip
    assert [r["k"] for r in sort_rows(rows, "x")] == ["a", "d", "c", "b", "e"]  # ties keep their order, empty last
    assert [r["k"] for r in sort_rows(rows, "x", descending=True)] == ["c", "a", "d", "b", "e"]
    assert [r["k"] for r in sort_rows(rows, "t")] == ["b", "e", "a", "d", "c"]
    assert [r["k"] for r in sort_rows(rows, "missing")] == ["a", "b", "c", "d", "e"]
    flags = [{"k": "a", "c": True}, {"k": "b", "c": False}, {"k": "c", "c": None}]
    assert [r["k"] for r in sort_rows(flags, "c")] == ["b", "a", "c"]


def test_sorted_audit_rows_follow_the_csv_values(runs):
    audit = read_audit(runs["audit"])
    ordered = sort_rows(audit.rows, "energy_watermark", descending=True)
    values = [r["energy_watermark"] for r in ordered]
    assert values == sorted(values, reverse=True) and len(values) == DEMO_IMAGES


def test_findings_are_the_summary_written_out(runs):
    audit = read_audit(runs["audit"])
    raw = csv_rows(runs["audit"] / "results.csv")
    accuracy = sum(r["correct"] == "1" for r in raw) / len(raw)
    findings = audit_findings(audit)
    assert findings[0] == (f"gradcam on layer last_conv: {DEMO_IMAGES} images, {DEMO_IMAGES} audited, 0 failed; "
                           f"accuracy {accuracy:.0%}")  # fmt: skip
    # the watermark finding from per-class means computed here from results.csv
    share: dict[str, list[float]] = defaultdict(list)
    for r in raw:
        share[r["label"]].append(float(r["energy_watermark"]))
    means = {k: sum(v) / len(v) for k, v in share.items()}
    top = max(means, key=means.get)
    others = max(v for k, v in means.items() if k != top)
    expected = f"class {top!r}: {means[top]:.0%} of attention energy on the watermark region (other classes: at most {others:.0%})"
    assert expected in findings
    assert any(line.startswith("class ") and "on the object" in line for line in findings)
    assert findings[-1].startswith("strategy ranked first: ")


def test_class_strategies_list_every_strategy_of_the_rows(runs):
    audit = read_audit(runs["audit"])
    headers, rows = class_strategies(audit)
    assert headers[:3] == ["class", "strategy", "images"]
    assert sorted(r[1] for r in rows) == audit.strategies
    for cls, name, size, *_ in rows:
        assert size == sum(r["strategy"] == name for r in audit.rows) and name.startswith(f"{cls}/")


def test_a_row_resolves_to_its_image_and_saved_overlay(runs):
    audit = read_audit(runs["audit"])
    row = audit.rows[3]
    files = resolve_row(audit, row["key"])
    assert files.note == ""
    assert files.image is not None and files.image.samefile(runs["data"] / row["key"])
    assert files.overlay is not None and files.overlay.samefile(runs["audit"] / csv_rows(runs["audit"] / "results.csv")[3]["overlay"])
    with pytest.raises(InvalidInputError, match=r"no row 'nope\.png'"):
        resolve_row(audit, "nope.png")


def test_a_moved_audit_still_shows_its_overlays_and_says_the_images_are_gone(runs, tmp_path, monkeypatch):
    moved = tmp_path / "elsewhere" / "gradcam"
    shutil.copytree(runs["audit"], moved)
    (moved / "run.json").unlink()  # its resolved data path would still find the data
    summary = json.loads((moved / "summary.json").read_text())
    summary["data"]["path"] = str(tmp_path / "gone" / "manifest.csv")
    (moved / "summary.json").write_text(json.dumps(summary))
    monkeypatch.chdir(tmp_path)
    audit = read_audit(moved)
    assert audit.data_root is None
    files = resolve_row(audit, audit.rows[0]["key"])
    assert files.image is None and files.overlay is not None and files.overlay.is_file()
    assert files.note == "the data folder of this audit was not found"


def test_a_relative_data_path_is_found_from_the_working_folder(runs, tmp_path, monkeypatch):
    folder = tmp_path / "audit"
    shutil.copytree(runs["audit"], folder)
    (folder / "run.json").unlink()
    summary = json.loads((folder / "summary.json").read_text())
    summary["data"]["path"] = "data/manifest.csv"  # `camkit demo --out camkit-demo` records a relative path
    (folder / "summary.json").write_text(json.dumps(summary))
    monkeypatch.chdir(runs["data"].parent)
    assert read_audit(folder).data_root == Path.cwd() / "data"


def test_paths_that_climb_out_of_their_folders_resolve_to_nothing(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "secret.png").write_bytes(b"x")
    audit_dir = tmp_path / "audit"
    audit_dir.mkdir()
    (audit_dir / "results.csv").write_text("key,overlay\n../secret.png,../secret.png\n")
    (audit_dir / "run.json").write_text(json.dumps({"data": str(tmp_path / "data")}))
    files = resolve_row(read_audit(audit_dir), "../secret.png")
    assert files.image is None and files.overlay is None
    assert files.note == ("the saved overlay ../secret.png is missing; "
                          f"the image ../secret.png is no longer under {tmp_path / 'data'}")  # fmt: skip


def test_missing_columns_and_no_summary_give_less_not_an_error(tmp_path):
    (tmp_path / "results.csv").write_text("key,label\na.png,cat\nb.png,\n")
    audit = read_audit(tmp_path)
    assert audit.summary == {} and audit.regions == [] and audit.strategies == []
    assert audit_view(audit) == (["key", "class"], [["a.png", "cat"], ["b.png", ""]])
    assert audit_findings(audit) == ["2 images in results.csv; no summary.json, so no per-class findings"]
    assert class_strategies(audit)[1] == []
    assert filter_rows(audit.rows, correct=True) == []  # no row is graded


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, "the audit folder .* does not exist; pass the --out folder of `camkit audit`"),
        (lambda p: p.write_text("x"), "is a file"),
        (lambda p: (p.mkdir(), (p / "notes.txt").write_text("x")), "holds no results.csv, so it is not a finished camkit audit; it holds notes.txt"),
        (lambda p: (p.mkdir(), (p / "scores.csv").write_text("key\n")), "it looks like an evaluation: pass it as an evaluation"),
        (lambda p: (p.mkdir(), (p / "results.csv").write_text("name,x\na,1\n")), "has no 'key' column"),
        (lambda p: (p.mkdir(), (p / "results.csv").write_text("key\n"), (p / "summary.json").write_text("{")), "cannot be read as JSON"),
        (lambda p: (p.mkdir(), (p / "results.csv").write_text("key\n"), (p / "summary.json").write_text("[1]")), "holds a JSON list, expected an object"),
        (lambda p: (p.mkdir(), (p / "results.csv").write_bytes(b"key\n\xff\xfe\n")), "cannot be read as CSV"),
    ],
    ids=["missing", "file", "not-a-run", "evaluation", "no-key", "bad-json", "json-list", "binary"],
)
def test_folders_that_are_not_audits_are_refused_clearly(tmp_path, make, message):
    folder = tmp_path / "out"
    make(folder)
    with pytest.raises(InvalidInputError, match=message) as caught:
        read_audit(folder)
    assert isinstance(caught.value, CamkitError) and isinstance(caught.value, ValueError)


def test_an_audit_is_not_taken_for_an_evaluation(runs, tmp_path):
    with pytest.raises(InvalidInputError, match="it looks like an audit: pass it as an audit, --audit"):
        read_evaluation(runs["audit"])
    with pytest.raises(InvalidInputError, match=r"holds no evaluation summary\.json .* it holds nothing"):
        read_evaluation(tmp_path)


def test_the_ranking_is_the_summary_sorted_by_mean_rank(runs):
    evaluation = read_evaluation(runs["evaluation"])
    summary = json.loads((runs["evaluation"] / "summary.json").read_text())
    headers, rows = ranking_view(evaluation)
    metrics = list(summary["metrics"])
    assert headers[:3] == ["method", "control", "mean rank"] and len(headers) == 3 + len(metrics)
    for name, header in zip(metrics, headers[3:]):
        better = summary["metrics"][name]["higher_is_better"]
        assert header == f"{name} ({'higher' if better else 'lower'} is better)"
    ranks = {m: summary["overall"][m]["mean_rank"] for m in summary["methods"]}
    assert [r[0] for r in rows] == sorted(ranks, key=ranks.get)
    for method, control, rank, *cells in rows:
        assert control is (method in summary["controls"]) and rank == round(ranks[method], 4)
        for name, text in zip(metrics, cells):
            s = summary["scores"][method][name]
            assert text == f"{s['mean']:.4g} [{s['low']:.4g}, {s['high']:.4g}]"
    assert evaluation.verdict == summary["verdict"]["text"] != ""
    assert evaluation.methods == ["gradcam", "gradcam++", "edge", "centre", "randomcam"]


def test_per_image_scores_filter_by_method_metric_and_key(runs):
    evaluation = read_evaluation(runs["evaluation"])
    raw = csv_rows(runs["evaluation"] / "scores.csv")
    headers, rows = scores_view(evaluation, method="gradcam", metric="deletion")
    assert headers == ["key", "label", "target", "method", "metric", "value"]
    expected = [r for r in raw if r["method"] == "gradcam" and r["metric"] == "deletion"]
    assert len(rows) == len(expected) == DEMO_IMAGES
    for row, cells in zip(rows, expected):
        assert row[0] == cells["key"] and row[2] == int(cells["target"])
        assert math.isclose(row[5], round(float(cells["value"]), 4))
    assert len(scores_view(evaluation)[1]) == len(raw)
    key = raw[0]["key"]
    assert {r[0] for r in scores_view(evaluation, text=key)[1]} == {key}
