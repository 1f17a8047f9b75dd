"""camkit.audit in-process: measured values by hand, regions, bad data, batching, resume, safety."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from audit_helpers import BAD_NOTES, SCRIPT_NAME, make_bad_data, make_images, read_rows
from tinyfactory import Tiny

import camkit
from camkit.audit.run import AuditError, safe_name
from camkit.modelload import Preprocess
from camkit.runs.data import discover

COMMON = {"layer": "conv2", "size": 32, "device": "cpu", "workers": 0, "progress": False, "alphabetical_classes": True}


def _make_csv(root):
    rng = np.random.default_rng(2)
    (root / "img").mkdir(parents=True)
    for i in range(3):
        camkit.save_png(root / "img" / f"{i}.png", rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    text = np.zeros((64, 64), np.uint8)
    text[:16] = 255  # the top quarter
    camkit.save_png(root / "text0.png", np.dstack([text] * 3))
    (root / "data.csv").write_text(
        "path,label,object_x0,object_y0,object_x1,object_y1,watermark_x0,watermark_y0,watermark_x1,watermark_y1,text_mask\n"
        "img/0.png,1,0,0,32,64,48,48,64,64,text0.png\n"
        "img/1.png,0,,,,,48,48,64,64,\n"
        "img/2.png,2,0,0,ten,64,,,,,\n"
    )
    return root / "data.csv"


def test_csv_regions_and_measures_match_hand_computation(tmp_path):
    manifest = _make_csv(tmp_path)
    summary = camkit.audit(manifest, "tinyfactory:tiny", out=tmp_path / "out", save_maps=True, batch_size=2, **COMMON)
    rows = {r["key"]: r for r in read_rows(tmp_path / "out" / "results.csv")}
    assert list(rows) == ["img/0.png", "img/1.png", "img/2.png"]
    assert (
        rows["img/2.png"]["error"] == "region 'object': box cells ['0', '0', 'ten', '64'] are not four numbers (line 4)"
    )
    assert summary["regions"] == ["object", "watermark", "text"] and summary["errors"] == 1

    model, pre = Tiny().eval(), Preprocess(size=(32, 32))
    for key in ("img/0.png", "img/1.png"):
        row = rows[key]
        x, _ = pre(camkit.read_rgb(tmp_path / key))
        with torch.no_grad():
            probs = model(x[None]).softmax(dim=1)[0]
        assert int(row["prediction"]) == int(probs.argmax()) == int(row["target"])
        assert float(row["confidence"]) == pytest.approx(float(probs.max()), abs=1e-6)
        assert row["correct"] == ("1" if int(probs.argmax()) == int(row["label"]) else "0")
        m = np.load(tmp_path / "out" / "maps" / safe_name(key).replace(".png", ".npy")).astype(np.float64)
        assert m.shape == (32, 32)
        total = m.sum()
        # watermark (48, 48, 64, 64) in 64 px -> (24, 24, 32, 32) at 32 px
        assert float(row["energy_watermark"]) == pytest.approx(m[24:32, 24:32].sum() / total, abs=1e-5)
        top = np.sort(m.ravel())[::-1][: math.ceil(0.1 * 32 * 32)].sum() / total
        assert float(row["spread"]) == pytest.approx(top, abs=1e-5)
        frame = total - m[3:29, 3:29].sum()  # border = round(0.1 * 32) = 3 px
        assert float(row["border"]) == pytest.approx(frame / total, abs=1e-5)
    # object (0, 0, 32, 64) -> left 16 columns; text mask rows 0..15 -> rows 0..7
    m0 = np.load(tmp_path / "out" / "maps" / safe_name("img/0.png").replace(".png", ".npy")).astype(np.float64)
    assert float(rows["img/0.png"]["energy_object"]) == pytest.approx(m0[:, :16].sum() / m0.sum(), abs=1e-5)
    assert float(rows["img/0.png"]["energy_text"]) == pytest.approx(m0[:8].sum() / m0.sum(), abs=1e-5)
    peak_col = int(np.argmax(m0)) % 32
    assert rows["img/0.png"]["pointing_object"] == ("1.0" if peak_col < 16 else "0.0")
    # absent regions are empty cells, not zeros
    assert (
        rows["img/1.png"]["energy_object"]
        == rows["img/1.png"]["pointing_object"]
        == rows["img/1.png"]["energy_text"]
        == ""
    )
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["energy"]["watermark"] == pytest.approx(
        (float(rows["img/0.png"]["energy_watermark"]) + float(rows["img/1.png"]["energy_watermark"])) / 2
    )
    assert saved["energy"]["object"] == pytest.approx(float(rows["img/0.png"]["energy_object"]))


def test_class_folders_labels_and_batch_equals_one_by_one(tmp_path):
    data = make_images(tmp_path / "data", per_class=3)
    assert discover(data).kind == "classes"
    a = camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "a", batch_size=4, **COMMON)
    camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "b", batch_size=1, **COMMON)
    ra, rb = read_rows(tmp_path / "a" / "results.csv"), read_rows(tmp_path / "b" / "results.csv")
    assert [r["key"] for r in ra] == [f"{c}/img{i}.png" for c in ("cat", "dog") for i in range(3)]
    for x, y in zip(ra, rb):
        assert x["prediction"] == y["prediction"]
        for col in ("confidence", "spread", "border"):
            assert float(x[col]) == pytest.approx(float(y[col]), abs=1e-5)
        label_index = {"cat": 0, "dog": 1}[x["label"]]  # sorted folder names, as ImageFolder
        assert x["correct"] == ("1" if int(x["prediction"]) == label_index else "0")
    assert a["per_class"]["cat"]["images"] == 3 and a["classes_from"] == "label"
    correct = sum(r["correct"] == "1" for r in ra)
    assert a["accuracy"] == pytest.approx(correct / 6)


def test_bad_data_rows_notes_and_escaped_report(tmp_path):
    expected = make_bad_data(tmp_path / "bad")
    summary = camkit.audit(tmp_path / "bad", "tinyfactory:tiny", out=tmp_path / "out", max_pixels=1_000_000, **COMMON)
    rows = {r["key"]: r for r in read_rows(tmp_path / "out" / "results.csv")}
    assert set(rows) == set(expected)
    for key, fragment in expected.items():
        if fragment:
            assert fragment in rows[key]["error"] and rows[key]["prediction"] == "", key
        else:
            assert rows[key]["error"] == "" and rows[key]["prediction"] != "", key
    for key, note in BAD_NOTES.items():
        assert rows[key]["note"] == note
    assert summary["errors"] == 6 and summary["processed"] == 6
    assert summary["error_reasons"]["FILE is empty (0 bytes)"] == 1
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count("<script>") == 1  # only the report's own sorting script
    assert "&lt;script&gt;alert(1)&lt;!--.png" in page and "<!--" not in page
    overlay = rows[SCRIPT_NAME]["overlay"]
    assert overlay.startswith("overlays/script_alert_1_-") and (tmp_path / "out" / overlay).is_file()


class _Stopping(Tiny):
    """Tiny that raises KeyboardInterrupt on its n-th forward, as Ctrl-C in the middle of a batch."""

    stop_at: int | None = None
    calls = 0

    def forward(self, x):
        type(self).calls += 1
        if self.stop_at is not None and type(self).calls >= self.stop_at:
            raise KeyboardInterrupt
        return super().forward(x)


def test_interrupted_run_resumes_with_every_image_once(tmp_path):
    data = make_images(tmp_path / "data", per_class=5)
    net = _Stopping()
    net.stop_at = 3  # batches 1 and 2 finish, batch 3 is in flight
    with pytest.raises(KeyboardInterrupt):
        camkit.audit(data, net, out=tmp_path / "out", batch_size=3, **COMMON)
    parts = sorted((tmp_path / "out" / "parts").glob("*.jsonl"))
    assert len(parts) == 2 and not list((tmp_path / "out" / "parts").glob(".tmp-*"))
    assert not (tmp_path / "out" / "results.csv").exists()
    with pytest.raises(AuditError, match=r"already holds an audit; pass --resume"):
        camkit.audit(data, net, out=tmp_path / "out", batch_size=3, **COMMON)
    with pytest.raises(AuditError, match=r"method changed"):
        camkit.audit(data, net, out=tmp_path / "out", resume=True, **{**COMMON, "method": "gradcam++"})
    net.stop_at = None
    type(net).calls = 0
    summary = camkit.audit(data, net, out=tmp_path / "out", batch_size=3, resume=True, **COMMON)
    assert type(net).calls == 2  # only the 4 remaining images: batches of 3 and 1
    keys = [r["key"] for r in read_rows(tmp_path / "out" / "results.csv")]
    assert keys == [f"{c}/img{i}.png" for c in ("cat", "dog") for i in range(5)] and summary["images"] == 10
    camkit.audit(data, _Stopping(), out=tmp_path / "fresh", **COMMON)
    fresh = read_rows(tmp_path / "fresh" / "results.csv")
    resumed = read_rows(tmp_path / "out" / "results.csv")
    assert [(r["prediction"], round(float(r["spread"]), 5)) for r in resumed] == [
        (r["prediction"], round(float(r["spread"]), 5)) for r in fresh
    ]


def test_limit_then_resume_and_nothing_written_outside_out(tmp_path):
    data = make_images(tmp_path / "data", classes=(), per_class=7)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    first = camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "out", limit=3, **COMMON)
    assert first["images"] == 3 and [r["key"] for r in read_rows(tmp_path / "out" / "results.csv")] == [
        "img0.png", "img1.png", "img2.png",
    ]  # fmt: skip
    second = camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "out", resume=True, **COMMON)
    keys = [r["key"] for r in read_rows(tmp_path / "out" / "results.csv")]
    assert keys == [f"img{i}.png" for i in range(7)] and second["images"] == 7
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if not p.is_relative_to(tmp_path / "out"))
    assert after == before
    assert second["classes_from"] == "prediction" and sum(s["images"] for s in second["per_class"].values()) == 7


def test_faithfulness_auc_matches_the_metrics_functions(tmp_path):
    from camkit.metrics import auc, deletion_curve, insertion_curve

    data = make_images(tmp_path / "data", classes=(), per_class=2)
    camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "out", faithfulness=True, steps=4, save_maps=True, **COMMON)
    rows = read_rows(tmp_path / "out" / "results.csv")
    model, pre = Tiny(), Preprocess(size=(32, 32))
    x = torch.stack([pre(camkit.read_rgb(data / r["key"]))[0] for r in rows])
    maps = torch.stack([torch.from_numpy(np.load(tmp_path / "out" / "maps" / safe_name(r["key"]).replace(".png", ".npy")))
                        for r in rows])  # fmt: skip
    target = torch.tensor([int(r["target"]) for r in rows])
    fd, sd = deletion_curve(model, x, maps, target, steps=4, softmax=True)
    fi, si = insertion_curve(model, x, maps, target, steps=4, softmax=True)
    assert [float(r["deletion_auc"]) for r in rows] == pytest.approx(auc(fd, sd).tolist(), abs=1e-5)
    assert [float(r["insertion_auc"]) for r in rows] == pytest.approx(auc(fi, si).tolist(), abs=1e-5)
    # with 4 steps the trapezoid over fractions 0, .25, .5, .75, 1 of the softmax scores
    assert [float(r["deletion_auc"]) for r in rows] == pytest.approx(
        [float(0.25 * (s[0] / 2 + s[1] + s[2] + s[3] + s[4] / 2)) for s in sd], abs=1e-5
    )


@pytest.mark.parametrize(("method", "layer"), [("saliency", None), ("scorecam", "conv2")])
def test_methods_without_gradient_cam_path_predict_the_same(tmp_path, method, layer):
    # these explainers take the extra no-grad forward for the predictions (explaining.explain_batch)
    data = make_images(tmp_path / "data", classes=(), per_class=2)
    camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "g", **COMMON)
    camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "m", **{**COMMON, "method": method, "layer": layer})
    grad, other = read_rows(tmp_path / "g" / "results.csv"), read_rows(tmp_path / "m" / "results.csv")
    assert [(r["prediction"], r["confidence"], r["target"]) for r in other] == [
        (r["prediction"], r["confidence"], r["target"]) for r in grad
    ]
    assert all(r["error"] == "" and 0 < float(r["spread"]) <= 1 for r in other)
    assert json.loads((tmp_path / "m" / "summary.json").read_text())["method"] == method
