"""Attribution views (sign modes, outlier clipping, four views) and anchor-defined colormaps, by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import camkit
from camkit.functional import (
    alpha_scaling,
    attribution_view,
    blended_heat_map,
    colormap_lut,
    heat_map,
    masked_image,
    outlier_threshold,
    scale_attribution,
)
from camkit.viz.colormaps import ANCHORS, anchor_lut

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device")])]  # fmt: skip


# --- outlier clipping ----------------------------------------------------------------------------


def test_outlier_threshold_by_hand():
    # 98 ones and one 2: total 100; 98% of the mass is reached at the 98th one, so t = 1 and the 2 is clipped.
    values = torch.cat([torch.ones(98), torch.tensor([2.0])]).reshape(1, 1, 99)
    assert outlier_threshold(values, 2.0).tolist() == [1.0]
    # [1, 2, 3, 4], total 10: 50% (5) first reached at cumulative 1 + 2 + 3 = 6 -> t = 3;
    # 90% (9) first at 10 -> t = 4; 0% -> the smallest value.
    four = torch.tensor([[4.0, 1.0, 3.0, 2.0]])
    assert outlier_threshold(four, 50).tolist() == [3.0]
    assert outlier_threshold(four, 10).tolist() == [4.0]
    assert outlier_threshold(four, 0).tolist() == [4.0]
    assert outlier_threshold(four, 99).tolist() == [1.0]  # 1% of 10 = 0.1: reached at the first value
    # Batched: each map gets its own threshold; an all-zero map gets 0.
    batch = torch.stack([four, 10 * four, torch.zeros(1, 4)])
    assert outlier_threshold(batch, 50).tolist() == [3.0, 30.0, 0.0]
    with pytest.raises(camkit.InvalidInputError, match=r"outlier_perc must be in \[0, 100\)"):
        outlier_threshold(four, 100)


def test_percentile_clipping_matches_the_cumulative_mass_rule_on_random_maps():
    """The rule written out in numpy (sorted cumulative sum) against the batched torch version."""
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(3, 7, 9, generator=gen).abs() ** 3
    for perc in (0.0, 2.0, 25.0):
        got = outlier_threshold(values, perc)
        for b in range(3):
            ordered = np.sort(values[b].flatten().numpy().astype(np.float64))
            mass = np.cumsum(ordered)
            expected = ordered[np.nonzero(mass >= mass[-1] * (1 - perc / 100))[0][0]]
            assert float(got[b]) == pytest.approx(expected, rel=1e-5)


# --- sign modes ------------------------------------------------------------------------------------


A = torch.tensor([[[1.0, -2.0, 3.0, -4.0]]])  # one 1x4 map


def test_each_sign_mode_by_hand():
    # all: |a| = [1, 2, 3, 4], total 10, 50% -> t = 3; a / 3 clipped to [-1, 1]
    assert scale_attribution(A, "all", 50).mul(3).tolist() == [[[1.0, -2.0, 3.0, -3.0]]]
    # positive: [1, 0, 3, 0], total 4, 50% (2) first reached at 1 + 3 = 4 -> t = 3
    assert scale_attribution(A, "positive", 50).mul(3).tolist() == [[[1.0, 0.0, 3.0, 0.0]]]
    # negative: magnitudes [0, 2, 0, 4], total 6, 50% (3) reached at 2 + 4 -> t = 4; non-negative output
    assert scale_attribution(A, "negative", 50).mul(4).tolist() == [[[0.0, 2.0, 0.0, 4.0]]]
    # absolute_value: [1, 2, 3, 4], t = 3, clipped to [0, 1]
    assert scale_attribution(A, "absolute_value", 50).mul(3).tolist() == [[[1.0, 2.0, 3.0, 3.0]]]
    # No clipping (0%): t is the largest magnitude.
    assert scale_attribution(A, "all", 0).mul(4).tolist() == [[[1.0, -2.0, 3.0, -4.0]]]
    with pytest.raises(camkit.InvalidInputError, match="sign must be one of"):
        scale_attribution(A, "both")


def test_channels_are_summed_and_a_zero_map_stays_zero():
    attr = torch.tensor([[[[1.0, -1.0]], [[2.0, -3.0]], [[0.0, 0.0]]]])  # [1, 3, 1, 2]: sums [3, -4]
    assert scale_attribution(attr, "all", 0).mul(4).tolist() == [[[3.0, -4.0]]]
    # A map without positive values under "positive": zeros, not NaN.
    assert scale_attribution(torch.tensor([[[-1.0, -2.0]]]), "positive", 2).tolist() == [[[0.0, 0.0]]]
    with pytest.raises(camkit.InvalidInputError, match=r"\[B, H, W\] or \[B, C, H, W\]"):
        scale_attribution(torch.zeros(2, 2), "all")


# --- views -------------------------------------------------------------------------------------------


def test_heat_map_colours_signed_and_one_sign_maps():
    signed = heat_map(torch.tensor([[[-1.0, 0.0, 1.0]]]), sign="all", outlier_perc=0)
    bwr = anchor_lut("bwr")
    # -1 -> index 0 (blue), 0 -> index round(127.5) = 128, 1 -> index 255 (red)
    assert signed[0, :, 0].T.tolist() == [bwr[0].tolist(), bwr[128].tolist(), bwr[255].tolist()]
    assert signed.shape == (1, 3, 1, 3) and signed.dtype == torch.uint8
    # positive with "reds": 0 -> white, 0.5 -> index round(127.5) = 128, 1 -> (0.8, 0, 0) = (204, 0, 0)
    one = heat_map(torch.tensor([[[0.0, 1.0, 2.0]]]), sign="positive", outlier_perc=0)
    reds = anchor_lut("reds")
    assert one[0, :, 0].T.tolist() == [[255, 255, 255], reds[128].tolist(), [204, 0, 0]]
    # any named colormap may be used (OpenCV's jet here)
    jet = heat_map(torch.tensor([[[0.0, 1.0]]]), sign="absolute_value", outlier_perc=0, colormap="jet")
    assert jet[0, :, 0].T.tolist() == [[0, 0, 128], [128, 0, 0]]


def test_blended_heat_map_by_hand():
    image = torch.tensor([0.1, 0.5, 0.9]).view(1, 3, 1, 1).expand(1, 3, 1, 2)  # grey = 0.5
    attr = torch.tensor([[[-2.0, 2.0]]])
    out = blended_heat_map(image, attr, "all", outlier_perc=0, alpha=0.25)
    # -1 -> blue (0, 0, 1), +1 -> red (1, 0, 0); 0.75 * 0.5 + 0.25 * colour
    assert out[0, :, 0, 0].tolist() == [round(0.375 * 255), round(0.375 * 255), round(0.625 * 255)]
    assert out[0, :, 0, 1].tolist() == [round(0.625 * 255), round(0.375 * 255), round(0.375 * 255)]
    # uint8 images give the same picture as float ones (up to the image's own quantisation)
    as_uint8 = blended_heat_map((image * 255).round().to(torch.uint8), attr, "all", 0, alpha=0.25)
    assert (as_uint8.int() - out.int()).abs().max() <= 1


def test_masked_image_and_alpha_scaling_by_hand():
    image = torch.tensor([0.2, 0.4, 0.8]).view(1, 3, 1, 1).expand(1, 3, 1, 3).clone()
    attr = torch.tensor([[[0.0, 1.0, 4.0]]])  # 0% clipping: t = 4 -> s = [0, 0.25, 1]
    masked = masked_image(image, attr, "positive", outlier_perc=0)
    assert masked[0, :, 0].T.tolist() == [[0, 0, 0], [13, 26, 51], [51, 102, 204]]  # image * s, rounded
    faded = alpha_scaling(image, attr, "positive", outlier_perc=0)  # s * image + (1 - s) * white
    assert faded[0, :, 0].T.tolist() == [[255, 255, 255], [204, 217, 242], [51, 102, 204]]
    black = alpha_scaling(image, attr, "positive", outlier_perc=0, background=0.0)
    assert torch.equal(black, masked)
    for view in (masked_image, alpha_scaling):
        with pytest.raises(camkit.InvalidInputError, match="needs one sign"):
            view(image, attr, "all")


def test_attribution_view_dispatches_and_checks():
    gen = torch.Generator().manual_seed(3)
    images, attr = torch.rand(2, 3, 6, 6, generator=gen), torch.randn(2, 3, 6, 6, generator=gen)
    assert torch.equal(attribution_view(attr, view="heat_map", sign="all"), heat_map(attr, "all"))
    assert torch.equal(attribution_view(attr, images), blended_heat_map(images, attr, "all"))
    assert torch.equal(
        attribution_view(attr, images, "masked_image", "absolute_value"), masked_image(images, attr, "absolute_value")
    )
    assert torch.equal(
        attribution_view(attr, images, "alpha_scaling", "positive"), alpha_scaling(images, attr, "positive")
    )
    with pytest.raises(camkit.InvalidInputError, match="pass images="):
        attribution_view(attr, view="masked_image", sign="positive")
    with pytest.raises(camkit.InvalidInputError, match="view must be one of"):
        attribution_view(attr, images, view="contour")
    with pytest.raises(camkit.InvalidInputError, match="same batch size"):
        blended_heat_map(images[:1], attr)


def test_views_are_batched_like_one_by_one_and_leave_inputs_alone():
    gen = torch.Generator().manual_seed(4)
    images, attr = torch.rand(3, 3, 5, 7, generator=gen), torch.randn(3, 3, 5, 7, generator=gen)
    before = (images.clone(), attr.clone())
    for view, sign in [("heat_map", "all"), ("blended_heat_map", "negative"), ("masked_image", "absolute_value")]:
        batched = attribution_view(attr, images, view, sign)
        single = torch.cat([attribution_view(attr[i : i + 1], images[i : i + 1], view, sign) for i in range(3)])
        assert torch.equal(batched, single), view
    assert torch.equal(images, before[0]) and torch.equal(attr, before[1])


@pytest.mark.parametrize("device", DEVICES)
def test_the_same_calls_work_on_cam_maps(device):
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(4, 2)).to(device)  # fmt: skip
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)).to(device)
    e = camkit.GradCAM(net, "1").explain(x)
    out = attribution_view(e.maps, x, "blended_heat_map", "absolute_value", outlier_perc=0)
    assert out.shape == (2, 3, 8, 8) and out.device == x.device
    # CAM maps are in [0, 1] with a maximum of 1 (unless flat): with 0% clipping the scale is the identity.
    assert torch.allclose(scale_attribution(e.maps, "positive", 0), e.maps)
    # A layer-sized raw map is upsampled to the images in the drawing views.
    assert masked_image(x, e.raw, "positive").shape == (2, 3, 8, 8)


# --- colormaps ---------------------------------------------------------------------------------------


def test_anchor_colormaps_are_256_entry_tables_through_their_anchors():
    for name, anchors in ANCHORS.items():
        lut = colormap_lut(name)
        assert lut.shape == (256, 3) and lut.dtype == torch.uint8, name
        assert lut[0].tolist() == [round(c * 255) for c in anchors[0]], name
        assert lut[255].tolist() == [round(c * 255) for c in anchors[-1]], name
    seismic = anchor_lut("seismic")  # 5 anchors at 0, 0.25, 0.5, 0.75, 1
    # entry 64 sits at 64/255 = 0.25098: just past the blue anchor towards white by 0.0039 / 0.25
    frac = (64 / 255 - 0.25) / 0.25
    assert seismic[64].tolist() == [round(frac * 255), round(frac * 255), 255]
    # bwr is symmetric: entry i and 255 - i swap red and blue
    bwr = anchor_lut("bwr")
    assert np.array_equal(bwr[::-1], bwr[:, ::-1])
    assert np.array_equal(anchor_lut("rdbu_r"), anchor_lut("rdbu")[::-1])
    with pytest.raises(camkit.InvalidInputError, match=r"camkit has: .*bwr.*OpenCV has: .*jet"):
        colormap_lut("nope")


@pytest.mark.heavy
def test_anchor_colormaps_need_no_plotting_library():
    import subprocess
    import sys

    code = (
        "import sys, camkit, camkit.functional as F, torch; F.heat_map(torch.rand(1, 2, 2), 'all');"
        "F.colormap_lut('seismic'); print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_scaling_agrees_with_captum_visualisation():
    """captum's visualize_image_attr normalisation (channels summed, sign mode, mass-percentile clip)."""
    visualization = pytest.importorskip("captum.attr._utils.visualization")
    gen = torch.Generator().manual_seed(5)
    attr = torch.randn(2, 3, 9, 11, generator=gen) * torch.rand(2, 1, 9, 11, generator=gen) ** 4
    for sign in ("all", "positive", "negative", "absolute_value"):
        ours = scale_attribution(attr, sign, outlier_perc=2)
        for b in range(2):
            theirs = visualization._normalize_attr(attr[b].permute(1, 2, 0).numpy().sum(axis=2), sign, 2)
            np.testing.assert_allclose(ours[b].numpy(), theirs, atol=1e-5, err_msg=sign)
