"""``camkit explain`` on a torchvision detector and on an ultralytics checkpoint (saved here from its yaml)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tinyfactory import tiny_detector

import camkit
from camkit.cli import main
from camkit.detection import detections_of
from camkit.explain.files import explain_files
from camkit.modelload import load_model


def _image(path: Path, height: int, width: int) -> str:
    rng = np.random.default_rng(0)
    picture = np.full((height, width, 3), 60, np.uint8)
    picture[10:40, 20:70] = rng.integers(100, 255, (30, 50, 3), dtype=np.uint8)
    camkit.save_png(path, picture)
    return str(path)


def test_explain_torchvision_detector(tmp_path: Path, one_thread: None) -> None:
    image = _image(tmp_path / "street.png", 48, 80)
    out = tmp_path / "out"
    code = main(["explain", image, "--model", "tinyfactory:tiny_detector", "--device", "cpu", "--out", str(out),
                 "--score-threshold", "0.3", "--top", "2"])  # fmt: skip
    assert code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == "detect" and manifest["layer"] == ["backbone.body.16"]
    dets = manifest["images"][0]["detections"]
    model = tiny_detector().eval()
    x = torch.from_numpy(camkit.read_rgb(image)).permute(2, 0, 1).float()[None] / 255.0
    with torch.no_grad():
        found = model(x)[0]
    keep = (found["scores"] >= 0.3).nonzero().flatten()[:2]  # torchvision sorts by score
    assert len(dets) == len(keep) == 2
    expected = camkit.GradCAM(model).explain(x, camkit.DetectionTarget.from_detections([{k: v[keep] for k, v in found.items()}]))
    for j, det in enumerate(dets):
        assert det["score"] == pytest.approx(float(found["scores"][keep[j]])) and det["label"] == int(found["labels"][keep[j]])
        assert det["box"] == pytest.approx(found["boxes"][keep[j]].tolist(), abs=0.01)
        saved = np.load(out / det["map"])
        assert saved.shape == (48, 80)  # the image's own size: the detector's resize is undone
        np.testing.assert_allclose(saved, expected.maps[0, j].numpy(), atol=1e-5)
        drawn = camkit.read_rgb(out / det["overlay"])
        plain = camkit.overlay(camkit.read_rgb(image), torch.from_numpy(saved))
        x1, _, x2, y2 = (round(v) for v in det["box"])
        assert drawn.shape == (48, 80, 3) and (drawn[min(y2, 47), (x1 + x2) // 2] == 255).all()  # the box's bottom edge
        assert (plain != drawn).any()


def test_explain_detector_that_keeps_nothing_says_which_threshold(tmp_path: Path) -> None:
    image = _image(tmp_path / "a.png", 48, 80)
    out = tmp_path / "out"
    assert main(["explain", image, "--model", "tinyfactory:tiny_detector", "--device", "cpu", "--out", str(out),
                 "--score-threshold", "1.0"]) == 1  # fmt: skip
    error = json.loads((out / "manifest.json").read_text())["images"][0]["error"]
    assert "no detection with score >= 1.0" in error and "--score-threshold" in error and "roi_heads.score_thresh" in error
    with pytest.raises(camkit.InvalidInputError, match="--target 2 has no meaning"):
        explain_files([image], tiny_detector(), out=tmp_path / "o2", target=2, device="cpu")


@pytest.fixture
def yolo_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("ultralytics")
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path / "yolo_config"))
    from ultralytics import YOLO

    torch.manual_seed(0)
    path = tmp_path / "tiny.pt"
    yolo = YOLO("yolov8n.yaml")
    with torch.no_grad():  # the class head's prior (bias -11.5: p ~ 1e-5) leaves no gradient to see; start at p = 0.5
        for branch in yolo.model.model[-1].cv3:
            branch[-1].bias.zero_()
    yolo.save(str(path))
    return path


def test_explain_ultralytics_checkpoint(tmp_path: Path, yolo_checkpoint: Path) -> None:
    image = _image(tmp_path / "street.png", 50, 90)
    out = tmp_path / "out"
    spec = f"ultralytics:{yolo_checkpoint}"
    with pytest.raises(camkit.ModelLoadError, match="--trust-pickle"):
        load_model(spec)
    code = main(["explain", image, "--model", spec, "--trust-pickle", "--size", "96", "--device", "cpu",
                 "--out", str(out), "--score-threshold", "0.0", "--top", "3"])  # fmt: skip
    assert code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["layer"] == ["model.15", "model.18", "model.21"]
    dets = manifest["images"][0]["detections"]
    assert len(dets) == 3 and [d["score"] for d in dets] == sorted((d["score"] for d in dets), reverse=True)
    # by hand: ultralytics' letterbox (90 wide -> 96, 50 high -> 53, padded to 64), then the map taken back
    loaded = load_model(spec, trust_pickle=True, size=96, device="cpu")
    x, _ = loaded.preprocess(camkit.read_rgb(image))
    assert tuple(x.shape) == (3, 64, 96) and loaded.preprocess.window(50, 90) == (5, 0, 53, 96)
    for det in dets:
        box = np.array(det["box"])
        assert (box >= 0).all() and box[2] <= 90 and box[3] <= 50  # in the image's own pixels
        saved = np.load(out / det["map"])
        assert saved.shape == (50, 90) and saved.max() == pytest.approx(1.0, abs=0.05)
    # the same from the pieces: ultralytics' NMS-kept candidates, one call for all three, each map taken back
    with torch.no_grad():
        found = detections_of(loaded.model, loaded.model.eval()(x[None]), (64, 96))[0]
    order = torch.sort(found["scores"], descending=True, stable=True).indices[:3]
    kept = {k: v[order] for k, v in found.items()}
    maps = camkit.GradCAM(loaded.model).explain(x[None], camkit.DetectionTarget.from_detections([kept])).maps[0]
    for j, det in enumerate(dets):
        assert det["score"] == pytest.approx(float(kept["scores"][j])) and det["label"] == int(kept["labels"][j])
        back, _ = loaded.preprocess.invert_map(maps[j], 50, 90)
        np.testing.assert_allclose(np.load(out / det["map"]), back.numpy(), atol=1e-5)
        expected_box = loaded.preprocess.inverse_boxes(kept["boxes"][j : j + 1].double().numpy(), 50, 90)[0]
        assert det["box"] == pytest.approx(expected_box.tolist(), abs=0.01)


def test_explain_segmenter_one_overlay_per_predicted_class(tmp_path: Path) -> None:
    from tinyfactory import tiny_segmenter

    image = _image(tmp_path / "scene.png", 48, 80)
    out = tmp_path / "out"
    assert main(["explain", image, "--model", "tinyfactory:tiny_segmenter", "--size", "64", "--device", "cpu",
                 "--out", str(out)]) == 0  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == "segment"
    loaded = load_model(tiny_segmenter(), size=64, device="cpu")
    x, _ = loaded.preprocess(camkit.read_rgb(image))
    with torch.no_grad():
        predicted = loaded.model.eval()(x[None])["out"].argmax(dim=1)
    classes = manifest["images"][0]["classes"]
    assert [c["label"] for c in classes] == torch.unique(predicted).tolist()
    for c in classes:
        maps = camkit.GradCAM(loaded.model).explain(x[None], camkit.SegmentationTarget(c["label"])).maps[0]
        back, _ = loaded.preprocess.invert_map(maps, 48, 80)
        np.testing.assert_allclose(np.load(out / c["map"]), back.numpy(), atol=1e-5)
        assert camkit.read_rgb(out / c["overlay"]).shape == (48, 80, 3)
