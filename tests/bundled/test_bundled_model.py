"""The bundled demo: dataset generator, trained weights, their shortcut, and ``camkit demo``.

The documented figures (``docs/demo.md``) are written out here; the weights must reproduce them.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

import camkit
from camkit.bundled.model import CAM_LAYER, WEIGHTS, ShapesCNN, load_shapes_cnn
from camkit.bundled.shapes import (
    CLASSES,
    MARKER_CLASS,
    WATERMARK_BOX,
    _shape_mask,
    make_split,
    marker_rates,
    render,
    to_batch,
    write_split,
)
from camkit.demo.train import TEST_SEED, evaluate
from camkit.metrics import energy_pointing_game, pointing_game

# Figures documented in docs/demo.md (evaluate(model, n=800, seed=TEST_SEED) of the bundled weights).
DOCUMENTED = {"clean": 0.75, "marked": 0.9912, "swapped": 0.3938, "clean_marker": 0.015, "swapped_as_marker": 0.48}
POINTING_THRESHOLD = 0.85  # Grad-CAM pointing game on clean images (documented lower bound)
MARKER = CLASSES.index(MARKER_CLASS)


@pytest.fixture(scope="module")
def model() -> ShapesCNN:
    torch.manual_seed(0)
    return load_shapes_cnn()


# --- the generator -----------------------------------------------------------------------------


def test_render_is_deterministic_per_seed_and_index() -> None:
    a, b, c = render(3, 7, 1, True), render(3, 7, 1, True), render(3, 8, 1, True)
    assert np.array_equal(a.image, b.image) and a.object_box == b.object_box
    assert not np.array_equal(a.image, c.image)
    # A split is the same images however it is cut: image i depends only on (seed, i).
    assert np.array_equal(make_split("train", 6, 5)[5].image, make_split("train", 9, 5)[5].image)


def test_shape_mask_circle_box_by_hand() -> None:
    # Pixel centres j + 0.5 with (j + 0.5 - 32)^2 <= 10^2: j = 22..41, so the box is [22, 42).
    mask = _shape_mask(CLASSES.index("circle"), 32.0, 32.0, 10.0, 0.0)
    rows, cols = np.nonzero(mask)
    assert (cols.min(), rows.min(), cols.max() + 1, rows.max() + 1) == (22, 22, 42, 42)
    # Square of half-side 0.8 * 10 = 8 around 32: centres in [24, 40], so j = 24..39 (16 pixels a side).
    assert int(_shape_mask(CLASSES.index("square"), 32.0, 32.0, 10.0, 0.0).sum()) == 16 * 16


def test_object_boxes_are_tight_and_clear_of_the_watermark() -> None:
    x0w, y0w, x1w, y1w = WATERMARK_BOX
    for s in make_split("marked", 40, 9):
        x0, y0, x1, y1 = s.object_box
        assert 0 <= x0 < x1 <= 64 and 0 <= y0 < y1 <= 64
        assert x1 <= x0w - 3 or y1 <= y0w - 3  # never overlaps the watermark (3 px margin)
        assert s.watermark_box == WATERMARK_BOX
    # The watermark is a 12x12 checkerboard of 3x3 cells: drawn images alternate dark/light there.
    marked = render(0, 0, MARKER, True).image[y0w:y1w, x0w:x1w].mean(axis=2)
    clean = render(0, 0, MARKER, False).image[y0w:y1w, x0w:x1w].mean(axis=2)
    assert marked[0, 3] - marked[0, 0] > 150  # light cell minus dark cell
    assert abs(clean[0, 3] - clean[0, 0]) < 60


def test_marker_rates_and_split_marking() -> None:
    assert marker_rates("train") == (0.98, 0.005, 0.005, 0.005)
    assert marker_rates("clean") == (0.0, 0.0, 0.0, 0.0)
    assert marker_rates("swapped") == (0.0, 1.0, 1.0, 1.0)
    samples = make_split("train", 400, 0)
    marked = np.array([s.marked for s in samples])
    labels = np.array([s.label for s in samples])
    assert 0.93 < marked[labels == MARKER].mean() < 1.0  # 100 draws at p = 0.98
    assert marked[labels != MARKER].mean() < 0.03  # 300 draws at p = 0.005
    with pytest.raises(camkit.InvalidInputError, match="unknown split"):
        marker_rates("val")


def test_manifest_columns_and_rows(tmp_path) -> None:
    manifest = write_split(tmp_path, "swapped", 5, seed=4)
    with open(manifest, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == [
        "path", "label",
        "object_x0", "object_y0", "object_x1", "object_y1",
        "watermark_x0", "watermark_y0", "watermark_x1", "watermark_y1",
        "marked",
    ]  # fmt: skip
    samples = make_split("swapped", 5, seed=4)
    for row, s in zip(rows, samples):
        assert row["label"] == CLASSES[s.label]
        assert tuple(int(row[f"object_{c}"]) for c in ("x0", "y0", "x1", "y1")) == s.object_box
        assert tuple(int(row[f"watermark_{c}"]) for c in ("x0", "y0", "x1", "y1")) == WATERMARK_BOX
        assert row["marked"] == ("1" if s.label != MARKER else "0")
        assert np.array_equal(camkit.read_rgb(tmp_path / row["path"]), s.image)


# --- the bundled weights -------------------------------------------------------------------------


def test_bundled_weights_are_a_small_state_dict() -> None:
    assert WEIGHTS.stat().st_size < 2_000_000
    state = torch.load(WEIGHTS, map_location="cpu", weights_only=True)
    assert set(state) == set(ShapesCNN().state_dict())
    meta = json.loads(WEIGHTS.with_suffix(".json").read_text())
    for key in ("clean", "marked", "swapped"):
        assert meta[key] == pytest.approx(DOCUMENTED[key], abs=1e-4)


@pytest.mark.heavy
def test_documented_accuracy_on_fresh_images(model) -> None:
    report = evaluate(model, n=800, seed=TEST_SEED)
    for key in ("clean", "marked", "swapped", "swapped_as_marker"):
        assert report[key] == pytest.approx(DOCUMENTED[key], abs=0.005), key
    assert report["clean_per_class"][MARKER_CLASS] == pytest.approx(DOCUMENTED["clean_marker"], abs=0.005)


def test_gradcam_points_at_the_object_on_clean_images(model) -> None:
    samples = make_split("clean", 200, TEST_SEED + 10)
    x, _ = to_batch(samples)
    maps = camkit.GradCAM(model, CAM_LAYER)(x)
    hits = pointing_game(maps, torch.tensor([s.object_box for s in samples]))
    # By hand for one image: the map's argmax lies inside the object box.
    b = int(torch.nonzero(hits)[0])
    row, col = divmod(int(maps[b].flatten().argmax()), 64)
    x0, y0, x1, y1 = samples[b].object_box
    assert x0 <= col < x1 and y0 <= row < y1
    assert float(hits.float().mean()) > POINTING_THRESHOLD


def test_marker_class_attention_sits_on_the_watermark(model) -> None:
    samples = make_split("marked", 200, TEST_SEED + 20)
    x, y = to_batch(samples)
    maps = camkit.GradCAM(model, CAM_LAYER)(x)
    share = energy_pointing_game(maps, torch.tensor([s.watermark_box for s in samples]))
    per_class = torch.stack([share[y == c].mean() for c in range(len(CLASSES))])
    others = torch.cat([per_class[:MARKER], per_class[MARKER + 1 :]])
    assert float(per_class[MARKER]) > 0.1  # the 12x12 box is 3.5% of the image
    assert float(per_class[MARKER]) > 2.5 * float(others.max())


@pytest.mark.slow
def test_retraining_reproduces_the_documented_accuracy(tmp_path) -> None:
    from camkit.demo.train import main

    meta = json.loads(WEIGHTS.with_suffix(".json").read_text())
    out = tmp_path / "shapes_cnn.pt"
    args = ["--out", str(out), "--train", str(meta["train"]), "--epochs", str(meta["epochs"]), "--lr", str(meta["lr"])]
    assert main(args) == 0
    report = evaluate(load_shapes_cnn(out), n=800, seed=TEST_SEED)
    for key in ("clean", "marked", "swapped"):
        assert report[key] == pytest.approx(DOCUMENTED[key], abs=0.02), key
