"""The "Explain" tab: one image, its top classes as targets, any method and layer, the overlay and downloads.

Its action is also the API endpoint ``explain`` (``gradio_client``): inputs (image file, method
registry key, layer name or ``""`` for the automatic one, target class index or ``""`` for the
predicted class, and optionally the method's settings as JSON); outputs (the overlay image, the
map as ``.npy`` holding exactly the :class:`~camkit.Explanation`'s map at the model input's size,
and the prediction as JSON). The callbacks are plain functions of the session, tested without a browser.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from ..errors import CamkitError, InvalidInputError, InvalidTargetError
from ..io import save_png
from .detect import explain_detections, is_detector
from .inputs import IMAGE_BUTTONS, image_hash, method_settings, read_image
from .media import MediaResult, explain_media, media_kind, media_peak, media_positions, media_view
from .session import LiveResult, Session

__all__ = [
    "build_explain_tab",
    "detection_select",
    "detections_update",
    "explain_action",
    "layer_choices",
    "media_positions_update",
    "parse_settings",
    "parse_target",
    "rerender",
    "upload_action",
]

AUTOMATIC = ""  # the layer value that means "the method's automatic choice"
# Events of the page only, not API endpoints (Gradio 6 names it api_visibility; Gradio 5 api_name=False).
PRIVATE: dict[str, Any] = (
    {"api_visibility": "private"} if int(gr.__version__.split(".")[0]) >= 6 else {"api_name": False}
)


def shown_error(err: BaseException) -> gr.Error:
    """A message for the page (the app keeps running): camkit's own text, other errors with their type."""
    text = str(err).strip().strip("'\"")
    if isinstance(err, CamkitError):
        return gr.Error(text or type(err).__name__)
    return gr.Error(f"{type(err).__name__}: {text}" if text else type(err).__name__)


def parse_target(text: Any) -> int | None:
    """``""``/``None`` -> ``None`` (the predicted class); ``"3"`` or ``3`` -> ``3``; anything else a clear error.

    Example:
        >>> from camkit.explorer.explain_tab import parse_target
        >>> parse_target(""), parse_target(" 2 "), parse_target(1.0)
        (None, 2, 1)
    """
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if isinstance(text, bool):
        raise InvalidTargetError(f"the target must be a class index or empty (the predicted class); got {text!r}")
    if isinstance(text, (int, float)) and float(text).is_integer():
        return int(text)
    if isinstance(text, str) and text.strip().lstrip("-").isdigit():
        return int(text.strip())
    raise InvalidTargetError(f"the target must be a class index or empty (the predicted class); got {text!r}")


def parse_settings(text: Any) -> dict[str, Any]:
    """The settings box: ``""`` or a JSON object of the method's settings.

    Example:
        >>> from camkit.explorer.explain_tab import parse_settings
        >>> parse_settings(""), parse_settings('{"steps": 8}')
        ({}, {'steps': 8})
    """
    if text is None or (isinstance(text, str) and not text.strip()):
        return {}
    if isinstance(text, dict):
        return dict(text)
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as err:
        raise InvalidInputError(f"settings must be a JSON object such as {{\"steps\": 8}}; got {text!r} ({err})") from None
    if not isinstance(value, dict):
        raise InvalidInputError(f"settings must be a JSON object such as {{\"steps\": 8}}; got {text!r}")
    return value


def _path(file: Any) -> str:
    if file is None or file == "":
        raise InvalidInputError("no image: upload an image file first")
    if isinstance(file, dict):  # a FileData payload
        file = file.get("path")
    return str(getattr(file, "name", file))


def layer_choices(session: Session, image: Any, method: str) -> tuple[list[tuple[str, str]], str]:
    """The layer dropdown: ``[(label, value)...]`` with the automatic choice first, and its value ``""``."""
    if is_detector(session) or (isinstance(image, (str, Path)) and media_kind(image) is not None):
        image = None  # detectors, volumes, videos, signals: no preview pass
    auto = session.auto_layer(image, method) if image is not None else None
    if auto is None and image is not None:
        return [("none: this method works on the input pixels", AUTOMATIC)], AUTOMATIC
    label = f"automatic ({auto})" if auto else "automatic"
    return [(label, AUTOMATIC)] + [(name, name) for name in session.layers()], AUTOMATIC


def upload_action(session: Session, file: Any, method: str) -> tuple[Any, Any, Any, str]:
    """On upload: the image, the top classes (clickable targets), the layer list, the target box reset."""
    if file is None:
        return None, gr.update(choices=[], value=None), gr.update(), ""
    try:
        path = _path(file)
        if media_kind(path) is not None or is_detector(session):  # classes (detections) come with the explanation
            choices, value = layer_choices(session, None, method)
            picture = None if media_kind(path) is not None else read_image(path)
            return picture, gr.update(choices=[], value=None), gr.update(choices=choices, value=value), ""
        top = session.topk(path, k=5)
        choices, value = layer_choices(session, path, method)
        rgb = read_image(path)
    except Exception as err:
        raise shown_error(err) from err
    classes = [(f"{t['name']} ({t['score']:.1%})", str(t["index"])) for t in top]
    return rgb, gr.update(choices=classes, value=None), gr.update(choices=choices, value=value), ""


def method_action(session: Session, file: Any, method: str) -> tuple[str, Any]:
    """On a method change: its settings with their defaults, and the layer list (automatic choice preselected)."""
    try:
        settings = method_settings(method)
        choices, value = layer_choices(session, _path(file) if file else None, method)
    except Exception as err:
        raise shown_error(err) from err
    return json.dumps(settings), gr.update(choices=choices, value=value)


def _file_for(folder: Path, result: LiveResult | MediaResult, suffix: str, extra: str = "") -> Path:
    """A path named after what it holds: the image, method, layer, target and settings (and ``extra``)."""
    p = result.prediction
    source = image_hash(result.image) if isinstance(result, LiveResult) else hashlib.sha256(result.map.tobytes()).hexdigest()
    key = json.dumps([source, p["method"], p["layer"], p["target"], p["settings"], extra],
                     sort_keys=True, default=repr)  # fmt: skip
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    where = folder / digest
    where.mkdir(parents=True, exist_ok=True)
    return where / f"{p['method'].replace('+', 'p')}-class{p['target']}{suffix}"


def explain_action(
    session: Session, out: Path, file: Any, method: str, layer: Any, target: Any, settings: Any = ""
) -> tuple[str, str, dict[str, Any], LiveResult | MediaResult | list[dict[str, Any]]]:
    """The ``explain`` endpoint: ``(path of the overlay .png, path of the map .npy, prediction, result)``.

    A volume, video or signal file (:func:`camkit.explorer.media.media_kind`) is explained through
    :func:`camkit.explorer.media.explain_media`: its map ([D, H, W], [T, h, w] or [T]) goes to the
    ``.npy`` and the overlay is :func:`camkit.explorer.media.media_view`'s default picture.

    The overlay is written here as a fast PNG (OpenCV's light compression) rather than handed to
    Gradio as an array, which would encode it at PIL's default level, several times slower; the
    same file is the overlay's download while the opacity and view are left as they are.
    """
    try:
        path = _path(file)
        if is_detector(session) and media_kind(path) is None:
            return _detections(session, out, path, method, layer, parse_settings(settings))
        explain = explain_media if media_kind(path) is not None else Session.explain
        result = explain(
            session, path, method, layer=str(layer) if layer else None, target=parse_target(target),
            **parse_settings(settings),
        )  # fmt: skip
        npy = _file_for(out / "maps", result, ".npy")
        if not npy.is_file():  # the same explanation always has the same file
            np.save(npy, result.map)
        png = save_overlay(out, result, result.overlay if isinstance(result, LiveResult) else media_view(result))
    except Exception as err:
        raise shown_error(err) from err
    return str(png), str(npy), result.prediction, result


def _detections(
    session: Session, out: Path, path: str, method: str, layer: Any, settings: dict[str, Any]
) -> tuple[str, str, dict[str, Any], list[dict[str, Any]]]:
    """A detector's explanation: the best detection shown first, every detection in the result (the
    gallery). The settings may hold ``score_threshold`` (default 0.5) and ``top`` (default 10)."""
    threshold, top = settings.pop("score_threshold", 0.5), settings.pop("top", 10)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise InvalidInputError(f"score_threshold must be a number, got {threshold!r}")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise InvalidInputError(f"top must be a positive int or null, got {top!r}")
    found = explain_detections(session, out, path, method, str(layer) if layer else None,
                               score_threshold=float(threshold), top=top, **settings)  # fmt: skip
    listed = [{k: r[k] for k in ("label", "label_name", "box", "score")} for r in found]
    prediction = {"detections": listed, "shown": 0, "method": method, "layer": str(layer) if layer else None}
    return found[0]["overlay"], found[0]["map"], prediction, found


def detections_update(result: Any) -> Any:
    """The detection gallery after an explanation: one picture per detection (hidden for other models)."""
    if not isinstance(result, list):
        return gr.update(value=None, visible=False)
    return gr.update(value=[(r["overlay"], f"{j}: {r['label_name']} {r['score']:.2f}") for j, r in enumerate(result)],
                     visible=True)  # fmt: skip


def detection_select(result: Any, evt: gr.SelectData) -> tuple[Any, Any]:
    """A click on a detection in the gallery: its overlay in the main picture and its map to download."""
    if not isinstance(result, list) or not 0 <= int(evt.index) < len(result):
        return gr.update(), gr.update()
    chosen = result[int(evt.index)]
    return chosen["overlay"], chosen["map"]


def rerender(
    session: Session, result: LiveResult | MediaResult | None, alpha: float, view: str, axis: Any = 0, index: Any = None
) -> np.ndarray | None:
    """The overlay again at another opacity, or the signed view of a pixel attribution; for a volume
    or video, slice (or frame) ``index`` along ``axis`` (``None``: the one with the most map)."""
    if result is None or isinstance(result, list):  # detections are drawn once, with their boxes
        return None
    try:
        if isinstance(result, MediaResult):
            return media_view(result, int(axis or 0), None if index is None else int(index), float(alpha))
        return session.render(result, float(alpha), "signed" if view == "signed" else "map")
    except Exception as err:
        raise shown_error(err) from err


def media_positions_update(result: LiveResult | MediaResult | None, axis: Any) -> tuple[Any, Any]:
    """After an explanation or an axis change: the slice/frame slider (volumes and videos only, at
    the position the picture shows) and, for a volume, video or signal, its top classes as targets."""
    if not isinstance(result, MediaResult):
        return gr.update(visible=False, value=0), gr.update()
    top = [(f"{t['name']} ({t['score']:.1%})", str(t["index"])) for t in result.prediction["top"]]
    classes = gr.update(choices=top, value=str(result.prediction["target"]))
    if result.kind == "signal":
        return gr.update(visible=False, value=0), classes
    along = int(axis or 0) if result.kind == "volume" else 0
    count = media_positions(result, along)
    label = f"{'slice' if result.kind == 'volume' else 'frame'} (0 to {count - 1})"
    return gr.update(visible=True, minimum=0, maximum=max(count - 1, 0), step=1, value=media_peak(result, along),
                     label=label), classes  # fmt: skip


def save_overlay(out: Path, result: Any, picture: np.ndarray | str | None) -> str | None:
    """The overlay as it is shown, written as a PNG for download."""
    if result is None or picture is None:
        return None
    if isinstance(picture, (str, Path)):  # already a file of ours
        return str(picture)
    drawn = np.asarray(picture, dtype=np.uint8)
    if isinstance(result, list):  # a detection's overlay, as shown
        path = out / "overlays" / f"detection-{hashlib.sha256(drawn.tobytes()).hexdigest()[:16]}.png"
        if not path.is_file():
            save_png(path, drawn)
        return str(path)
    path = _file_for(out / "overlays", result, ".png", hashlib.sha256(drawn.tobytes()).hexdigest()[:12])
    if not path.is_file():  # named after its pixels: an existing file already holds them
        save_png(path, drawn)
    return str(path)


PICTURE_CSS = (
    ".camkit-picture img { width: 100%; height: 100%; object-fit: contain; image-rendering: pixelated; }\n"
    ".camkit-cells img { image-rendering: pixelated; }"
)


def build_explain_tab(session: Session, out: Path) -> gr.File:
    """The tab's components and events; call inside ``with gr.Tab("Explain"):``. Returns the upload
    component (the Compare tab follows it)."""
    methods = session.methods()
    with gr.Row():
        with gr.Column(scale=1):
            file = gr.File(label="image file", file_count="single", type="filepath")
            picture = gr.Image(label="image", interactive=False, format="png", height=240, buttons=list(IMAGE_BUTTONS),
                               elem_classes=["camkit-picture"])  # fmt: skip
            classes = gr.Radio(label="top classes (click one to explain it)", choices=[])
            target = gr.Textbox(label="target class index (empty: the predicted class)", value="")
            method = gr.Dropdown(label="method", choices=methods, value="gradcam" if "gradcam" in methods else methods[0])
            settings = gr.Textbox(label="settings (JSON; empty: the method's defaults)", value="", lines=2)
            layer = gr.Dropdown(
                label="layer", choices=[("automatic", AUTOMATIC)] + [(n, n) for n in session.layers()],
                value=AUTOMATIC, allow_custom_value=True,
            )  # fmt: skip
            go = gr.Button("Explain", variant="primary")
        with gr.Column(scale=2):
            shown = gr.Image(label="overlay", interactive=False, format="png", height=420, buttons=list(IMAGE_BUTTONS),
                             elem_classes=["camkit-picture"])  # fmt: skip
            alpha = gr.Slider(0.0, 1.0, value=0.5, step=0.05, label="opacity of the map")
            view = gr.Radio(["map", "signed"], value="map", label="view (signed: pixel attributions' signs)")
            axis = gr.Radio([("0", 0), ("1", 1), ("2", 2)], value=0, label="volume axis (slices across it)")
            position = gr.Slider(0, 1, value=0, step=1, label="slice or frame", visible=False)
            boxes = gr.Gallery(label="detections (click one to show it)", visible=False, columns=4, height=200,
                               buttons=list(IMAGE_BUTTONS))
            npy = gr.File(label="map (.npy, float32 at the model input's size)")
            png = gr.File(label="overlay (.png, as shown)")
            prediction = gr.JSON(label="prediction")
    state = gr.State(None)

    explain: dict[str, Any] = dict(
        fn=lambda f, m, la, t, s: explain_action(session, out, f, m, la, t, s),
        inputs=[file, method, layer, target, settings], outputs=[shown, npy, prediction, state],
    )  # fmt: skip
    reset: dict[str, Any] = dict(fn=lambda: (0.5, "map"), inputs=None, outputs=[alpha, view], **PRIVATE)
    keep: dict[str, Any] = dict(fn=lambda r, p: save_overlay(out, r, p), inputs=[state, shown], outputs=[png], **PRIVATE)
    redraw: dict[str, Any] = dict(fn=lambda r, a, v, ax, i: gr.update() if isinstance(r, list) else save_overlay(
                                      out, r, rerender(session, r, a, v, ax, i)),
                                  inputs=[state, alpha, view, axis, position], outputs=[shown])  # fmt: skip
    slider: dict[str, Any] = dict(fn=media_positions_update, inputs=[state, axis], outputs=[position, classes],
                                  **PRIVATE)  # fmt: skip

    file.change(lambda f, m: upload_action(session, f, m), [file, method], [picture, classes, layer, target],
                **PRIVATE)  # fmt: skip
    method.change(lambda f, m: method_action(session, f, m), [file, method], [settings, layer], **PRIVATE)
    listing: dict[str, Any] = dict(fn=detections_update, inputs=[state], outputs=[boxes], **PRIVATE)
    go.click(**explain, api_name="explain").then(**reset).then(**keep).then(**slider).then(**listing)
    # a click on a top class explains that class at once
    classes.input(lambda c: c or "", [classes], [target], **PRIVATE).then(
        **explain, **PRIVATE
    ).then(**reset).then(**keep).then(**slider).then(**listing)
    boxes.select(detection_select, [state], [shown, npy], **PRIVATE).then(**keep)
    alpha.release(**redraw, **PRIVATE).then(**keep)
    axis.input(**slider).then(**redraw, **PRIVATE).then(**keep)
    position.release(**redraw, **PRIVATE).then(**keep)
    view.input(**redraw, **PRIVATE).then(**keep)
    return file
