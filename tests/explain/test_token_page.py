"""The HTML view of an answer: self-contained, one button per word carrying exactly that word's overlay."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess

import cv2
import numpy as np
import pytest
import torch

from camkit.explain.tokens_page import token_page
from camkit.viz.overlay import overlay


def _decode(uri: str) -> np.ndarray:
    assert uri.startswith("data:image/png;base64,")
    raw = np.frombuffer(base64.b64decode(uri.split(",", 1)[1]), np.uint8)
    return cv2.imdecode(raw, cv2.IMREAD_COLOR)[:, :, ::-1]


def test_each_word_carries_its_own_overlay_and_nothing_is_fetched():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
    maps = torch.rand(3, 12, 10, generator=torch.Generator().manual_seed(0))
    html = token_page(image, (maps, ["A", " <b>bold</b>", " cube"], [-0.25, -1.5, -3.0]), prompt="Say & tell")
    uris = re.findall(r'data-map="([^"]+)"', html)
    assert len(uris) == 3
    for t, uri in enumerate(uris):
        np.testing.assert_array_equal(_decode(uri), overlay(image, maps[t].numpy()))
    plain = re.search(r'data-plain="([^"]+)"', html)
    assert plain is not None
    np.testing.assert_array_equal(_decode(plain.group(1)), image)
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold" not in html  # words are escaped
    assert "Say &amp; tell" in html
    assert "default-src 'none'" in html and "script-src 'unsafe-inline'" in html
    assert not re.search(r'(src|href)="(?!data:)', html)  # every image inline, nothing linked
    assert "-1.50" in html  # the log-probabilities beside the words


def test_an_object_with_maps_and_tokens():
    from types import SimpleNamespace

    image = np.zeros((4, 4, 3), np.uint8)
    result = SimpleNamespace(maps=[torch.zeros(1, 4, 4), torch.ones(2, 4, 4)], tokens=[["x"], ["a", "b"]],
                             scores=[torch.tensor([0.0]), torch.tensor([-1.0, -2.0])])
    html = token_page(image, result, index=1)
    assert html.count("data-map=") == 2 and "-2.00" in html


@pytest.mark.heavy  # starts headless Chromium
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs headless Chromium")
def test_the_page_shows_the_word_asked_for_in_a_browser(tmp_path):
    image = np.random.default_rng(1).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    maps = torch.rand(3, 6, 8, generator=torch.Generator().manual_seed(1))
    page = tmp_path / "answer.html"
    page.write_text(token_page(image, (maps, ["a", " red", " cube"])), encoding="utf-8")
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", f"{page.as_uri()}#t=1"],
                         capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
    shown = re.search(r'<img id="shown"[^>]*?src="([^"]+)"', dom)
    buttons = re.findall(r"<button[^>]*>", dom)
    assert shown is not None and len(buttons) == 3
    assert 'class="on"' in buttons[1] and not any('class="on"' in b for b in (buttons[0], buttons[2]))
    assert f'data-map="{shown.group(1)}"' in buttons[1]  # the script put word 1's overlay in the picture


def test_a_large_image_is_shrunk_for_the_page():
    image = np.zeros((100, 50, 3), np.uint8)
    html = token_page(image, (torch.rand(1, 100, 50), ["a"]), max_side=40)
    (uri,) = re.findall(r'data-map="([^"]+)"', html)
    assert _decode(uri).shape == (40, 20, 3)
