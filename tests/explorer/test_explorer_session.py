"""The explorer's session in plain Python: exact maps, the cache, predictions and clear errors on bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import camkit
from camkit.bundled.shapes import CLASSES, render
from camkit.errors import (
    CamkitError,
    InvalidInputError,
    InvalidTargetError,
    LayerNotFoundError,
    UnknownMethodError,
)
from camkit.explorer import Session, method_settings
from camkit.modelload import Preprocess


@pytest.fixture(scope="module")
def session():
    return Session("demo", device="cpu")


@pytest.fixture(scope="module")
def image():
    return render(3, 0, 2, marked=False).image  # a triangle, 64x64


def _x(session, rgb):
    x, _ = session.preprocess(rgb)
    return x[None]


@pytest.mark.heavy
def test_the_map_is_exactly_the_python_api_map(session, image):
    x = _x(session, image)
    for method, target in (("gradcam", 2), ("gradcam++", 0), ("saliency", 1), ("eigencam", 3)):
        result = session.explain(image, method, target=target)
        expected = camkit.get_method(method)(session.model)(x, target)[0].numpy()
        assert result.map.dtype == np.float32 and result.map.shape == (64, 64)
        assert np.array_equal(result.map, expected), method
        assert result.prediction["target"] == target and result.prediction["target_name"] == CLASSES[target]


def test_the_predicted_class_is_the_default_target_and_the_top_classes_are_softmax_scores(image):
    session = Session("demo", device="cpu")  # fresh: logits come from the explained pass itself
    result = session.explain(image, "gradcam")
    x = _x(session, image)
    with torch.no_grad():
        probs = session.model(x).softmax(dim=1)[0]
    predicted = int(probs.argmax())
    assert result.prediction["target"] == predicted
    assert result.explanation.target.tolist() == [predicted]
    assert np.array_equal(result.map, camkit.GradCAM(session.model)(x, predicted)[0].numpy())
    top = result.prediction["top"]
    assert [t["index"] for t in top] == probs.argsort(descending=True)[:4].tolist()
    assert [t["name"] for t in top] == [CLASSES[t["index"]] for t in top]
    assert top[0]["score"] == pytest.approx(float(probs.max()), abs=1e-6)
    assert sum(t["score"] for t in top) == pytest.approx(1.0, abs=1e-5)  # all 4 classes
    assert result.prediction["layer"] == camkit.GradCAM(session.model).explain(x, predicted).layers[0]
    assert session.topk(image, k=2) == top[:2]


def test_the_overlay_is_at_the_image_size_and_blends_the_map(session):
    rgb = np.random.default_rng(0).integers(0, 256, (30, 50, 3), dtype=np.uint8)  # not the input size
    result = session.explain(rgb, "gradcam", target=0)
    assert result.overlay.shape == (30, 50, 3) and result.overlay.dtype == np.uint8
    assert result.map.shape == (64, 64)
    full, _ = session.preprocess.invert_map(torch.from_numpy(result.map), 30, 50)
    assert np.array_equal(result.overlay, camkit.overlay(rgb, full))
    assert np.array_equal(session.render(result, 0.0), rgb)
    assert np.array_equal(session.render(result, 1.0), camkit.overlay(rgb, full, alpha=1.0))


def test_a_centre_crop_leaves_the_pixels_outside_uncoloured():
    session = Session("demo", device="cpu", size=64, crop=48, mean=(0, 0, 0), std=(1, 1, 1))
    rgb = np.full((64, 96, 3), 128, np.uint8)
    result = session.explain(rgb, "gradcam", target=0)
    assert result.map.shape == (48, 48)
    _, inside = session.preprocess.invert_map(torch.from_numpy(result.map), 64, 96)
    assert not inside.all()
    assert np.array_equal(result.overlay[~inside.numpy()], rgb[~inside.numpy()])


def test_image_forms_agree_and_the_cache_returns_the_same_object(session, image, tmp_path):
    path = tmp_path / "a.png"
    camkit.save_png(path, image)
    first = session.explain(str(path), "gradcam", target=1)
    assert session.explain(Image.fromarray(image), "gradcam", target=1) is first
    assert session.explain(image.copy(), "gradcam", target=1) is first
    assert session.explain(image, "gradcam", target=2) is not first
    assert session.explain(image, "gradcam", target=np.int64(1)) is first
    assert session.explain(image, "gradcam", target=1, eigen_smooth=True) is not first


def test_settings_reach_the_method(session, image):
    x = _x(session, image)
    result = session.explain(image, "integratedgradients", target=1, steps=4)
    expected = camkit.IntegratedGradients(session.model, steps=4)(x, 1)[0].numpy()
    assert np.array_equal(result.map, expected)
    assert not np.array_equal(session.explain(image, "integratedgradients", target=1, steps=8).map, result.map)
    assert result.prediction["settings"] == {"steps": 4}
    assert result.prediction["layer"] is None


def test_a_chosen_layer_is_used(session, image):
    x = _x(session, image)
    layers = session.layers()
    auto = session.auto_layer(image, "gradcam")
    assert auto in layers
    assert auto == "last_conv"
    other = "features.3"
    assert other in layers
    result = session.explain(image, "gradcam", layer=other, target=0)
    assert result.prediction["layer"] == other
    assert np.array_equal(result.map, camkit.GradCAM(session.model, layer=other)(x, 0)[0].numpy())
    assert session.auto_layer(image, "saliency") is None


def test_method_settings_come_from_the_signature():
    assert method_settings("gradcam") == {"eigen_smooth": False}
    assert method_settings("occlusion") == {"window": None, "stride": None, "baseline": 0.0}
    assert "layer" not in method_settings("scorecam") and "batch_size" not in method_settings("scorecam")
    assert "path" not in method_settings("legrad") and "max_memory" not in method_settings("cheferrollout")


def test_the_signed_view_shows_both_signs(session, image):
    result = session.explain(image, "inputxgradient", target=0)
    signed = session.render(result, 0.7, view="signed")
    assert signed.shape == (64, 64, 3) and signed.dtype == np.uint8
    with pytest.raises(InvalidInputError, match="pixel attributions"):
        session.render(session.explain(image, "gradcam", target=0), view="signed")


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda s, tmp: s.explain(str(tmp / "missing.png"), "gradcam"), InvalidInputError, "no image file"),
        (lambda s, tmp: s.explain(str(tmp / "bad.png"), "gradcam"), InvalidInputError, "could not be decoded"),
        (lambda s, tmp: s.explain(np.zeros((4, 4, 3), np.float32), "gradcam"), InvalidInputError, "uint8"),
        (lambda s, tmp: s.explain(np.zeros((64, 64, 3), np.uint8), "gradcamm"), UnknownMethodError, "gradcam"),
        (lambda s, tmp: s.explain(np.zeros((64, 64, 3), np.uint8), "gradcam", layer="nope"), LayerNotFoundError,
         "nope"),
        (lambda s, tmp: s.explain(np.zeros((64, 64, 3), np.uint8), "gradcam", target=4), InvalidTargetError,
         "out of range: the model has 4 classes"),
        (lambda s, tmp: s.explain(np.zeros((64, 64, 3), np.uint8), "saliency", target=-1), InvalidTargetError,
         "out of range"),
        (lambda s, tmp: s.explain(np.zeros((64, 64, 3), np.uint8), "saliency", layer="stem"), InvalidInputError,
         "takes no layer"),
        (lambda s, tmp: s.explain(np.zeros((64, 64, 3), np.uint8), "gradcam", steps=3), InvalidInputError,
         "no setting 'steps'"),
        (lambda s, tmp: s.explain(np.zeros((64, 64, 3), np.uint8), "cheferrollout"), InvalidInputError,
         "attention methods explain vision transformers"),
    ],
    ids=["missing", "undecodable", "float-array", "unknown-method", "unknown-layer", "target-high", "target-low",
         "layer-for-pixels", "unknown-setting", "method-does-not-fit"],
)  # fmt: skip
def test_bad_input_is_a_camkit_error_with_a_clear_message(session, tmp_path, call, error, words):
    (tmp_path / "bad.png").write_bytes(b"not a png at all")
    with pytest.raises(error, match=words) as caught:
        call(session, tmp_path)
    assert isinstance(caught.value, CamkitError)
    assert str(caught.value).strip()


def test_the_session_leaves_the_model_as_it_was(image):
    model = camkit.bundled.model.load_shapes_cnn()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    session = Session(model, Preprocess(size=(64, 64), mean=(0.0,) * 3, std=(1.0,) * 3), list(CLASSES), device="cpu")
    original = image.copy()
    session.explain(image, "gradcam", target=1)
    session.explain(image, "saliency")
    assert model.training and all(m.training for m in model.modules())
    assert all(p.grad is None and p.requires_grad for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model._forward_hooks and all(not m._forward_hooks and not m._backward_hooks for m in model.modules())
    assert np.array_equal(image, original)


def test_a_preprocess_that_is_not_camkits_is_refused():
    with pytest.raises(InvalidInputError, match="Preprocess"):
        Session("demo", preprocess=lambda image: image, device="cpu")


def test_concurrent_calls_give_the_maps_of_calls_one_by_one(image):
    from concurrent.futures import ThreadPoolExecutor

    session = Session("demo", device="cpu")
    jobs = [("gradcam", 0), ("gradcam++", 1), ("saliency", 2), ("layercam", 3)] * 2
    with ThreadPoolExecutor(4) as pool:
        maps = list(pool.map(lambda job: session.explain(image, job[0], target=job[1]).map, jobs))
    x = _x(session, image)
    for (method, target), got in zip(jobs, maps):
        assert np.array_equal(got, camkit.get_method(method)(session.model)(x, target)[0].numpy()), method


@pytest.mark.parametrize("method", ["gradcam", "saliency"])
def test_a_model_that_is_not_a_classifier_is_refused_clearly(method):
    dense = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 3, padding=1), torch.nn.ReLU())  # [B, 2, H, W] out
    session = Session(dense, Preprocess(size=(8, 8), mean=(0.0,) * 3, std=(1.0,) * 3), device="cpu")
    with pytest.raises(InvalidInputError, match=r"classifiers returning logits \[B, classes\]; got \[1, 2, 8, 8\]"):
        session.explain(np.zeros((8, 8, 3), np.uint8), method, layer="1" if method == "gradcam" else None)
