"""The audit pipeline's pieces: batched drawing equals camkit.overlay, the writer, the bounded report."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from audit_helpers import make_images, read_rows

import camkit
from camkit.audit.report import GALLERY, TABLE_ROWS, Summary, render_html
from camkit.audit.stages import _draw_host, draw_overlays
from camkit.modelload import Preprocess

COMMON = {"layer": "conv2", "size": 32, "device": "cpu", "workers": 0, "progress": False}

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_batched_drawing_equals_overlay_one_by_one(device):
    rng = np.random.default_rng(0)
    shown = rng.integers(0, 256, (3, 20, 30, 3), dtype=np.uint8)
    maps = rng.random((3, 20, 30)).astype(np.float32)
    maps[0, 0, 0], maps[1, 0, 0] = 0.5 / 255, 1.5 / 255  # halves: rounding must match
    expected = np.stack([camkit.overlay(shown[i], maps[i]) for i in range(3)])
    on_device = draw_overlays(torch.from_numpy(shown).to(device), torch.from_numpy(maps).to(device))
    assert on_device.device.type == device and np.array_equal(on_device.cpu().numpy(), expected)
    assert np.array_equal(_draw_host(shown, maps, 0.5, "jet"), expected)


def test_jpeg_overlays_by_default_png_on_request_exact_maps_kept(tmp_path):
    data = make_images(tmp_path / "data", classes=(), per_class=3)
    camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "jpg", save_maps=True, writers=3, batch_size=2, **COMMON)
    camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "png", overlay_format="png", **COMMON)
    jpg, png = read_rows(tmp_path / "jpg" / "results.csv"), read_rows(tmp_path / "png" / "results.csv")
    assert all(r["overlay"].endswith(".jpg") for r in jpg) and all(r["overlay"].endswith(".png") for r in png)
    for a, b in zip(jpg, png):
        exact = camkit.read_rgb(tmp_path / "png" / b["overlay"])  # lossless: the drawn pixels
        lossy = camkit.read_rgb(tmp_path / "jpg" / a["overlay"])
        assert exact.shape == lossy.shape == (32, 32, 3)
        # quality 90 with full-resolution colour: about 6 on these noise images (4:2:0 subsampling gives ~45)
        assert np.abs(exact.astype(int) - lossy.astype(int)).mean() < 10
        stem = a["overlay"][len("overlays/") : -len(".jpg")]
        m = np.load(tmp_path / "jpg" / "maps" / f"{stem}.npy")
        assert m.dtype == np.float32 and m.shape == (32, 32)
        shown = Preprocess(size=(32, 32))(camkit.read_rgb(data / a["key"]))[1]  # what the audit shows
        assert np.array_equal(exact, camkit.overlay(shown, m))


def _rows(n):
    rng = np.random.default_rng(1)
    for i in range(n):
        yield {"key": f"{i:05d}.png", "label": "", "prediction_name": "a", "confidence": float(rng.random()),
               "spread": float(rng.random()), "border": float(rng.random()), "correct": None, "overlay": "",
               "error": "" if i % 7 else f"{i:05d}.png is empty (0 bytes)"}  # fmt: skip


def test_report_is_bounded_and_galleries_are_the_extremes(tmp_path):
    columns = ["key", "label", "prediction", "prediction_name", "confidence", "target", "correct", "spread",
               "border", "overlay", "note", "error"]  # fmt: skip
    sizes = {}
    for n in (1000, 6000):
        acc = Summary(columns)
        rows = list(_rows(n))
        for row in rows:
            acc.add(row)
        summary = acc.summary({})
        assert summary["images"] == n and summary["errors"] == len([r for r in rows if r["error"]])
        assert len(acc.table) == TABLE_ROWS and len(summary["failed"]) <= 1000
        ok = [r for r in rows if not r["error"]]
        least = sorted(ok, key=lambda r: (r["confidence"], r["key"]))[:GALLERY]
        assert [r["key"] for r in acc.gallery("confidence", False)] == [r["key"] for r in least]
        most = sorted(ok, key=lambda r: (-r["border"], r["key"]))[:GALLERY]
        assert [r["key"] for r in acc.gallery("border", True)] == [r["key"] for r in most]
        assert summary["confidence"] == pytest.approx(np.mean([r["confidence"] for r in ok]))
        sizes[n] = len(render_html(tmp_path, acc, summary))
    assert sizes[6000] < 1.05 * sizes[1000]


def test_drawing_on_the_device_path_gives_the_host_path_pixels(tmp_path, monkeypatch):
    # the GPU path (draw_overlays on the model's device, then one copy) run on the CPU
    import functools
    import importlib

    from camkit.audit.stages import ExplainStage

    run_module = importlib.import_module("camkit.audit.run")  # camkit.audit is also the function
    data = make_images(tmp_path / "data", classes=(), per_class=3)
    camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "host", overlay_format="png", **COMMON)
    monkeypatch.setattr(run_module, "ExplainStage", functools.partial(ExplainStage, draw_on_device=True))
    camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "dev", overlay_format="png", **COMMON)
    for a, b in zip(read_rows(tmp_path / "host" / "results.csv"), read_rows(tmp_path / "dev" / "results.csv")):
        assert a["overlay"] == b["overlay"]
        assert np.array_equal(
            camkit.read_rgb(tmp_path / "host" / a["overlay"]), camkit.read_rgb(tmp_path / "dev" / b["overlay"])
        )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_audit_matches_the_cpu_audit(tmp_path):
    data = make_images(tmp_path / "data", classes=(), per_class=3)
    cpu = {**COMMON, "overlay_format": "png"}
    camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "cpu", **cpu)
    camkit.audit(data, "tinyfactory:tiny", out=tmp_path / "gpu", **{**cpu, "device": "cuda"})
    for a, b in zip(read_rows(tmp_path / "cpu" / "results.csv"), read_rows(tmp_path / "gpu" / "results.csv")):
        assert a["prediction"] == b["prediction"]
        assert float(a["spread"]) == pytest.approx(float(b["spread"]), abs=1e-4)
        diff = camkit.read_rgb(tmp_path / "cpu" / a["overlay"]).astype(int) - camkit.read_rgb(
            tmp_path / "gpu" / b["overlay"]
        )
        assert np.abs(diff).max() <= 1  # float rounding of the maps on another device
