"""The explorer on a detector: one overlay, map and box per detection, through camkit explain's own code path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import camkit
from camkit.errors import InvalidInputError
from camkit.explorer import Session
from camkit.explorer.detect import explain_detections, is_detector


@pytest.fixture(scope="module")
def detector() -> nn.Module:
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    torch.manual_seed(0)
    return fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=96, box_score_thresh=0.0
    ).eval()


@pytest.mark.heavy
def test_every_detection_gets_its_own_map_overlay_and_box(detector, tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    session = Session(detector, device="cpu")
    assert is_detector(session)
    found = explain_detections(session, tmp_path, rgb, "gradcam", score_threshold=0.0, top=3)
    x = torch.from_numpy(rgb).permute(2, 0, 1)[None].float() / 255
    with torch.no_grad():
        raw = detector(x)[0]
    best = torch.sort(raw["scores"], descending=True, stable=True).indices[:3]
    assert len(found) == 3
    assert [r["score"] for r in found] == pytest.approx(raw["scores"][best].tolist())
    assert [r["label"] for r in found] == raw["labels"][best].tolist()
    kept = {k: raw[k][best] for k in ("boxes", "scores", "labels")}
    maps = camkit.GradCAM(detector).explain(x, camkit.DetectionTarget.from_detections([kept], iou_threshold=0.5)).maps[0]
    for j, record in enumerate(found):
        assert record["box"] == pytest.approx(kept["boxes"][j].tolist(), abs=0.01)
        heat = np.load(record["map"])
        assert heat.shape == (48, 64) and heat.dtype == np.float32
        assert np.allclose(heat, maps[j].numpy(), atol=1e-6)
        assert camkit.read_rgb(record["overlay"]).shape == (48, 64, 3) and record["overlay"].startswith(str(tmp_path))
    assert all(not m._forward_hooks and not m._backward_hooks for m in detector.modules())
    assert not any(p.grad is not None for p in detector.parameters()) and not detector.training


def test_a_threshold_nothing_reaches_and_a_classifier_say_so(detector, tmp_path):
    rgb = np.zeros((48, 64, 3), np.uint8)
    with pytest.raises(InvalidInputError, match=r"no detection with score >= 0\.999"):
        explain_detections(Session(detector, device="cpu"), tmp_path, rgb, score_threshold=0.999)
    with pytest.raises(InvalidInputError, match="not a detector"):
        explain_detections(Session("demo", device="cpu"), tmp_path, rgb)


@pytest.mark.slow
def test_the_explain_tab_callbacks_list_one_clickable_per_detection(detector, tmp_path):
    gr = pytest.importorskip("gradio")
    from camkit.explorer.explain_tab import detection_select, detections_update, explain_action, upload_action

    path = tmp_path / "street.png"
    camkit.save_png(path, np.random.default_rng(1).integers(0, 256, size=(48, 64, 3), dtype=np.uint8))
    session = Session(detector, device="cpu")
    picture, classes, _, _ = upload_action(session, str(path), "gradcam")
    assert picture.shape == (48, 64, 3) and classes["choices"] == []
    with pytest.raises(gr.Error, match=r"no detection with score >= 0\.5"):  # the default threshold, random weights
        explain_action(session, tmp_path / "out", str(path), "gradcam", "", "")
    settings = '{"score_threshold": 0.0, "top": 3}'
    png, npy, prediction, found = explain_action(session, tmp_path / "out", str(path), "gradcam", "", "", settings)
    assert (png, npy) == (found[0]["overlay"], found[0]["map"]) and prediction["shown"] == 0
    assert [d["score"] for d in prediction["detections"]] == [r["score"] for r in found]
    assert len(found) == 3 and np.load(npy).shape == (48, 64)
    gallery = detections_update(found)
    assert gallery["visible"] is True and [p for p, _ in gallery["value"]] == [r["overlay"] for r in found]
    last = len(found) - 1
    assert detection_select(found, gr.SelectData(None, {"index": last, "value": None})) == (found[last]["overlay"], found[last]["map"])
    assert detections_update(None)["visible"] is False


def test_detections_explained_again_come_from_the_cache_while_their_files_exist(detector, tmp_path):
    rgb = np.random.default_rng(5).integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    session = Session(detector, device="cpu")
    calls = []
    hook = detector.backbone.register_forward_hook(lambda *_: calls.append(1))
    try:
        found = explain_detections(session, tmp_path, rgb, "gradcam", score_threshold=0.0, top=1)
        runs = len(calls)
        assert runs > 0 and explain_detections(session, tmp_path, rgb, "gradcam", score_threshold=0.0, top=1) == found
        assert len(calls) == runs  # served from the cache
        for record in found:  # the files are gone: explained again, written again
            for key in ("map", "overlay"):
                Path(record[key]).unlink()
        again = explain_detections(session, tmp_path, rgb, "gradcam", score_threshold=0.0, top=1)
        assert len(calls) > runs and again == found and all(Path(r["map"]).is_file() for r in again)
    finally:
        hook.remove()
