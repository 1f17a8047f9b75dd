"""The "Compare" tab: methods x layers on one image, in one grid, on one colour scale.

Every cell is the method's map as :class:`~camkit.Explanation` gives it (min-max normalised to [0, 1]
per map, at the model input's size) drawn with one colormap over the same [0, 1] range, so a colour
means the same fraction of a map's range in every cell. Raw values are not compared across cells:
methods measure different things in different units.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gradio as gr
import numpy as np

from ..registry import takes_layer
from .explain_tab import AUTOMATIC, PRIVATE, _path, parse_target, shown_error
from .inputs import IMAGE_BUTTONS
from .session import Session

__all__ = ["SCALE_NOTE", "build_compare_tab", "compare_grid", "compare_models_grid", "grid_columns"]

SCALE_NOTE = (
    "One colour scale for every cell: each map is camkit's map of that method and layer, min-max normalised "
    "to [0, 1] (the same normalisation for all cells), coloured with jet from 0 (blue) to 1 (red) at opacity 0.5. "
    "Colours compare where each map puts its weight, not raw values across methods."
)


def compare_grid(
    session: Session, image: Any, methods: list[str], layers: list[str], target: Any = ""
) -> list[tuple[np.ndarray, str]]:
    """The grid's cells, row by row (methods) and column by column (layers): ``[(overlay, caption)...]``.

    Methods without a layer (pixel attributions) take one cell per row, captioned "input pixels".

    Example:
        >>> import numpy as np
        >>> from camkit.explorer import Session
        >>> from camkit.explorer.compare_tab import compare_grid
        >>> cells = compare_grid(Session("demo", device="cpu"), np.zeros((64, 64, 3), np.uint8),
        ...                      ["gradcam", "saliency"], ["", "features.3"], target="1")
        >>> [caption for _, caption in cells]
        ['gradcam, automatic (last_conv)', 'gradcam, features.3', 'saliency, input pixels']
    """
    if not methods:
        raise gr.Error("choose at least one method")
    chosen = parse_target(target)
    cells: list[tuple[np.ndarray, str]] = []
    for method in methods:
        if not takes_layer(method):
            result = session.explain(image, method, target=chosen)
            cells.append((result.overlay, f"{method}, input pixels"))
            continue
        for layer in layers or [AUTOMATIC]:
            result = session.explain(image, method, layer=layer or None, target=chosen)
            where = layer or f"automatic ({result.prediction['layer']})"
            cells.append((result.overlay, f"{method}, {where}"))
    return cells


def compare_models_grid(
    sessions: Sequence[Session], image: Any, methods: list[str], target: Any = ""
) -> list[tuple[np.ndarray, str]]:
    """Two (or more) models side by side: one row per method, one column per model, each at its
    automatic layer, on the one colour scale of :data:`SCALE_NOTE`: ``[(overlay, caption)...]``.

    Every model explains the same image for the same target (empty: each model's own predicted class).

    Example:
        >>> import numpy as np
        >>> from camkit.explorer import Session
        >>> from camkit.explorer.compare_tab import compare_models_grid
        >>> demo = Session("demo", device="cpu")
        >>> cells = compare_models_grid([demo, demo], np.zeros((64, 64, 3), np.uint8), ["gradcam"], target="1")
        >>> [caption for _, caption in cells]
        ['demo: gradcam, automatic (last_conv)', 'demo: gradcam, automatic (last_conv)']
    """
    if not methods:
        raise gr.Error("choose at least one method")
    chosen = parse_target(target)
    cells: list[tuple[np.ndarray, str]] = []
    for method in methods:
        for session in sessions:
            result = session.explain(image, method, target=chosen)
            where = "input pixels" if result.prediction["layer"] is None else f"automatic ({result.prediction['layer']})"
            cells.append((result.overlay, f"{session.loaded.spec}: {method}, {where}"))
    return cells


def grid_columns(methods: int, layers: int) -> int:
    """One column per layer (a row per method); with one layer, the methods side by side in one row."""
    return max(1, layers) if layers > 1 else max(1, min(methods, 4))


def build_compare_tab(session: Session, follow: gr.File | None = None, others: Sequence[Session] = ()) -> None:
    """The tab's components and events; call inside ``with gr.Tab("Compare"):``. With ``follow`` (the
    Explain tab's upload), an image uploaded there is compared here too. With ``others`` (more
    models), the grid is methods x models (:func:`compare_models_grid`) and the layer list is left out."""
    methods = session.methods()
    with gr.Row():
        with gr.Column(scale=1):
            file = gr.File(label="image file", file_count="single", type="filepath")
            chosen = gr.Dropdown(
                label="methods (rows)", choices=methods, multiselect=True,
                value=[m for m in ("gradcam", "gradcam++", "scorecam") if m in methods],
            )  # fmt: skip
            layers = gr.Dropdown(
                label="layers (columns; empty: the automatic one)", multiselect=True, visible=not others,
                choices=[("automatic", AUTOMATIC)] + [(n, n) for n in session.layers()], value=[AUTOMATIC],
            )  # fmt: skip
            target = gr.Textbox(label="target class index (empty: the predicted class)", value="")
            go = gr.Button("Compare", variant="primary")
        with gr.Column(scale=3):
            grid = gr.Gallery(label="methods x layers", columns=3, object_fit="contain", height=560, preview=False,
                              buttons=list(IMAGE_BUTTONS), elem_classes=["camkit-cells"])  # fmt: skip
            gr.Markdown(SCALE_NOTE)

    def run(file_: Any, methods_: list[str], layers_: list[str], target_: Any) -> Any:
        try:
            if others:
                cells = compare_models_grid([session, *others], _path(file_), list(methods_ or []), target_)
                return gr.update(value=cells, columns=1 + len(others))
            cells = compare_grid(session, _path(file_), list(methods_ or []), list(layers_ or []), target_)
        except gr.Error:
            raise
        except Exception as err:
            raise shown_error(err) from err
        return gr.update(value=cells, columns=grid_columns(len(methods_ or []), len(layers_ or [AUTOMATIC])))

    go.click(run, [file, chosen, layers, target], [grid], api_name="compare")
    if follow is not None:
        follow.change(lambda f: f, [follow], [file], **PRIVATE)
