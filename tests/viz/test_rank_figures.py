"""Pictures of volumes, videos and signals: sizes, panels, one colour scale, and what figure() picks by rank."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import camkit
from camkit.functional import colormap_lut
from camkit.media import read_video
from camkit.viz.signal import signal_figure
from camkit.viz.video import overlay_frames, save_animation, video_figure
from camkit.viz.volume import PLANES, montage_figure, volume_figure

pytest.importorskip("matplotlib")

JET = colormap_lut("jet").numpy().astype(int)


def _over_black(value: float, alpha: float = 0.5) -> list[int]:
    """The overlay colour of a map value on a black pixel: round(alpha * jet[round(255 v)])."""
    return np.round(alpha * JET[round(255 * value)]).astype(int).tolist()


def _cell(fig, key, shape, index):
    """The figure's pixel at the centre of cell ``index`` of a panel showing an array of ``shape``."""
    x0, y0, x1, y1 = fig.panels[key]
    row, col = index
    y = int(y0 + (row + 0.5) * (y1 - y0) / shape[0])
    x = int(x0 + (col + 0.5) * (x1 - x0) / shape[1])
    return fig.image[y, x].astype(int).tolist()


def _lesion(peak=(2, 5, 1)):
    """A zero scan (shown black) and a map: 1.0 at ``peak``, 0.5 on the rest of its three planes, 0 elsewhere."""
    maps = torch.zeros(6, 6, 6)
    maps[peak[0]] = 0.5
    maps[:, peak[1]] = 0.5
    maps[:, :, peak[2]] = 0.5
    maps[peak] = 1.0
    return torch.zeros(1, 1, 6, 6, 6), maps


def test_volume_figure_layout_and_one_colour_scale():
    scan, maps = _lesion()
    both = {"gradcam": maps[None], "half": maps[None] / 2}
    fig = volume_figure(scan, both, panel=1.5, dpi=80)
    assert fig.image.shape == (round((3 * 2.0 + 0.7) * 80), 3 * 1.5 * 80, 3)  # 3 rows of 1.5 + 0.5 in; 3 panels
    assert fig.columns == PLANES and sorted({r for r, _ in fig.panels}) == [0, 1, 2]
    assert fig.titles[(0, "axis 0")] == "scan 0\nD=2 of 6\n(peak of gradcam [2, 5, 1])"
    assert [fig.titles[(1, c)].splitlines()[1] for c in PLANES] == ["D=2 of 6", "H=5 of 6", "W=1 of 6"]
    # The peak voxel in every plane: (h, w) = (5, 1) across D; (d, w) = (2, 1) across H; (d, h) = (2, 5) across W.
    cells = {"axis 0": (5, 1), "axis 1": (2, 1), "axis 2": (2, 5)}
    for column, index in cells.items():
        assert _cell(fig, (0, column), (6, 6), index) == [0, 0, 0]  # the scan row: black
        assert _cell(fig, (1, column), (6, 6), index) == _over_black(1.0)  # same colour for 1.0 in each panel
        assert _cell(fig, (2, column), (6, 6), index) == _over_black(0.5)  # the half map: 0.5, not rescaled to 1
        off = (0, 3) if column != "axis 0" else (3, 3)  # a voxel of value 0.5 in each plane
        assert _cell(fig, (1, column), (6, 6), off) == _over_black(0.5)
    boxes = list(fig.panels.values())
    assert all(x1 > x0 + 50 and y1 > y0 + 50 for x0, y0, x1, y1 in boxes)


def test_volume_figure_takes_at_and_spacing_and_refuses_a_voxel_outside():
    scan, maps = _lesion()
    fig = volume_figure(scan, maps[None], at=(0, 0, 0), spacing=(3.0, 1.0, 1.0), panel=1.5, dpi=80)
    assert fig.titles[(1, "axis 2")].splitlines()[1] == "W=0 of 6"
    x0, y0, x1, y1 = fig.panels[(1, "axis 1")]  # [D, W] with D voxels three times as thick: taller than wide
    assert (y1 - y0) > 2 * (x1 - x0)
    with pytest.raises(camkit.InvalidInputError, match=r"at=\[0, 9, 0\] is not a voxel"):
        volume_figure(scan, maps[None], at=(0, 9, 0))
    with pytest.raises(camkit.InvalidInputError, match=r"do not fit the input; expected \[1, 6, 6, 6\]"):
        volume_figure(scan, maps[:3][None])


def test_montage_has_count_slices_on_one_colour_scale():
    scan, maps = _lesion(peak=(4, 2, 3))
    fig = montage_figure(scan[0], maps, axis=0, count=3, columns=2, panel=1.5, dpi=80)
    assert fig.columns == ("slice 0", "slice 2", "slice 5") or fig.columns == ("slice 0", "slice 3", "slice 5")
    picked = [int(c.split()[1]) for c in fig.columns]
    assert sorted({r for r, _ in fig.panels}) == [0, 1]  # 3 slices in rows of 2
    for n, d in enumerate(picked):
        key = (n // 2, fig.columns[n])
        assert fig.titles[key] == f"map: D={d}"
        # voxel (h=2, w=3) is 0.5 in every slice (its H and W planes): the same colour in every panel
        assert _cell(fig, key, (6, 6), (2, 3)) == _over_black(0.5)
        assert _cell(fig, key, (6, 6), (0, 0)) == _over_black(0.0)
    with pytest.raises(camkit.InvalidInputError, match="one volume"):
        montage_figure(scan.expand(2, -1, -1, -1, -1), maps)
    with pytest.raises(camkit.InvalidInputError, match="axis must be 0, 1 or 2"):
        montage_figure(scan[0], maps, axis=3)


def _clip(frames=6, height=8, width=12):
    """A black clip with one white pixel moving right, and a map 1 there and 0.25 elsewhere."""
    clip = torch.zeros(3, frames, height, width)
    maps = torch.full((frames, height, width), 0.25)
    for t in range(frames):
        clip[:, t, 4, t] = 1.0
        maps[t, 4, t] = 1.0
    return clip, maps


def test_video_figure_strip_layout_shares_and_colour_scale():
    clip, maps = _clip()
    maps[5] *= 0  # the last frame carries nothing
    fig = video_figure(clip, {"gradcam": maps}, count=3, panel=1.2, dpi=80)
    assert fig.columns == ("frame 0", "frame 2", "frame 5") or fig.columns == ("frame 0", "frame 3", "frame 5")
    picks = [int(c.split()[1]) for c in fig.columns]
    assert sorted({r for r, _ in fig.panels}) == [0, 1]
    total = float(maps.sum())
    for t, column in zip(picks, fig.columns, strict=True):
        share = float(maps[t].sum()) / total
        assert fig.titles[(1, column)] == f"gradcam\nshare {share:.2f}"
        if t < 5:
            assert _cell(fig, (0, column), (8, 12), (4, t)) == [255, 255, 255]
            # white under 1.0: round(0.5 * 255 + 0.5 * jet[255]); black under 0.25
            white = np.round(0.5 * 255 + 0.5 * JET[255]).astype(int).tolist()
            assert _cell(fig, (1, column), (8, 12), (4, t)) == white
            assert _cell(fig, (1, column), (8, 12), (0, 11)) == _over_black(0.25)
    assert fig.image.shape[1] == round(3 * 1.2 * 80)


def test_video_figure_undoes_normalisation_and_refuses_normalised_clips_without_it():
    clip, maps = _clip()
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    normalised = (clip - torch.tensor(mean).view(3, 1, 1, 1)) / torch.tensor(std).view(3, 1, 1, 1)
    with pytest.raises(camkit.InvalidInputError, match=r"outside \[0, 1\].*pass mean= and std="):
        video_figure(normalised, maps)
    a = video_figure(normalised, maps, mean=mean, std=std, count=2, dpi=40)
    b = video_figure(clip, maps, count=2, dpi=40)
    assert np.abs(a.image.astype(int) - b.image.astype(int)).max() <= 1


@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_animation_frames_read_back_in_number_and_colour(tmp_path, suffix):
    clip, maps = _clip(frames=7, height=32, width=48)
    maps = torch.nn.functional.interpolate(maps[None, None], scale_factor=1, mode="nearest")[0, 0]
    drawn = save_animation(tmp_path / f"a{suffix}", clip, maps, fps=5)
    assert drawn.shape == (7, 32, 48, 3)
    np.testing.assert_array_equal(drawn, overlay_frames(clip, maps))
    back = read_video(tmp_path / f"a{suffix}")
    assert back.frames.shape == (7, 32, 48, 3) and back.fps == 5.0
    # far from the moving pixel every frame shows the 0.25 colour over black (lossy codecs: close, not equal)
    far = back.frames[:, 20:28, 30:40].reshape(7, -1, 3).mean(axis=1)
    assert np.abs(far - np.array(_over_black(0.25))).max() < 6


def test_signal_figure_puts_the_map_under_the_waveform_on_one_scale():
    signal = torch.zeros(2, 2, 50)
    signal[:, 0, 20:30] = torch.linspace(-1, 1, 10)  # a burst on channel 0
    maps = torch.zeros(2, 50)
    maps[0, 25] = 1.0
    maps[1, 10] = 0.5
    fig = signal_figure(signal, {"gradcam": maps}, rate=100.0, width=5, height=1.2, dpi=80)
    assert fig.columns == ("signal", "map") and sorted({r for r, _ in fig.panels}) == [0, 1]
    assert fig.image.shape[:2] == (round((2 * 1.7 + 0.7) * 80), 400)
    assert fig.titles[(0, "signal")] == "signal 0: gradcam"
    for row, (t, value) in enumerate([(25, 1.0), (10, 0.5)]):
        wave, strip = fig.panels[(row, "signal")], fig.panels[(row, "map")]
        assert wave[0] == strip[0] and wave[2] == strip[2] and wave[3] <= strip[1]  # the strip sits under the waveform
        assert _cell(fig, (row, "map"), (1, 50), (0, t)) == JET[round(255 * value)].tolist()
        assert _cell(fig, (row, "map"), (1, 50), (0, 40)) == JET[0].tolist()
    with pytest.raises(camkit.InvalidInputError, match="1 channel name"):
        signal_figure(signal, maps, channels=["I"])


@pytest.mark.heavy
def test_figure_and_show_choose_by_rank():
    from models import RankNet, rank_input

    volume = torch.rand(2, 3, 4, 8, 8)
    e = camkit.GradCAM(RankNet(3).eval(), "conv2").explain(volume)
    assert e.show(volume, dpi=40).columns[0] == "frame 0"  # three channels: a video by default
    assert camkit.figure(volume, e, kind="volume", dpi=40).columns == PLANES
    with pytest.raises(camkit.InvalidInputError, match="kind must be one of"):
        camkit.figure(volume, e, kind="film")
    with pytest.raises(camkit.InvalidInputError, match="signed views are drawn for images only"):
        camkit.figure(volume, e, sign="all")
    signal = rank_input(1, batch=2)
    s = camkit.GradCAM(RankNet(1).eval(), "conv2").explain(signal)
    fig = s.show(signal, dpi=40)
    assert fig.columns == ("signal", "map") and len({r for r, _ in fig.panels}) == 2
    image = torch.rand(1, 3, 8, 8)
    assert camkit.GradCAM(RankNet(2).eval(), "conv2").explain(image).show(image, dpi=40).columns[0] == "image"


def test_frame_curve_figure_size_and_refusal():
    from camkit.viz.video import frame_curve_figure

    fig = frame_curve_figure(torch.tensor([0.2, 0.3, 0.5]), fps=10.0, label="gradcam", width=4, height=2, dpi=50)
    assert fig.image.shape == (100, 200, 3) and fig.titles[(0, "curve")] == "gradcam: each frame's share"
    x0, y0, x1, y1 = fig.panels[(0, "curve")]
    assert 0 < x0 < x1 <= 200 and 0 < y0 < y1 <= 100
    line = fig.image[y0:y1, x0:x1].astype(int)  # the curve: matplotlib's first colour (#1f77b4), antialiased
    assert ((line[..., 2] - line[..., 0]) > 60).sum() > 30  # blue pixels: the curve and its markers
    with pytest.raises(camkit.InvalidInputError, match=r"one share per frame \[T\]"):
        frame_curve_figure(torch.rand(2, 3))
