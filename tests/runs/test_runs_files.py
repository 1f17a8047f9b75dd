"""The run files: the image encoder keeps the pixels it is given, and refuses what is not uint8 RGB."""

from __future__ import annotations

import numpy as np
import pytest

import camkit
from camkit.errors import InvalidInputError
from camkit.runs.files import encode_image


def _decoded(path, data):
    path.write_bytes(data)
    return camkit.read_rgb(path)


def test_encode_image_keeps_rgb_order_and_refuses_other_dtypes(tmp_path):
    rgb = np.zeros((6, 8, 3), np.uint8)
    rgb[:, :4] = (255, 0, 0)  # red left half
    rgb[:, 4:] = (0, 0, 255)  # blue right half
    png = _decoded(tmp_path / "a.png", encode_image(rgb, "png"))
    assert np.array_equal(png, rgb)
    wide = np.zeros((6, 16, 3), np.uint8)
    wide[:, ::2] = rgb  # a strided view is encoded as the pixels it shows
    assert np.array_equal(_decoded(tmp_path / "b.png", encode_image(wide[:, ::2], "png")), rgb)
    jpg = _decoded(tmp_path / "c.jpg", encode_image(rgb, "jpg", 95)).astype(int)
    assert jpg[:, 1, 0].min() > 230 and jpg[:, 1, 2].max() < 25  # red stays red
    assert jpg[:, 6, 2].min() > 230 and jpg[:, 6, 0].max() < 25  # blue stays blue
    with pytest.raises(InvalidInputError, match=r"uint8 RGB \[H, W, 3\], got float32 \[6, 8, 3\]"):
        encode_image(rgb.astype(np.float32))
    with pytest.raises(InvalidInputError, match=r"got uint8 \[6, 8\]"):
        encode_image(rgb[:, :, 0])
