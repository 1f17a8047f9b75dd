"""Overlays (known pixel values, RGB order, no mutation) and image IO."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import camkit
from camkit.functional import colorize, overlay_batch

# OpenCV's jet in RGB order: index 0 is dark blue, 64 light blue, 128 green-ish, 255 dark red.
JET = {0: (0, 0, 128), 64: (0, 128, 255), 128: (130, 255, 126), 255: (128, 0, 0)}


def test_overlay_known_pixels():
    image = np.zeros((1, 4, 3), np.uint8)
    image[:] = (100, 150, 200)
    heat = np.array([[0.0, 64 / 255, 128 / 255, 1.0]], np.float32)
    out = camkit.overlay(image, heat, alpha=0.5)
    for col, index in enumerate([0, 64, 128, 255]):
        expected = [round(0.5 * c + 0.5 * j) for c, j in zip((100, 150, 200), JET[index])]
        assert out[0, col].tolist() == expected, (col, out[0, col], expected)
    # alpha = 0 is the image, alpha = 1 the colour map, in RGB order (red for 1.0)
    assert camkit.overlay(image, heat, alpha=0.0).tolist() == image.tolist()
    assert camkit.overlay(image, heat, alpha=1.0)[0, 3].tolist() == [128, 0, 0]


def test_overlay_input_kinds_agree_and_are_not_modified():
    rng = np.random.default_rng(0)
    array = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
    before = array.copy()
    heat = torch.rand(3, 2, generator=torch.Generator().manual_seed(0))
    heat_before = heat.clone()
    from_array = camkit.overlay(array, heat)
    from_pil = camkit.overlay(Image.fromarray(array), heat)
    from_tensor = camkit.overlay(torch.from_numpy(array).permute(2, 0, 1).float() / 255, heat)
    assert from_array.shape == (6, 5, 3) and from_array.dtype == np.uint8
    assert np.array_equal(from_array, from_pil)
    assert np.abs(from_array.astype(int) - from_tensor.astype(int)).max() <= 1
    assert np.array_equal(array, before) and torch.equal(heat, heat_before)


def test_overlay_resizes_heatmap_and_rejects_batches():
    out = camkit.overlay(np.zeros((10, 20, 3), np.uint8), np.ones((2, 4)), alpha=1.0)
    assert out.shape == (10, 20, 3) and (out == np.array([128, 0, 0])).all()
    with pytest.raises(camkit.InvalidInputError, match="not batches"):
        camkit.overlay(torch.zeros(2, 3, 4, 4), torch.zeros(4, 4))
    with pytest.raises(camkit.InvalidInputError, match="unknown colormap"):
        camkit.overlay(np.zeros((2, 2, 3), np.uint8), np.zeros((2, 2)), colormap="nope")
    with pytest.raises(camkit.InvalidInputError, match="uint8"):
        camkit.overlay(np.zeros((2, 2, 3), np.float64), np.zeros((2, 2)))


def test_batched_overlay_equals_single_image_overlay():
    images = torch.rand(3, 3, 8, 6, generator=torch.Generator().manual_seed(1))
    maps = torch.rand(3, 8, 6, generator=torch.Generator().manual_seed(2))
    batched = overlay_batch(images, maps, alpha=0.4, colormap="viridis")
    assert batched.shape == (3, 3, 8, 6) and batched.dtype == torch.uint8
    for i in range(3):
        single = camkit.overlay(images[i], maps[i], alpha=0.4, colormap="viridis")
        diff = (batched[i].permute(1, 2, 0).numpy().astype(int) - single.astype(int)).__abs__().max()
        assert diff <= 1


def test_colorize_matches_opencv_table():
    maps = torch.tensor([[[0.0, 1.0]]])
    rgb = colorize(maps)
    assert rgb.shape == (1, 3, 1, 2)
    assert rgb[0, :, 0, 0].tolist() == list(JET[0]) and rgb[0, :, 0, 1].tolist() == list(JET[255])


def test_png_roundtrip_and_odd_images(tmp_path):
    rgb = np.zeros((4, 5, 3), np.uint8)
    rgb[..., 0] = 255  # pure red
    camkit.save_png(tmp_path / "red.png", rgb)
    assert camkit.read_rgb(tmp_path / "red.png")[0, 0].tolist() == [255, 0, 0]
    import cv2

    cv2.imwrite(str(tmp_path / "gray.png"), np.full((3, 3), 77, np.uint8))
    assert camkit.read_rgb(tmp_path / "gray.png")[1, 1].tolist() == [77, 77, 77]
    cv2.imwrite(str(tmp_path / "deep.png"), np.full((3, 3, 3), 65535, np.uint16))
    assert camkit.read_rgb(tmp_path / "deep.png")[0, 0].tolist() == [255, 255, 255]
    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[..., 2] = 200  # BGR(A) order on disk: red channel
    rgba[..., 3] = 255
    cv2.imwrite(str(tmp_path / "rgba.png"), rgba)
    assert camkit.read_rgb(tmp_path / "rgba.png")[0, 0].tolist() == [200, 0, 0]
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(camkit.InvalidInputError, match="empty"):
        camkit.read_rgb(tmp_path / "empty.png")
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(camkit.InvalidInputError, match="could not be decoded"):
        camkit.read_rgb(tmp_path / "text.png")


def test_load_image_normalises(tmp_path):
    camkit.save_png(tmp_path / "a.png", np.full((8, 8, 3), 255, np.uint8))
    x, shown = camkit.load_image(tmp_path / "a.png", size=(4, 6))
    assert x.shape == (1, 3, 4, 6) and shown.shape == (4, 6, 3)
    expected = (1 - torch.tensor(camkit.io.IMAGENET_MEAN)) / torch.tensor(camkit.io.IMAGENET_STD)
    torch.testing.assert_close(x[0, :, 0, 0], expected)
    assert (shown == 255).all()


def test_save_png_honours_the_umask(tmp_path):
    import os
    import stat

    from camkit._internal.files import refresh_umask

    old = os.umask(0o027)
    try:
        refresh_umask()
        camkit.save_png(tmp_path / "a.png", np.zeros((4, 4, 3), np.uint8))
        os.umask(0o002)
        refresh_umask()
        camkit.save_png(tmp_path / "b.png", np.zeros((4, 4, 3), np.uint8))
    finally:
        os.umask(old)
        refresh_umask()
    assert stat.S_IMODE((tmp_path / "a.png").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "b.png").stat().st_mode) == 0o664
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []
