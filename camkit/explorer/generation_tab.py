"""The "Explain" tab for a vision-language model: an image and a prompt; the answer's words, each with its map.

Its action is also the API endpoint ``explain`` (``gradio_client``): inputs (image file, prompt,
method key, answer or ``""`` to generate one, the longest answer, the method's settings as JSON);
outputs (the strip of overlays, the words to pick from, the HTML page as a file, the tokens and
their log-probabilities as JSON). The callbacks are plain functions of the session, tested
without a browser.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from .explain_tab import PRIVATE, _path, parse_settings, shown_error
from .generation import GenerationResult, GenerationSession
from .inputs import IMAGE_BUTTONS, read_image

__all__ = ["build_generation_tab", "generation_action", "word_action"]


def generation_action(
    session: GenerationSession, out: Path, file: Any, prompt: Any, method: str, answer: Any = "",
    max_new_tokens: Any = 20, settings: Any = "",
) -> tuple[np.ndarray, Any, str, dict[str, Any], GenerationResult]:  # fmt: skip
    """The ``explain`` endpoint: ``(strip, word choices, path of the HTML page, tokens, result)``."""
    try:
        path = _path(file)
        result = session.explain(
            path, str(prompt or ""), method, answer=str(answer or "") or None, max_new_tokens=int(max_new_tokens or 20),
            **parse_settings(settings),
        )  # fmt: skip
        digest = hashlib.sha256(result.page.encode("utf-8")).hexdigest()[:16]
        page = out / "pages" / f"answer-{digest}.html"
        if not page.is_file():
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(result.page, encoding="utf-8")
    except Exception as err:
        raise shown_error(err) from err
    words = [(label, t) for t, label in enumerate(result.words())]
    listing = {"prompt": result.prompt, "answer": result.answer, "method": result.method, "tokens": result.tokens}
    return result.strip, gr.update(choices=words, value=None), str(page), listing, result


def word_action(result: GenerationResult | None, index: Any, alpha: float = 0.5) -> np.ndarray | None:
    """A word picked: its map over the image (the image itself before any pick)."""
    if result is None:
        return None
    if index is None or index == "":
        return result.image
    try:
        return result.word_overlay(int(index), float(alpha))
    except Exception as err:
        raise shown_error(err) from err


def build_generation_tab(session: GenerationSession, out: Path) -> gr.File:
    """The tab's components and events; call inside ``with gr.Tab("Explain"):``. Returns the upload component."""
    methods = session.methods()
    with gr.Row():
        with gr.Column(scale=1):
            file = gr.File(label="image file", file_count="single", type="filepath")
            picture = gr.Image(label="image", interactive=False, format="png", height=240, buttons=list(IMAGE_BUTTONS))
            prompt = gr.Textbox(label="prompt (what to ask about the image)", value="Describe the image.", lines=2)
            answer = gr.Textbox(label="answer to explain (empty: the model's own, generated greedily)", value="")
            method = gr.Dropdown(label="method", choices=methods, value="gradcam" if "gradcam" in methods else methods[0])
            longest = gr.Number(label="longest answer (tokens)", value=20, precision=0, minimum=1)
            settings = gr.Textbox(label="settings (JSON; empty: the method's defaults)", value="", lines=2)
            go = gr.Button("Explain", variant="primary")
        with gr.Column(scale=2):
            strip = gr.Image(label="one map per generated word", interactive=False, format="png",
                             buttons=list(IMAGE_BUTTONS))  # fmt: skip
            words = gr.Radio(label="the answer's words (pick one to see its map)", choices=[])
            shown = gr.Image(label="the word's map", interactive=False, format="png", height=360,
                             buttons=list(IMAGE_BUTTONS), elem_classes=["camkit-picture"])  # fmt: skip
            alpha = gr.Slider(0.0, 1.0, value=0.5, step=0.05, label="opacity of the map")
            page = gr.File(label="the answer as an HTML page (point at a word to see its map)")
            tokens = gr.JSON(label="tokens and log-probabilities")
    state = gr.State(None)
    file.change(lambda f: read_image(_path(f)) if f else None, [file], [picture], **PRIVATE)
    go.click(
        lambda f, p, m, a, n, s: generation_action(session, out, f, p, m, a, n, s),
        [file, prompt, method, answer, longest, settings], [strip, words, page, tokens, state], api_name="explain",
    ).then(lambda r: word_action(r, None), [state], [shown], **PRIVATE)  # fmt: skip
    words.input(word_action, [state, words, alpha], [shown], **PRIVATE)
    alpha.release(word_action, [state, words, alpha], [shown], **PRIVATE)
    return file
