"""Issue 16, cases 1-7 and 9 in-process: outputs never lost, inputs read as meant, safe resume, no silent rows.

(Case 8, exit codes and one-line messages, runs the command line: test_audit_exitcodes.py.)
"""

from __future__ import annotations

import json
import os
import stat
import warnings

import numpy as np
import pytest
import torch
from audit_helpers import make_images, read_rows
from tinyfactory import Tiny

import camkit
from camkit.audit.run import AuditError
from camkit.errors import CamkitWarning, InvalidInputError
from camkit.explain.files import explain_files
from camkit.modelload import ModelLoadError, Preprocess, load_model
from camkit.runs.data import discover
from camkit.runs.labels import LabelMappingError

COMMON = {"layer": "conv2", "size": 32, "device": "cpu", "workers": 0, "progress": False}


# 1. a non-empty --out that is not a camkit run is refused, nothing touched, unless --overwrite


def test_foreign_out_folder_refused_untouched_then_overwrite_keeps_other_files(tmp_path):
    data = make_images(tmp_path / "data", classes=(), per_class=2)
    out = tmp_path / "out"
    out.mkdir()
    mine = {"results.csv": "my,own\n1,2\n", "summary.json": '{"mine": 1}', "report.html": "<p>mine</p>"}
    for name, text in {**mine, "notes.txt": "keep me"}.items():
        (out / name).write_text(text)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    with pytest.raises(AuditError, match=r"is not empty and is not a camkit run .*--overwrite"):
        camkit.audit(data, "tinyfactory:tiny", out=out, **COMMON)
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before
    summary = camkit.audit(data, "tinyfactory:tiny", out=out, overwrite=True, **COMMON)
    assert summary["images"] == 2 and (out / "notes.txt").read_text() == "keep me"
    assert [r["key"] for r in read_rows(out / "results.csv")] == ["img0.png", "img1.png"]
    # a camkit run there now: a plain rerun is refused, --overwrite starts it afresh (no stale parts)
    with pytest.raises(AuditError, match="already holds an audit"):
        camkit.audit(data, "tinyfactory:tiny", out=out, **COMMON)
    camkit.audit(data, "tinyfactory:tiny", out=out, overwrite=True, limit=1, **COMMON)
    assert [r["key"] for r in read_rows(out / "results.csv")] == ["img0.png"]
    assert len(list((out / "parts").glob("*.jsonl"))) == 1


# 2. the output folder is never read as data, --out inside DATA included


def test_out_inside_data_is_never_audited_and_resume_keeps_the_count(tmp_path):
    data = make_images(tmp_path / "data", per_class=2)
    kw = {**COMMON, "alphabetical_classes": True}
    first = camkit.audit(data, "tinyfactory:tiny", out=data / "audit", **kw)
    assert first["images"] == 4 and set(first["per_class"]) == {"cat", "dog"}
    again = camkit.audit(data, "tinyfactory:tiny", out=data / "audit", resume=True, **kw)
    assert again["images"] == 4 and set(again["per_class"]) == {"cat", "dog"}
    # another run folder inside DATA (it holds run.json) is skipped too, on a run with another --out
    other = camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "elsewhere", **kw)
    assert [r["key"] for r in read_rows(tmp_path / "elsewhere" / "results.csv")] == [
        "cat/img0.png", "cat/img1.png", "dog/img0.png", "dog/img1.png",
    ]  # fmt: skip
    assert other["images"] == 4


# 3. symbolic-link class folders are followed (no loops); nothing to audit is an error


def test_symlinked_class_folders_are_followed_once(tmp_path):
    real = make_images(tmp_path / "real", per_class=2)
    data = tmp_path / "data"
    data.mkdir()
    os.symlink(real / "cat", data / "cat")
    os.symlink(real / "dog", data / "dog")
    os.symlink(data, real / "cat" / "loop")  # a link back up: must not recurse forever
    found = discover(data)
    assert found.kind == "classes"
    assert [(r.key, r.label) for r in found.records] == [
        ("cat/img0.png", "cat"), ("cat/img1.png", "cat"), ("dog/img0.png", "dog"), ("dog/img1.png", "dog"),
    ]  # fmt: skip
    summary = camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "out", alphabetical_classes=True, **COMMON)
    assert summary["images"] == 4 and summary["errors"] == 0


def test_nothing_to_audit_is_an_error(tmp_path):
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    with pytest.raises(InvalidInputError, match="nothing to audit: no image files"):
        camkit.audit(tmp_path / "empty", "tinyfactory:tiny", out=tmp_path / "o1", **COMMON)
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("x")
    with pytest.raises(InvalidInputError, match=r"found 1 file\(s\), none an image"):
        camkit.audit(tmp_path / "texts", "tinyfactory:tiny", out=tmp_path / "o2", **COMMON)
    (tmp_path / "m.csv").write_text("path,label\n")
    with pytest.raises(InvalidInputError, match="lists no image"):
        camkit.audit(tmp_path / "m.csv", "tinyfactory:tiny", out=tmp_path / "o3", **COMMON)
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3"))


# 4. labels need an explicit mapping; the demo model brings its own class list


def test_label_mapping_needs_a_source_and_is_recorded(tmp_path):
    data = make_images(tmp_path / "data", per_class=1)
    with pytest.raises(LabelMappingError, match=r"would map to: 0=cat, 1=dog\. Pass --classes"):
        camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "a", **COMMON)
    assert not (tmp_path / "a").exists()
    given = camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "b", classes=["bird", "dog", "cat"], **COMMON)
    assert given["label_mapping"] == {"source": "classes", "classes": ["bird", "dog", "cat"]}
    rows = read_rows(tmp_path / "b" / "results.csv")
    for r in rows:  # cat is output 2 and dog output 1 under this list
        assert r["correct"] == ("1" if int(r["prediction"]) == {"cat": 2, "dog": 1}[r["label"]] else "0")
    with pytest.raises(LabelMappingError, match=r"label\(s\) \['dog'\] are not in --classes"):
        camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "c", classes=["cat", "bird"], **COMMON)
    saved = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert saved["label_mapping"]["source"] == "classes"


def test_demo_model_classes_map_folders_in_its_own_order(tmp_path):
    from camkit.bundled.shapes import CLASSES, make_split

    data = tmp_path / "shapes"
    for i, sample in enumerate(make_split("marked", 16, seed=5)):
        folder = data / CLASSES[sample.label]
        folder.mkdir(parents=True, exist_ok=True)
        camkit.save_png(folder / f"{i}.png", sample.image)
    # sorted folder names (circle, cross, square, triangle) differ from the model's order
    assert sorted(CLASSES) != list(CLASSES)
    summary = camkit.audit(data, "demo", out=tmp_path / "out", device="cpu", workers=0, progress=False)
    assert summary["label_mapping"] == {"source": "model", "classes": list(CLASSES)}
    assert summary["accuracy"] >= 0.9  # the trained model on its own kind of images (alphabetical: ~25%)
    loaded = load_model("demo", device="cpu")
    assert loaded.preprocess == Preprocess(size=(64, 64), mean=(0.0,) * 3, std=(1.0,) * 3)
    assert loaded.categories == list(CLASSES)


# 5. non-finite scores or maps give error rows with the reason


class _NaNOnBright(Tiny):
    """Tiny whose scores are NaN for images brighter than average."""

    def forward(self, x):
        out = super().forward(x)
        bright = x.mean(dim=(1, 2, 3)) > 0
        return torch.where(bright[:, None], torch.full_like(out, float("nan")), out)


def test_non_finite_scores_are_error_rows(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    camkit.save_png(data / "dark.png", np.full((16, 16, 3), 10, np.uint8))
    camkit.save_png(data / "bright.png", np.full((16, 16, 3), 250, np.uint8))
    summary = camkit.audit(data, _NaNOnBright(), out=tmp_path / "out", mean=(0.5,) * 3, std=(0.5,) * 3, **COMMON)
    rows = {r["key"]: r for r in read_rows(tmp_path / "out" / "results.csv")}
    assert rows["bright.png"]["error"].startswith("the model's scores are not finite")
    assert rows["bright.png"]["confidence"] == rows["bright.png"]["overlay"] == ""
    assert rows["dark.png"]["error"] == "" and 0 < float(rows["dark.png"]["confidence"]) <= 1
    assert summary["errors"] == 1 and summary["processed"] == 1
    with pytest.raises(ModelLoadError, match="--std must be three positive numbers"):
        camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "o2", mean=(0.0,) * 3, std=(0.0,) * 3, **COMMON)


# 6. resume needs run.json, refuses changed weights, redoes a corrupt part


def test_resume_needs_run_json_and_the_same_weights(tmp_path):
    data = make_images(tmp_path / "data", classes=(), per_class=3)
    weights = tmp_path / "w.pt"
    torch.save(Tiny(seed=1).state_dict(), weights)
    kw = {**COMMON, "weights": str(weights)}
    camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "out", limit=2, **kw)
    torch.save(Tiny(seed=2).state_dict(), weights)  # replaced at the same path
    with pytest.raises(AuditError, match="weights_sha256 changed"):
        camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "out", resume=True, **kw)
    torch.save(Tiny(seed=1).state_dict(), weights)  # the same weights again
    with pytest.raises(AuditError, match=r"settings than the run in .*: max_pixels changed"):
        camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "out", resume=True, max_pixels=10, **kw)
    assert camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "out", resume=True, **kw)["images"] == 3
    (tmp_path / "out" / "run.json").unlink()
    with pytest.raises(AuditError, match=r"holds parts/ but no run\.json"):
        camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "out", resume=True, **kw)


def test_corrupt_part_is_reported_and_redone(tmp_path):
    data = make_images(tmp_path / "data", classes=(), per_class=4)
    out = tmp_path / "out"
    camkit.audit(data, "tinyfactory:tiny", out=out, batch_size=2, limit=4, **COMMON)
    parts = sorted((out / "parts").glob("*.jsonl"))
    assert len(parts) == 2
    parts[0].write_text('{"key": "img0.png", "label": ""\n')  # cut short
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = camkit.audit(data, "tinyfactory:tiny", out=out, resume=True, **COMMON)
    messages = [str(w.message) for w in caught if issubclass(w.category, CamkitWarning)]
    assert any(parts[0].name in m and "is not JSON" in m and "audited again" in m for m in messages), messages
    assert summary["images"] == 4 and summary["images_this_run"] == 2 and summary["errors"] == 0
    assert len(summary["corrupt_parts_redone"]) == 1 and (out / "parts" / f"{parts[0].name}.corrupt").is_file()
    assert [r["key"] for r in read_rows(out / "results.csv")] == [f"img{i}.png" for i in range(4)]


# 7. files honour the umask


def test_output_files_honour_the_umask(tmp_path):
    data = make_images(tmp_path / "data", classes=(), per_class=1)
    old = os.umask(0o027)
    try:
        camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "out", save_maps=True, **COMMON)
    finally:
        os.umask(old)
    out = tmp_path / "out"
    files = [out / n for n in ("results.csv", "summary.json", "report.html", "run.json")]
    files += [*(out / "overlays").iterdir(), *(out / "maps").iterdir(), *(out / "parts").iterdir()]
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {oct(0o640)}


# 9. explain: overlays at each image's own size, --max-pixels, random weights announced


def test_explain_overlays_at_the_image_size_through_the_resize(tmp_path):
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)
    camkit.save_png(tmp_path / "wide.png", rgb)
    manifest = explain_files([tmp_path / "wide.png"], Tiny(), out=tmp_path / "out", layer="conv2", size=32,
                                    device="cpu")  # fmt: skip
    entry = manifest["images"][0]
    drawn = camkit.read_rgb(tmp_path / "out" / entry["overlays"][0])
    small = np.load(tmp_path / "out" / entry["map"])
    assert drawn.shape == (40, 56, 3) and small.shape == (32, 32)
    full = torch.nn.functional.interpolate(torch.from_numpy(small)[None, None], size=(40, 56), mode="bilinear",
                                           align_corners=False)[0, 0]  # fmt: skip
    assert np.array_equal(drawn, camkit.overlay(rgb, full))


def test_invert_map_undoes_resize_and_centre_crop():
    pre = Preprocess(resize=4, crop=(4, 4), mean=(0.0,) * 3, std=(1.0,) * 3)
    heat = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    # an 8x16 image: resized to 4x8, the crop takes columns 2..5 of that
    full, inside = pre.invert_map(heat, 8, 16)
    assert full.shape == (8, 16) and inside.sum() == 8 * 8
    assert inside[:, 4:12].all() and not inside[:, :4].any() and not inside[:, 12:].any()
    frame = torch.zeros(1, 1, 4, 8)
    frame[0, 0, :, 2:6] = heat
    expected = torch.nn.functional.interpolate(frame, size=(8, 16), mode="bilinear", align_corners=False)[0, 0]
    assert torch.allclose(full[:, 4:12], expected[:, 4:12]) and (full[:, :4] == 0).all()


def test_explain_max_pixels_and_random_weights_warning(tmp_path):
    camkit.save_png(tmp_path / "a.png", np.zeros((20, 20, 3), np.uint8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manifest = explain_files([tmp_path / "a.png"], "torchvision:resnet18", out=tmp_path / "out",
                                        size=64, device="cpu", max_pixels=100)  # fmt: skip
    assert "more than max_pixels=100; raise --max-pixels" in manifest["images"][0]["error"]
    assert any("random weights" in str(w.message) for w in caught if issubclass(w.category, CamkitWarning))
