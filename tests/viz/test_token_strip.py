"""The strip of overlays of a generated answer: one panel per word, the word beneath, the map drawn as it is."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from camkit.errors import InvalidInputError
from camkit.viz.overlay import overlay
from camkit.viz.tokens import shown_word, token_maps, token_strip

pytest.importorskip("matplotlib")


def _answer() -> tuple[np.ndarray, torch.Tensor, list[str]]:
    image = np.full((16, 16, 3), 128, np.uint8)
    maps = torch.zeros(3, 16, 16)
    maps[0, :, :8] = 1.0  # word 0: the left half
    maps[1, :, 8:] = 1.0  # word 1: the right half
    return image, maps, ["A", " red", " cube"]


def test_each_panel_is_the_words_overlay_in_its_place():
    image, maps, words = _answer()
    fig = token_strip(image, maps, words, columns=2, panel=2.0, dpi=50)
    assert fig.columns == ("token 0", "token 1", "token 2")
    assert [fig.titles[k] for k in sorted(fig.titles, key=lambda k: k[1])] == ["A", "red", "cube"]
    assert set(fig.panels) == {(0, "token 0"), (0, "token 1"), (1, "token 2")}  # wrapped at 2 a row
    for t in (0, 1):
        x0, y0, x1, y1 = fig.panels[(0, f"token {t}")]
        drawn = fig.image[y0 + 3 : y1 - 3, x0 + 3 : x1 - 3].astype(float)
        half = drawn.shape[1] // 2
        left, right = drawn[:, :half].mean(axis=(0, 1)), drawn[:, half:].mean(axis=(0, 1))
        hot, cold = overlay(image, np.ones((16, 16)))[0, 0], overlay(image, np.zeros((16, 16)))[0, 0]
        expect_left, expect_right = (hot, cold) if t == 0 else (cold, hot)
        np.testing.assert_allclose(left, expect_left, atol=12)  # the map's hot half is where the word looks
        np.testing.assert_allclose(right, expect_right, atol=12)


def test_an_object_with_maps_and_tokens_per_prompt():
    image, maps, words = _answer()
    result = SimpleNamespace(maps=[maps[:1], maps], tokens=[["x"], words], scores=[torch.tensor([-0.5]), torch.tensor([-1.0, -2.0, -3.0])])
    got, labels, scores = token_maps(result, index=1)
    assert torch.equal(got, maps) and labels == words and scores == [-1.0, -2.0, -3.0]
    fig = token_strip(image, result, index=1, dpi=30)
    assert fig.titles[(0, "token 2")] == "cube"
    with pytest.raises(InvalidInputError, match="index 2 is out of range"):
        token_strip(image, result, index=2)


def test_bad_input_is_refused_clearly():
    image, maps, words = _answer()
    with pytest.raises(InvalidInputError, match="3 maps, 2 words"):
        token_strip(image, maps, words[:2])
    with pytest.raises(InvalidInputError, match=r"\[T, H, W\]"):
        token_strip(image, maps[0], words[:1])
    with pytest.raises(InvalidInputError, match="3 maps, 1 scores"):
        token_strip(image, maps, words, scores=[0.0])
    with pytest.raises(InvalidInputError, match="GenerationExplanation"):
        token_strip(image, {"maps": maps}, words)


def test_words_as_labels():
    assert [shown_word(w) for w in (" cat", "  ", "\n", "a b")] == ["cat", "␣", "\\n", "a b"]
