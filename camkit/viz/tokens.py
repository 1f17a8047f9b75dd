"""Pictures of generated text: one overlay per generated word, the word beneath (:func:`token_strip`).

A strip reads any object with ``maps`` and ``tokens`` (a :class:`camkit.GenerationExplanation` is
one: ``maps`` a list of [T, H, W] per prompt, ``tokens`` a list of words per prompt), or a tensor of
maps [T, H, W] with the words beside it. Each map is drawn as it is (values in [0, 1], never
renormalised per word), so the words of one answer share one colour scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import InvalidInputError
from ..io import to_uint8_rgb
from .canvas import ExplanationFigure, matplotlib_parts, render
from .overlay import overlay

__all__ = ["shown_word", "token_maps", "token_strip"]


def shown_word(text: str) -> str:
    """A generated token as a label: outer spaces dropped, a blank one shown as ``␣``, line breaks as ``\\n``.

    Example:
        >>> from camkit.viz.tokens import shown_word
        >>> shown_word(" cat"), shown_word(" "), shown_word("a" + chr(10))
        ('cat', '␣', 'a\\\\n')
    """
    word = text.strip(" ").replace("\n", "\\n").replace("\t", "\\t")
    return word or "␣"


def token_maps(
    explained: Any, words: Sequence[str] | None = None, scores: Any = None, index: int = 0
) -> tuple[Tensor, list[str], list[float] | None]:
    """One answer's maps [T, H, W], words and scores (log-probabilities, or ``None``) from what a strip takes.

    ``explained`` is a tensor of maps [T, H, W] (then ``words`` gives the T words), or an object
    with ``maps`` and ``tokens``: per prompt lists (``index`` picks the prompt) or one answer's
    [T, H, W] and words. ``scores`` (one per word) default to the object's ``scores``.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> from camkit.viz.tokens import token_maps
        >>> result = SimpleNamespace(maps=[torch.zeros(2, 4, 4)], tokens=[["a", "cat"]], scores=[torch.tensor([-1.0, -2.0])])
        >>> maps, words, logp = token_maps(result)
        >>> list(maps.shape), words, logp
        ([2, 4, 4], ['a', 'cat'], [-1.0, -2.0])
    """
    if isinstance(explained, Tensor):
        maps, given = explained, words
    elif hasattr(explained, "maps") and hasattr(explained, "tokens"):
        maps, given = explained.maps, words if words is not None else explained.tokens
        scores = scores if scores is not None else getattr(explained, "scores", None)
        if isinstance(maps, (list, tuple)):
            if not 0 <= index < len(maps):
                raise InvalidInputError(f"index {index} is out of range: the explanation holds {len(maps)} answer(s)")
            maps = maps[index]
            given = given[index] if words is None else given
            scores = scores[index] if isinstance(scores, (list, tuple)) else scores
    else:
        raise InvalidInputError(
            f"a token strip takes maps [T, H, W] with their words, or an object with maps and tokens (such as "
            f"camkit.GenerationExplanation); got {type(explained).__name__}"
        )
    if not isinstance(maps, Tensor) or maps.dim() != 3:
        got = list(maps.shape) if isinstance(maps, Tensor) else type(maps).__name__
        raise InvalidInputError(f"a token strip draws one map per word, [T, H, W]; got {got}")
    if given is None or isinstance(given, str) or len(given) != maps.shape[0]:
        count = "none" if given is None else ("a string" if isinstance(given, str) else len(given))
        raise InvalidInputError(f"give one word per map: {maps.shape[0]} maps, {count} words")
    values = None if scores is None else [float(v) for v in torch.as_tensor(scores).flatten().tolist()]
    if values is not None and len(values) != maps.shape[0]:
        raise InvalidInputError(f"give one score per map: {maps.shape[0]} maps, {len(values)} scores")
    return maps.detach().float().cpu(), [str(w) for w in given], values


def token_strip(
    image: Any,
    explained: Any,
    words: Sequence[str] | None = None,
    *,
    index: int = 0,
    scores: Any = None,
    columns: int = 8,
    alpha: float = 0.5,
    colormap: str = "jet",
    panel: float = 1.6,
    dpi: int = 100,
) -> ExplanationFigure:
    """A strip of overlays, one per generated word with the word beneath (and its log-probability).

    Panels run left to right, ``columns`` to a row. Each is :func:`camkit.overlay` of the word's
    map on the image (the map resized to the image; values as they are, one colour scale for all).

    Args:
        image: the image explained: uint8 [H, W, 3], a PIL image or a float tensor [3, H, W] in [0, 1].
        explained: maps [T, H, W] (then ``words``), or an object with ``maps`` and ``tokens``
            such as :class:`camkit.GenerationExplanation` (``index`` picks the prompt).
        words: the T words, for a tensor of maps (or to relabel an object's).
        index: which prompt of a batched explanation.
        scores: one log-probability per word to print under it (default: the object's ``scores``).
        columns: panels per row.
        alpha: the map's weight in the overlays.
        colormap: the maps' colour table (see :func:`camkit.overlay`).
        panel: a panel's side in inches.
        dpi: pixels per inch.

    Returns:
        An :class:`~camkit.viz.canvas.ExplanationFigure`: its columns ``"token 0"``, ``"token 1"``...,
        panels and titles (the label under each word) keyed ``(row, "token t")``.

    Raises:
        ImportError: matplotlib is not installed.

    Example:
        >>> import numpy as np, torch
        >>> from camkit.viz.tokens import token_strip
        >>> maps = torch.zeros(3, 8, 8); maps[0, :, :4] = 1.0
        >>> fig = token_strip(np.zeros((8, 8, 3), np.uint8), maps, ["a", " red", " cube"], columns=2, dpi=40)
        >>> fig.columns, fig.titles[(1, "token 2")]
        (('token 0', 'token 1', 'token 2'), 'cube')
    """
    maps, labels, values = token_maps(explained, words, scores, index)
    if isinstance(columns, bool) or not isinstance(columns, int) or columns < 1:
        raise InvalidInputError(f"columns must be a positive int, got {columns!r}")
    rgb = to_uint8_rgb(image)
    count = maps.shape[0]
    if count == 0:
        raise InvalidInputError("the answer has no tokens to draw")
    Figure = matplotlib_parts()[0]
    across, rows = min(columns, count), -(-count // columns)
    label_inches = 0.45 if values is not None else 0.3
    fig = Figure(figsize=(across * panel, rows * (panel + label_inches)), dpi=dpi, layout="constrained")
    grid = fig.subplots(rows, across, squeeze=False)
    fontsize = max(6.0, 5.0 * panel)
    axes: dict[tuple[int, str], Any] = {}
    titles: dict[tuple[int, str], str] = {}
    names = tuple(f"token {t}" for t in range(count))
    for t in range(count):
        ax = grid[t // across, t % across]
        ax.imshow(overlay(rgb, maps[t].numpy(), alpha=alpha, colormap=colormap), interpolation="nearest")
        label = shown_word(labels[t])
        caption = label if values is None else f"{label}\nlog p {values[t]:.2f}"
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel(caption, fontsize=fontsize, parse_math=False)
        axes[(t // across, names[t])] = ax
        titles[(t // across, names[t])] = label
    for t in range(count, rows * across):
        grid[t // across, t % across].set_axis_off()
    return render(fig, axes, names, titles)

