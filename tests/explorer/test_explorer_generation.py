"""The explorer on a vision-language model, without a browser: the session, the Explain tab's callbacks, the page."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import camkit
from camkit.errors import InvalidInputError

pytest.importorskip("transformers")
gr = pytest.importorskip("gradio")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vlm"))
import tiny_llava  # noqa: E402

from camkit.explorer.app import build_app  # noqa: E402
from camkit.explorer.generation import GenerationSession  # noqa: E402
from camkit.explorer.generation_tab import generation_action, word_action  # noqa: E402
from camkit.viz.overlay import overlay  # noqa: E402

PROMPT = "what is in the picture ?"
pytestmark = pytest.mark.heavy  # a tiny LLaVA built, matplotlib and Gradio loaded: tens of seconds on a loaded machine


@pytest.fixture(scope="module")
def pair():
    return tiny_llava.build()


@pytest.fixture(scope="module")
def session(pair):
    return GenerationSession(*pair)


@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "a.png"
    camkit.save_png(path, np.random.default_rng(1).integers(0, 256, (36, 44, 3), dtype=np.uint8))
    return path


def test_the_session_gives_the_python_apis_explanation_and_caches_it(session, pair, image_file):
    result = session.explain(str(image_file), PROMPT, "gradcam", max_new_tokens=3)
    want = camkit.explain_generation(*pair, camkit.read_rgb(image_file), PROMPT, max_new_tokens=3)
    assert [t["token"] for t in result.tokens] == want.tokens[0]
    torch.testing.assert_close(result.explanation.maps[0], want.maps[0])
    assert result.answer == pair[1].tokenizer.decode(want.token_ids[0].tolist())
    assert session.explain(str(image_file), PROMPT, "gradcam", max_new_tokens=3) is result
    np.testing.assert_array_equal(result.word_overlay(1), overlay(result.image, want.maps[0][1].numpy()))
    assert "gradcam" in session.methods()


def test_the_tabs_callbacks(session, image_file, tmp_path):
    strip, words, page, listing, result = generation_action(session, tmp_path, str(image_file), PROMPT, "gradcam",
                                                            "a red cat", 20, "")  # fmt: skip
    assert [t["token"].strip() for t in listing["tokens"]] == ["a", "red", "cat"]
    assert words["choices"] == [("0: a", 0), ("1: red", 1), ("2: cat", 2)]
    assert Path(page).read_text().count("data-map=") == 3
    assert strip.dtype == np.uint8 and strip.shape[2] == 3
    np.testing.assert_array_equal(word_action(result, 2, 0.5), result.word_overlay(2, 0.5))
    np.testing.assert_array_equal(word_action(result, None), result.image)
    with pytest.raises(gr.Error, match="type a prompt"):
        generation_action(session, tmp_path, str(image_file), "  ", "gradcam")
    with pytest.raises(gr.Error, match="no image"):
        generation_action(session, tmp_path, None, PROMPT, "gradcam")
    with pytest.raises(InvalidInputError, match="out of range"):
        result.word_overlay(3)


def test_the_page_has_one_tab_taking_a_prompt(session):
    blocks = build_app(session)
    tabs = [b.label for b in blocks.blocks.values() if isinstance(b, gr.Tab)]
    assert tabs == ["Explain"]
    labels = {getattr(b, "label", None) for b in blocks.blocks.values()}
    assert "prompt (what to ask about the image)" in labels
    public = sorted(fn.api_name for fn in blocks.fns.values() if getattr(fn, "api_visibility", "public") == "public")
    assert public == ["explain"]


def test_camkit_app_on_a_saved_folder_builds_the_prompt_page(pair, tmp_path):
    pair[0].save_pretrained(tmp_path)
    pair[1].save_pretrained(tmp_path)
    blocks = camkit.app(model=f"hf:{tmp_path}", device="cpu")
    assert [b.label for b in blocks.blocks.values() if isinstance(b, gr.Tab)] == ["Explain"]
