"""Pictures: denormalize, overlay refusing normalised images, load_image's aspect, figures and reprs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import camkit
from camkit.functional import colorize

# --- denormalize and overlay -------------------------------------------------------------------------


def test_denormalize_round_trips_torchvision_normalisation():
    tv = pytest.importorskip("torchvision.transforms.v2.functional")
    image = torch.rand(2, 3, 5, 4, generator=torch.Generator().manual_seed(0))
    before = image.clone()
    x = tv.normalize(image, mean=list(camkit.io.IMAGENET_MEAN), std=list(camkit.io.IMAGENET_STD))
    torch.testing.assert_close(camkit.denormalize(x), image, atol=1e-6, rtol=0)
    torch.testing.assert_close(camkit.denormalize(x[1]), image[1], atol=1e-6, rtol=0)  # one image [C, H, W]
    # By hand, other values: 0.5 * 2 + 0.25 = 1.25 (not clipped)
    assert camkit.denormalize(torch.full((1, 1, 1), 0.5), mean=[0.25], std=[2.0]).tolist() == [[[1.25]]]
    assert torch.equal(image, before)
    with pytest.raises(camkit.InvalidInputError, match="has 4 channels"):
        camkit.denormalize(torch.zeros(4, 2, 2))


def test_overlay_refuses_a_normalised_image_and_takes_mean_std():
    image = torch.rand(3, 6, 6, generator=torch.Generator().manual_seed(1))
    heat = torch.rand(6, 6, generator=torch.Generator().manual_seed(2))
    mean, std = camkit.io.IMAGENET_MEAN, camkit.io.IMAGENET_STD
    x = (image - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    with pytest.raises(camkit.InvalidInputError, match=r"outside \[0, 1\].*camkit.denormalize"):
        camkit.overlay(x, heat)
    expected = camkit.overlay(image, heat)
    assert np.abs(camkit.overlay(x, heat, mean=mean, std=std).astype(int) - expected.astype(int)).max() <= 1
    assert np.abs(camkit.overlay(camkit.denormalize(x), heat).astype(int) - expected.astype(int)).max() <= 1
    with pytest.raises(camkit.InvalidInputError, match="both mean and std"):
        camkit.overlay(image, heat, mean=mean)
    with pytest.raises(camkit.InvalidInputError, match="float tensor"):
        camkit.overlay(np.zeros((6, 6, 3), np.uint8), heat, mean=mean, std=std)


# --- load_image keeps the aspect ratio -----------------------------------------------------------------


def _stripes(tmp_path):
    """A 20 high x 40 wide image: a red band in columns 10..29 (the centre half), blue elsewhere."""
    rgb = np.zeros((20, 40, 3), np.uint8)
    rgb[:, :, 2] = 255
    rgb[:, 10:30] = (255, 0, 0)
    camkit.save_png(tmp_path / "wide.png", rgb)
    return tmp_path / "wide.png"


def test_load_image_centre_crops_by_default(tmp_path):
    path = _stripes(tmp_path)
    x, rgb = camkit.load_image(path, size=10, mean=None, std=None)
    # Scaled by 10 / 20 to 10 x 20 (aspect kept), then the centre 10 x 10: columns 5..14 of the scaled
    # image = columns 10..29 of the original, the red band only.
    assert x.shape == (1, 3, 10, 10) and rgb.shape == (10, 10, 3)
    assert (rgb == np.array([255, 0, 0], np.uint8)).all()
    assert torch.equal(x[0], torch.from_numpy(rgb).permute(2, 0, 1).float() / 255)
    # The old squash keeps every column: blue at both edges.
    _, squashed = camkit.load_image(path, size=10, fit="squash")
    assert squashed[5, 0].tolist() == [0, 0, 255] and squashed[5, 5].tolist() == [255, 0, 0]
    # torchvision's preset: shorter side to `resize`, then a centre crop of `size`.
    _, preset = camkit.load_image(path, size=(10, 16), resize=10)  # 10 x 20 -> crop columns 2..17
    assert preset.shape == (10, 16, 3)
    assert preset[5, 2].tolist() == [0, 0, 255] and preset[5, 3].tolist() == [255, 0, 0]
    assert preset[5, 12].tolist() == [255, 0, 0] and preset[5, 13].tolist() == [0, 0, 255]
    # Portrait images: the same rule transposed.
    camkit.save_png(tmp_path / "tall.png", np.ascontiguousarray(camkit.read_rgb(path).transpose(1, 0, 2)))
    _, tall = camkit.load_image(tmp_path / "tall.png", size=10)
    assert (tall == np.array([255, 0, 0], np.uint8)).all()
    with pytest.raises(camkit.InvalidInputError, match="smaller than the 10x10 crop"):
        camkit.load_image(path, size=10, resize=8)
    with pytest.raises(camkit.InvalidInputError, match="fit must be"):
        camkit.load_image(path, size=10, fit="stretch")


def test_load_image_matches_torchvision_preset_geometry(tmp_path):
    tv = pytest.importorskip("torchvision.transforms.v2.functional")
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (30, 50, 3), dtype=np.uint8)
    camkit.save_png(tmp_path / "noise.png", rgb)
    _, ours = camkit.load_image(tmp_path / "noise.png", size=20, resize=24)
    t = tv.center_crop(tv.resize(torch.from_numpy(rgb).permute(2, 0, 1), [24]), [20, 20])
    assert ours.shape == tuple(t.permute(1, 2, 0).shape)  # same size; interpolation differs slightly
    assert np.abs(ours.astype(int) - t.permute(1, 2, 0).numpy().astype(int)).mean() < 20


# --- figures -----------------------------------------------------------------------------------------


def _explanation(maps, raw, layers=("layer",), method="gradcam"):
    b = maps.shape[0]
    return camkit.Explanation(
        maps=maps, raw=raw, target=torch.arange(b), scores=torch.linspace(0.9, 0.1, b),
        flat=torch.zeros(b, dtype=torch.bool), method=method, layers=layers,
    )  # fmt: skip


def _centre(fig, row, column):
    x0, y0, x1, y1 = fig.panels[(row, column)]
    return fig.image[(y0 + y1) // 2, (x0 + x1) // 2].astype(int)


def test_figure_layout_and_what_each_panel_holds():
    pytest.importorskip("matplotlib")
    images = torch.zeros(2, 3, 12, 12)
    images[0, 0] = 1.0  # red
    images[1, 1] = 1.0  # green
    cam = _explanation(torch.stack([torch.ones(12, 12), torch.zeros(12, 12)]), torch.rand(2, 3, 3))
    raw = torch.stack([torch.ones(3, 12, 12), -torch.ones(3, 12, 12)])  # evidence for, then against
    pixel = _explanation(torch.rand(2, 12, 12), raw, layers=(), method="saliency")
    fig = camkit.figure(images, {"Grad-CAM": cam, "Saliency": pixel}, classes=["circle", "square"], panel=1.5, dpi=60)
    # Size: (1 + 2 * 2) columns of 1.5 in; 2 rows of (1.5 + 0.5) in + 0.7 in of colorbars; at 60 dpi.
    assert fig.image.shape == (round((2 * 2.0 + 0.7) * 60), round(5 * 1.5 * 60), 3)
    assert fig.image.dtype == np.uint8
    assert fig.columns == ("image", "map: Grad-CAM", "map: Saliency", "overlay: Grad-CAM", "overlay: Saliency")
    # Panels: one per cell, inside the figure, about a panel's size, left to right and top to bottom.
    for (row, column), (x0, y0, x1, y1) in fig.panels.items():
        assert 0 <= x0 < x1 <= fig.image.shape[1] and 0 <= y0 < y1 <= fig.image.shape[0]
        assert 40 <= x1 - x0 <= 90 and 40 <= y1 - y0 <= 90, (row, column)
    lefts = [fig.panels[(0, c)][0] for c in fig.columns]
    assert lefts == sorted(lefts)
    assert fig.panels[(1, "image")][1] > fig.panels[(0, "image")][3]
    jet = colorize(torch.tensor([[[0.0, 1.0]]]))[0, :, 0].T.tolist()  # jet at 0 and at 1
    bwr_red, bwr_blue = [255, 0, 0], [0, 0, 255]
    expected = {
        (0, "image"): [255, 0, 0],
        (1, "image"): [0, 255, 0],
        (0, "map: Grad-CAM"): jet[1],
        (1, "map: Grad-CAM"): jet[0],
        (0, "map: Saliency"): bwr_red,  # signed view: positive -> red
        (1, "map: Saliency"): bwr_blue,
        (0, "overlay: Grad-CAM"): [round(0.5 * 255 + 0.5 * jet[1][0]), 0, 0],
        (1, "overlay: Grad-CAM"): [0, round(0.5 * 255), round(0.5 * jet[0][2])],
        # blended heat map: 0.5 * grey (1/3) + 0.5 * colour
        (0, "overlay: Saliency"): [round((0.5 / 3 + 0.5) * 255), round(0.5 / 3 * 255), round(0.5 / 3 * 255)],
        (1, "overlay: Saliency"): [round(0.5 / 3 * 255), round(0.5 / 3 * 255), round((0.5 / 3 + 0.5) * 255)],
    }
    for key, colour in expected.items():
        assert np.abs(_centre(fig, *key) - np.array(colour)).max() <= 1, (key, _centre(fig, *key), colour)
    # Titles: method, class name and score on the maps.
    assert fig.titles[(0, "map: Grad-CAM")] == "Grad-CAM\ncircle: 0.9"
    assert fig.titles[(1, "map: Saliency")] == "Saliency\nsquare: 0.1"
    # Each map column has its colorbar under the last row: jet's ends under Grad-CAM, bwr's under
    # Saliency, no colorbar under the image column.
    below = fig.image[max(fig.panels[(1, c)][3] for c in fig.columns) :].astype(int)

    def has(column, colour):
        x0, _, x1, _ = fig.panels[(1, column)]
        return bool((np.abs(below[:, x0:x1] - np.array(colour)).max(axis=2) <= 12).any())

    assert has("map: Grad-CAM", jet[0]) and has("map: Grad-CAM", jet[1])
    assert has("map: Saliency", bwr_blue) and has("map: Saliency", bwr_red)
    assert not has("map: Saliency", jet[0]) and not has("map: Saliency", jet[1])  # not in bwr
    assert not has("image", jet[0]) and not has("image", bwr_red)


def test_show_and_the_jupyter_repr_return_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    import cv2

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
    x = torch.rand(2, 3, 8, 8)
    e = camkit.GradCAM(net, "1").explain(x, target=[0, 1])
    fig = e.show(x, classes=["cat", "dog"], panel=1.0, dpi=40)
    png = fig._repr_png_()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    decoded = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1]
    assert np.array_equal(decoded, fig.image)
    fig.save(tmp_path / "fig.png")
    assert np.array_equal(camkit.read_rgb(tmp_path / "fig.png"), fig.image)
    assert fig.titles[(1, "map: gradcam")].startswith("gradcam\ndog: ")
    # Normalised images: refused with the fix named, accepted with mean/std.
    xn = (x - 0.5) / 0.1
    with pytest.raises(camkit.InvalidInputError, match="denormalize"):
        e.show(xn)
    again = e.show(xn, mean=(0.5,) * 3, std=(0.1,) * 3, panel=1.0, dpi=40)
    assert again.image.shape == fig.image.shape
    assert np.abs(_centre(again, 1, "overlay: gradcam") - _centre(fig, 1, "overlay: gradcam")).max() <= 1
    # The explanation prints as a summary, not as tensors.
    text = repr(e)
    assert text.startswith("Explanation(method='gradcam', maps=[2, 8, 8], raw=[2, 8, 8], target=[0, 1]")
    assert "tensor(" not in text
    with pytest.raises(camkit.InvalidInputError, match="one map per image"):
        camkit.GradCAM(net, "1").explain(x, target=torch.tensor([[0, 1], [1, 0]])).show(x)


def test_figure_without_matplotlib_says_how_to_install(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    e = _explanation(torch.zeros(1, 4, 4), torch.zeros(1, 2, 2))
    with pytest.raises(ImportError, match=r"camkit\[plot\]"):
        camkit.figure(torch.zeros(1, 3, 4, 4), e)
