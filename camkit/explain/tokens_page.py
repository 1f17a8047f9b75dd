"""The HTML view of a generated answer: pointing at a word shows its map over the image.

One self-contained page (:func:`camkit.runs.html.page`: images as ``data:`` URIs, inline style and
script, nothing fetched). The answer's words are buttons; hovering or focusing one shows its
overlay, clicking pins it, and the address ``page.html#t=N`` opens with word ``N`` shown (a link
to one word, or a screenshot of it). The image without a map is shown otherwise.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from ..errors import InvalidInputError
from ..io import to_uint8_rgb
from ..runs.files import encode_image
from ..runs.html import escape, page
from ..viz.overlay import overlay
from ..viz.tokens import shown_word, token_maps

__all__ = ["token_page"]

_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:60em}"
    "h1{font-size:1.3em}.prompt{color:#555}"
    "figure{margin:1em 0}figure img{width:28em;max-width:100%;height:auto;image-rendering:pixelated;border:1px solid #ccc}"
    ".answer{font-size:1.25em;line-height:2.2}"
    ".answer button{font:inherit;border:1px solid #bbb;background:#f7f7f7;border-radius:4px;margin:0 .12em;"
    "padding:.05em .3em;cursor:pointer}"
    ".answer button.on{background:#ffe08a;border-color:#c90}.answer button small{color:#777;font-size:.6em;"
    "margin-left:.3em}figcaption{color:#555}"
)

_SCRIPT = """
const shown = document.getElementById('shown'), caption = document.getElementById('caption');
const words = Array.from(document.querySelectorAll('.answer button'));
let pinned = null;
function show(i) {
  words.forEach((w, j) => w.classList.toggle('on', j === i));
  if (i === null) { shown.src = shown.dataset.plain; caption.textContent = 'the image (point at a word)'; return; }
  shown.src = words[i].dataset.map;
  caption.textContent = 'map of "' + words[i].dataset.word + '" (token ' + i + ')';
}
words.forEach((w, i) => {
  w.addEventListener('mouseenter', () => show(i));
  w.addEventListener('focus', () => show(i));
  w.addEventListener('mouseleave', () => show(pinned));
  w.addEventListener('click', () => { pinned = pinned === i ? null : i; show(pinned); });
});
const m = /^#t=(\\d+)$/.exec(location.hash);
if (m && +m[1] < words.length) { pinned = +m[1]; }
show(pinned);
"""


def _uri(rgb: Any) -> str:
    return "data:image/png;base64," + base64.b64encode(encode_image(rgb, "png")).decode("ascii")


def _fit(rgb: Any, max_side: int) -> Any:
    import cv2

    if isinstance(max_side, bool) or not isinstance(max_side, int) or max_side < 1:
        raise InvalidInputError(f"max_side must be a positive int, got {max_side!r}")
    height, width = rgb.shape[:2]
    if max(height, width) <= max_side:
        return rgb
    scale = max_side / max(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)


def token_page(
    image: Any,
    explained: Any,
    *,
    index: int = 0,
    prompt: str | None = None,
    title: str = "camkit: what in the image made the model say each word",
    alpha: float = 0.5,
    colormap: str = "jet",
    max_side: int = 768,
) -> str:
    """The HTML page of one answer: its words, each showing its map over ``image`` when pointed at.

    Args:
        image: the image explained: uint8 [H, W, 3], a PIL image or a float tensor [3, H, W] in [0, 1].
        explained: maps [T, H, W] with words (give a ``(maps, words)`` pair, optionally with
            scores as a third item), or an object with ``maps``, ``tokens`` and ``scores`` such as
            :class:`camkit.GenerationExplanation` (``index`` picks the prompt).
        index: which prompt of a batched explanation.
        prompt: the prompt, shown above the answer.
        title: the page's title.
        alpha: the map's weight in the overlays.
        colormap: the maps' colour table.
        max_side: the page's pictures are at most this many pixels on their longer side (the image
            shrunk with area averaging, each map resized onto it), so a long answer on a large
            photograph stays a page of a few megabytes.

    Returns:
        The page as text (UTF-8 HTML).

    Example:
        >>> import numpy as np, torch
        >>> from camkit.explain.tokens_page import token_page
        >>> html = token_page(np.zeros((4, 4, 3), np.uint8), (torch.rand(2, 4, 4), ["a", " cat"]), prompt="What?")
        >>> html.count("data-map="), "<button" in html, "http" in html.split("</head>")[1]
        (2, True, False)
    """
    if isinstance(explained, tuple):
        if len(explained) not in (2, 3):
            raise InvalidInputError("give (maps, words) or (maps, words, scores), or an object with maps and tokens")
        maps, words, scores = token_maps(explained[0], explained[1], explained[2] if len(explained) == 3 else None)
    else:
        maps, words, scores = token_maps(explained, index=index)
    rgb = _fit(to_uint8_rgb(image), max_side)
    buttons = []
    for t, word in enumerate(words):
        label = shown_word(word)
        uri = _uri(overlay(rgb, maps[t].numpy(), alpha=alpha, colormap=colormap))
        note = "" if scores is None else f"<small>{scores[t]:.2f}</small>"
        tip = f"token {t}: {json.dumps(word)}" + ("" if scores is None else f", log p {scores[t]:.4f}")
        buttons.append(
            f'<button type="button" data-map="{uri}" data-word="{escape(label)}" title="{escape(tip)}">'
            f"{escape(label)}{note}</button>"
        )
    method = getattr(explained, "method", None)
    said = [f"prompt: {escape(prompt)}"] if prompt else []
    said += [f"method: {escape(str(method))}"] if isinstance(method, str) else []
    asked = f'<p class="prompt">{" &middot; ".join(said)}</p>' if said else ""
    body = (
        f"<h1>{escape(title)}</h1>{asked}"
        f'<p class="answer">{"".join(buttons)}</p>'
        f'<figure><img id="shown" alt="the image, or the map of the word pointed at" src="{_uri(rgb)}" '
        f'data-plain="{_uri(rgb)}"><figcaption id="caption">the image (point at a word)</figcaption></figure>'
        "<p>Point at a word (or focus it with Tab) to see which parts of the image its log-probability "
        "depends on; click to keep it shown. The small numbers are each word's log-probability.</p>"
    )
    return page(title, _STYLE, body, script=_SCRIPT)
