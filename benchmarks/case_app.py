"""The explorer's ``explain`` endpoint against the Python API for the same explanation.

Both sides explain the same image file for the same class with Grad-CAM at the automatic layer.

- "Python API": ``camkit.GradCAM(model)(x, target)`` on the preprocessed input ``x`` (prepared
  once, outside the timing), then the overlay at the image's own size (the map taken back through
  the preprocessing's resize and crop, blended with :func:`camkit.overlay`).
- "camkit app explain endpoint": ``gradio_client`` calling ``/explain`` on the app served on
  127.0.0.1 in this process: the upload of the file, reading and preprocessing it, the explanation,
  the overlay, the ``.npy`` and the PNG written, the prediction JSON, and the downloads back to the
  client. The session's cache is cleared before every call, so each call explains afresh.

- "Gradio floor": an endpoint of a second Gradio app in this process that takes the same image file
  and returns a small JSON without reading it: upload, queue, event stream and response, the
  fixed cost of any Gradio call, which no change to camkit's code can remove.

The map in the ``.npy`` is checked to equal the Python API's map exactly (``max diff`` column).
Goal (the explorer's issue): a live explanation takes at most 1.5x the Python API's time.

Default: torchvision's resnet50 (random weights; its own preprocessing: resize 232, crop 224) on
scikit-image's ``chelsea`` photograph (300x451). ``--smoke``: the demo CNN on a 64x64 demo image.
"""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import numpy as np
import torch

import camkit

from ._harness import NOT_MEASURED, Context, Goal, Row, goal_at_most, paired_ratio, rows_for_timings

TITLE = "Explorer app: live explanation"
ORDER = 38
PYTHON = "Python API (GradCAM + overlay)"
APP = "camkit app explain endpoint"
FLOOR = "Gradio floor (an endpoint doing nothing)"
GOAL = 1.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _image(ctx: Context, folder: Path) -> Path:
    if ctx.smoke:
        from camkit.bundled.shapes import render

        rgb = render(3, 0, 2, marked=False).image
    else:
        from skimage import data

        rgb = data.chelsea()
    path = folder / "image.png"
    camkit.save_png(path, rgb)
    return path


def run(ctx: Context) -> list[Row | Goal]:
    if not (ctx.available("gradio") and ctx.available("gradio_client")):
        return [Goal(TITLE, f"live explanation <= {GOAL}x the Python API", "-", NOT_MEASURED,
                     "gradio and gradio_client are not installed (pip install \"camkit[app]\")")]  # fmt: skip
    from gradio_client import Client, handle_file

    from camkit.explorer.app import build_app
    from camkit.explorer.session import Session

    spec = "demo" if ctx.smoke else "torchvision:resnet50"
    session = Session(spec, device=ctx.device)
    model = session.model.eval()
    folder = Path(tempfile.mkdtemp(prefix="camkit-bench-app-"))
    path = _image(ctx, folder)
    rgb = camkit.read_rgb(path)
    x = session.input(rgb)[0]
    with torch.no_grad():
        target = int(model(x).argmax(dim=1)[0])

    def python_api() -> np.ndarray:
        maps = camkit.GradCAM(model)(x, target)
        full, inside = session.preprocess.invert_map(maps[0].cpu(), rgb.shape[0], rgb.shape[1])
        return np.where(inside.numpy()[:, :, None], camkit.overlay(rgb, full), rgb)

    import gradio as gr

    blocks = build_app(session)
    blocks.launch(server_port=_free_port(), prevent_thread_lock=True, quiet=True)
    with gr.Blocks(analytics_enabled=False) as nothing:
        upload, answer = gr.File(type="filepath"), gr.JSON()
        gr.Button().click(lambda f: {"done": True}, [upload], [answer], api_name="nothing")
    nothing.launch(server_port=_free_port(), prevent_thread_lock=True, quiet=True)
    try:
        client = Client(blocks.local_url, verbose=False)
        floor_client = Client(nothing.local_url, verbose=False)

        def endpoint() -> tuple:
            session.clear_cache()
            return client.predict(handle_file(str(path)), "gradcam", "", str(target), api_name="/explain")

        _, npy, prediction = endpoint()
        expected = camkit.GradCAM(model)(x, target)[0].cpu().numpy()
        diff = float(np.abs(np.load(npy) - expected).max())
        def floor() -> dict:
            return floor_client.predict(handle_file(str(path)), api_name="/nothing")

        timings = ctx.time({PYTHON: python_api, APP: endpoint, FLOOR: floor})
    finally:
        blocks.close()
        nothing.close()
    ratio = paired_ratio(timings[APP], timings[PYTHON])
    ctx.log(f"    app / Python API: {ratio}; Gradio floor {timings[FLOOR]}; map max diff {diff:g}; layer {prediction['layer']}")
    model_name = f"{spec} ({prediction['layer']}), {rgb.shape[1]}x{rgb.shape[0]} image"
    notes = {APP: "cache cleared before each call; upload, decode, preprocess, explain, overlay, PNG + .npy + JSON back",
             FLOOR: "same upload, no work: Gradio's fixed cost per call"}  # fmt: skip
    rows = rows_for_timings(TITLE, timings, reference=PYTHON, model=model_name, batch=1, device=ctx.device,
                            camkit=APP, diffs={APP: diff}, notes=notes)  # fmt: skip
    goal = goal_at_most(TITLE, f"live explanation (explain endpoint) <= {GOAL}x the Python API", ratio, GOAL)
    return [*rows, goal]
