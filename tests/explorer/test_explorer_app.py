"""The explorer page: its tabs, the Explain and Compare callbacks in plain Python, and the ``explain`` API
through ``gradio_client`` against the app served on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.request

import numpy as np
import pytest
import torch

import camkit
from camkit.bundled.shapes import CLASSES, render

gr = pytest.importorskip("gradio")

from camkit.explorer import Session  # noqa: E402
from camkit.explorer.app import TAB_LABELS, build_app  # noqa: E402
from camkit.explorer.compare_tab import SCALE_NOTE, compare_grid, grid_columns  # noqa: E402
from camkit.explorer.explain_tab import (  # noqa: E402
    explain_action,
    method_action,
    rerender,
    save_overlay,
    upload_action,
)


@pytest.fixture(scope="module")
def session():
    return Session("demo", device="cpu")


@pytest.fixture(scope="module")
def blocks(session):
    return build_app(session)


@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("images") / "triangle.png"
    camkit.save_png(path, render(3, 0, 2, marked=False).image)
    return str(path)


def _x(session, path):
    return session.preprocess(camkit.read_rgb(path))[0][None]


def test_the_tabs_and_the_public_endpoints(blocks):
    tabs = [b.label for b in blocks.blocks.values() if isinstance(b, gr.Tab)]
    assert tabs == list(TAB_LABELS) == ["Explain", "Compare", "Audit", "Evaluate"]
    public = sorted(
        fn.api_name for fn in blocks.fns.values() if getattr(fn, "api_visibility", "public") == "public"
    )
    assert public == ["compare", "explain"]
    assert blocks.analytics_enabled is False
    assert os.environ["GRADIO_ANALYTICS_ENABLED"] == "False"
    assert os.environ["GRADIO_TEMP_DIR"] == str(blocks.temp_dir) and blocks.temp_dir.is_dir()


def test_upload_lists_the_top_classes_and_preselects_the_automatic_layer(session, image_file):
    picture, classes, layer, target = upload_action(session, image_file, "gradcam")
    assert np.array_equal(picture, camkit.read_rgb(image_file))
    top = session.topk(image_file, k=5)
    assert [value for _, value in classes["choices"]] == [str(t["index"]) for t in top]
    assert classes["choices"][0][0] == f"{top[0]['name']} ({top[0]['score']:.1%})"
    assert layer["value"] == "" and layer["choices"][0] == ("automatic (last_conv)", "")
    assert ("features.3", "features.3") in layer["choices"] and target == ""
    settings, layer = method_action(session, image_file, "integratedgradients")
    assert json.loads(settings)["steps"] == 50
    assert layer["choices"] == [("none: this method works on the input pixels", "")]


def test_the_explain_action_writes_the_exact_map_and_redraws(session, image_file, tmp_path):
    overlay, npy, prediction, result = explain_action(session, tmp_path, image_file, "gradcam", "", "1")
    x = _x(session, image_file)
    assert np.array_equal(np.load(npy), camkit.GradCAM(session.model)(x, 1)[0].numpy())
    assert np.load(npy).dtype == np.float32 and npy.startswith(str(tmp_path))
    assert prediction["target"] == 1 and prediction["target_name"] == CLASSES[1]
    assert prediction["layer"] == "last_conv" and prediction["method"] == "gradcam"
    assert overlay.startswith(str(tmp_path)) and np.array_equal(camkit.read_rgb(overlay), result.overlay)
    assert save_overlay(tmp_path, result, result.overlay) == overlay  # the overlay's download is that file
    assert explain_action(session, tmp_path, image_file, "gradcam", "", "1")[1] == npy  # one file per explanation
    assert explain_action(session, tmp_path, image_file, "gradcam", "", "2")[1] != npy
    redrawn = rerender(session, result, 0.25, "map")
    full, _ = session.preprocess.invert_map(torch.from_numpy(result.map), 64, 64)
    assert np.array_equal(redrawn, camkit.overlay(result.image, full, alpha=0.25))
    png = save_overlay(tmp_path, result, redrawn)
    assert png.startswith(str(tmp_path)) and np.array_equal(camkit.read_rgb(png), redrawn)
    _, npy2, prediction2, _ = explain_action(session, tmp_path, image_file, "saliency", "", "")
    assert prediction2["target"] == int(session.model(x).argmax()) and prediction2["layer"] is None
    assert np.array_equal(np.load(npy2), camkit.Saliency(session.model)(x, prediction2["target"])[0].numpy())


@pytest.mark.parametrize(
    "file, method, layer, target, settings, words",
    [
        (None, "gradcam", "", "", "", "upload an image file first"),
        ("bad", "gradcam", "", "", "", "could not be decoded"),
        ("ok", "nomethod", "", "", "", "nomethod"),
        ("ok", "gradcam", "layer9", "", "", "layer9"),
        ("ok", "gradcam", "", "12", "", "out of range: the model has 4 classes"),
        ("ok", "gradcam", "", "cat", "", "class index or empty"),
        ("ok", "gradcam", "", "", "{steps: 3", "JSON object"),
        ("ok", "cheferrollout", "", "", "", "attention methods explain vision transformers"),
    ],
)
def test_bad_input_becomes_a_message_in_the_page(session, image_file, tmp_path, file, method, layer, target,
                                                 settings, words):  # fmt: skip
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG but not really")
    path = {"ok": image_file, "bad": str(bad), None: None}[file]
    with pytest.raises(gr.Error, match=re.escape(words)):
        explain_action(session, tmp_path, path, method, layer, target, settings)
    with pytest.raises(gr.Error, match="could not be decoded"):
        upload_action(session, str(bad), "gradcam")


def test_the_compare_grid_is_methods_by_layers_on_one_scale(session, image_file):
    cells = compare_grid(session, image_file, ["gradcam", "saliency"], ["", "features.3"], target="0")
    assert [caption for _, caption in cells] == [
        "gradcam, automatic (last_conv)", "gradcam, features.3", "saliency, input pixels"
    ]  # fmt: skip
    assert np.array_equal(cells[1][0], session.explain(image_file, "gradcam", layer="features.3", target=0).overlay)
    assert "one colour scale" in SCALE_NOTE.lower() and "[0, 1]" in SCALE_NOTE
    assert (grid_columns(2, 2), grid_columns(3, 1), grid_columns(6, 1), grid_columns(1, 3)) == (2, 3, 4, 3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_explain_endpoint_through_gradio_client(session, blocks, image_file):
    client_module = pytest.importorskip("gradio_client")
    port = _free_port()
    blocks.launch(server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        assert blocks.server_name == "127.0.0.1" and blocks.share is False
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read().decode()
        theme = urllib.request.urlopen(f"http://127.0.0.1:{port}/theme.css", timeout=30).read().decode()
        for text in (page, theme):
            assert "fonts.googleapis" not in text and "fonts.gstatic" not in text
        client = client_module.Client(f"http://127.0.0.1:{port}/", verbose=False)
        overlay, npy, prediction = client.predict(
            client_module.handle_file(image_file), "gradcam", "", "2", api_name="/explain"
        )
        x = _x(session, image_file)
        assert np.array_equal(np.load(npy), camkit.GradCAM(session.model)(x, 2)[0].numpy())
        assert prediction["target"] == 2 and prediction["layer"] == "last_conv"
        assert [t["name"] for t in prediction["top"]] == [CLASSES[t["index"]] for t in prediction["top"]]
        result = session.explain(image_file, "gradcam", target=2)
        assert np.array_equal(camkit.read_rgb(overlay), result.overlay)
        _, npy, prediction = client.predict(
            client_module.handle_file(image_file), "integratedgradients", "", "", '{"steps": 4}', api_name="/explain"
        )
        expected = camkit.IntegratedGradients(session.model, steps=4)(x, prediction["target"])[0].numpy()
        assert np.array_equal(np.load(npy), expected)
        with pytest.raises(Exception, match="out of range"):
            client.predict(client_module.handle_file(image_file), "gradcam", "", "9", api_name="/explain")
        written = [p for p in blocks.temp_dir.rglob("*") if p.is_file()]
        assert any(p.suffix == ".npy" for p in written)
    finally:
        blocks.close()


def test_the_audit_and_evaluate_tabs_get_the_session_and_their_folders(session, monkeypatch, tmp_path):
    import camkit.explorer.app as app_module

    seen = {}
    for builder in ("build_audit_tab", "build_evaluate_tab"):

        def build(s, folders, name=builder):
            seen[name] = (s, folders)
            gr.Markdown(name)

        monkeypatch.setattr(app_module, builder, build)
    build_app(session, audits=[str(tmp_path / "a")], evaluations=[tmp_path / "e"])
    assert seen["build_audit_tab"][0] is session and seen["build_audit_tab"][1] == [tmp_path / "a"]
    assert seen["build_evaluate_tab"] == (session, [tmp_path / "e"])


def test_two_models_share_one_grid_with_the_same_methods(session, image_file):
    from camkit.explorer.compare_tab import compare_models_grid

    torch.manual_seed(1)
    other_net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                    torch.nn.Flatten(), torch.nn.Linear(4, len(CLASSES)))  # fmt: skip
    other = Session(other_net, device="cpu")
    cells = compare_models_grid([session, other], image_file, ["gradcam", "saliency"], target="2")
    assert [caption.split(":")[1].split(",")[0].strip() for _, caption in cells] == ["gradcam"] * 2 + ["saliency"] * 2
    expected = [session.explain(image_file, "gradcam", target=2), other.explain(image_file, "gradcam", target=2),
                session.explain(image_file, "saliency", target=2), other.explain(image_file, "saliency", target=2)]
    assert all(np.array_equal(picture, r.overlay) for (picture, _), r in zip(cells, expected, strict=True))
    assert not np.array_equal(cells[0][0], cells[1][0])  # two models, two maps
    assert cells[1][1].endswith("gradcam, automatic (1)") and cells[3][1].endswith("saliency, input pixels")
    blocks = build_app(session, compare_with=[other])
    assert "compare" in {d.api_name for d in blocks.fns.values()}
