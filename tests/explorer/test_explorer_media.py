"""The explorer on volumes, videos and signals: tiny 3-D, video and 1-D models built here, maps equal to the Python API's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import camkit
from camkit.errors import InvalidInputError
from camkit.explorer import Session
from camkit.explorer.media import explain_media, media_positions, media_view
from camkit.media.nifti import normalize_intensity, read_volume, write_volume
from camkit.media.video import read_video, write_video
from camkit.modelload.video import video_preprocess


def _net(conv: type[nn.Module], pool: type[nn.Module], channels: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(conv(channels, 4, 3, padding=1), nn.ReLU(), pool(1), nn.Flatten(), nn.Linear(4, 3)).eval()


def _no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._backward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_a_volume_is_explained_exactly_and_sliced_along_each_axis(tmp_path):
    model = _net(nn.Conv3d, nn.AdaptiveAvgPool3d, 1)
    data = np.random.default_rng(0).normal(size=(6, 7, 8)).astype(np.float32)
    path = tmp_path / "scan.nii.gz"
    write_volume(path, data, np.eye(4))
    result = explain_media(Session(model, device="cpu"), path, "gradcam", target=2)
    x = torch.from_numpy(normalize_intensity(read_volume(path).data, "minmax"))[None, None]
    assert result.kind == "volume" and result.map.shape == (6, 7, 8) and result.prediction["target"] == 2
    assert np.array_equal(result.map, camkit.GradCAM(model)(x, 2)[0].numpy())
    assert result.prediction["top"][0]["index"] == int(model(x).argmax()) and _no_hooks(model)
    assert not any(p.grad is not None for p in model.parameters())
    assert [media_positions(result, a) for a in (0, 1, 2)] == [6, 7, 8]
    peak = np.unravel_index(int(result.map.argmax()), result.map.shape)
    grey = np.repeat((result.data[:, :, peak[2]] * 255).round().astype(np.uint8)[:, :, None], 3, axis=2)
    assert np.array_equal(media_view(result, axis=2), camkit.overlay(grey, result.map[:, :, peak[2]]))
    assert media_view(result, axis=1, index=0).shape == (6, 8, 3)
    with pytest.raises(InvalidInputError, match="outside 0 to 6"):
        media_view(result, axis=1, index=7)
    with pytest.raises(InvalidInputError, match="axis"):
        media_view(result, axis=3)


@pytest.mark.slow
def test_a_video_is_explained_exactly_with_one_view_per_frame(tmp_path):
    model = _net(nn.Conv3d, nn.AdaptiveAvgPool3d, 3)
    frames = np.random.default_rng(1).integers(0, 256, size=(5, 12, 16, 3), dtype=np.uint8)
    path = tmp_path / "clip.gif"
    write_video(path, frames, fps=4)
    result = explain_media(Session(model, device="cpu"), path, "gradcam")
    x, shown = video_preprocess(model)(read_video(path).frames)
    expected_target = int(model(x[None]).argmax())
    assert result.kind == "video" and result.prediction["target"] == expected_target
    assert np.array_equal(result.map, camkit.GradCAM(model)(x[None], expected_target)[0].numpy())
    assert result.map.shape == (5, 12, 16) and media_positions(result) == 5
    assert np.array_equal(media_view(result, index=3, alpha=0.25), camkit.overlay(shown[3], result.map[3], alpha=0.25))
    assert _no_hooks(model)


def test_a_signal_is_explained_exactly(tmp_path):
    model = _net(nn.Conv1d, nn.AdaptiveAvgPool1d, 2)
    signal = np.random.default_rng(2).normal(size=(2, 40)).astype(np.float32)
    path = tmp_path / "ecg.npy"
    np.save(path, signal)
    result = explain_media(Session(model, device="cpu"), path, "saliency", target=0)
    assert result.kind == "signal" and result.map.shape == (40,) and media_positions(result) == 1
    assert np.array_equal(result.map, camkit.Saliency(model)(torch.from_numpy(signal)[None], 0)[0].numpy())
    assert _no_hooks(model) and not any(p.grad is not None for p in model.parameters())


@pytest.mark.slow
def test_a_signal_is_drawn_as_a_plot(tmp_path):
    model = _net(nn.Conv1d, nn.AdaptiveAvgPool1d, 2)
    path = tmp_path / "ecg.npy"
    np.save(path, np.random.default_rng(2).normal(size=(2, 40)).astype(np.float32))
    picture = media_view(explain_media(Session(model, device="cpu"), path, "saliency", target=0))
    assert picture.dtype == np.uint8 and picture.ndim == 3 and picture.shape[2] == 3
    assert picture.shape[0] > 50 and picture.shape[1] > 200  # a figure, not a strip of 40 values


def test_a_model_that_does_not_take_the_file_says_so(tmp_path):
    model = _net(nn.Conv2d, nn.AdaptiveAvgPool2d, 3)
    path = tmp_path / "ecg.npy"
    np.save(path, np.zeros((3, 20), np.float32))
    with pytest.raises(InvalidInputError, match="the model takes images"):
        explain_media(Session(model, device="cpu"), path, "gradcam")
    with pytest.raises(InvalidInputError, match="not a volume"):
        explain_media(Session(model, device="cpu"), tmp_path / "a.png", "gradcam")


def test_the_explain_tab_callbacks_take_a_volume(tmp_path):
    pytest.importorskip("gradio")
    from camkit.explorer.explain_tab import explain_action, media_positions_update, rerender, upload_action

    model = _net(nn.Conv3d, nn.AdaptiveAvgPool3d, 1)
    session = Session(model, device="cpu")
    path = tmp_path / "scan.nii"
    write_volume(path, np.random.default_rng(3).normal(size=(5, 6, 7)).astype(np.float32), np.eye(4))
    picture, classes, layers, target = upload_action(session, str(path), "gradcam")
    assert picture is None and classes["choices"] == [] and layers["choices"][0] == ("automatic", "") and target == ""
    png, npy, prediction, result = explain_action(session, tmp_path / "out", str(path), "gradcam", "", "1")
    assert prediction["kind"] == "volume" and prediction["target"] == 1
    assert np.array_equal(np.load(npy), result.map) and result.map.shape == (5, 6, 7)
    assert np.array_equal(camkit.read_rgb(png), media_view(result))  # the picture: the slice through the peak
    slider, top = media_positions_update(result, 1)
    peak = int(np.unravel_index(int(result.map.argmax()), result.map.shape)[1])
    assert slider["maximum"] == 5 and slider["value"] == peak and slider["visible"] is True
    assert top["value"] == "1" and len(top["choices"]) == 3
    assert np.array_equal(rerender(session, result, 0.5, "map", 1, peak), media_view(result, axis=1))
    assert rerender(session, result, 0.5, "map", 2, 0).shape == (5, 6, 3)


def test_a_file_explained_again_comes_from_the_cache_and_new_settings_do_not(tmp_path):
    model = _net(nn.Conv1d, nn.AdaptiveAvgPool1d, 2)
    calls = []
    model[0].register_forward_hook(lambda *_: calls.append(1))  # counts model runs (the test's own hook)
    path = tmp_path / "ecg.npy"
    np.save(path, np.random.default_rng(3).normal(size=(2, 40)).astype(np.float32))
    session = Session(model, device="cpu")
    first = explain_media(session, path, "saliency", target=1)
    runs = len(calls)
    assert runs > 0 and explain_media(session, path, "saliency", target=1) is first and len(calls) == runs
    other = explain_media(session, path, "saliency", target=2)  # another target: computed
    assert other is not first and len(calls) > runs and other.prediction["target"] == 2
    np.save(path, np.random.default_rng(4).normal(size=(2, 40)).astype(np.float32))  # the file changed: computed
    changed = explain_media(session, path, "saliency", target=1)
    assert changed is not first and not np.array_equal(changed.map, first.map) and changed.map.max() > 0
    x = torch.from_numpy(np.load(path))[None]
    assert np.array_equal(changed.map, camkit.Saliency(model)(x, 1)[0].numpy())
