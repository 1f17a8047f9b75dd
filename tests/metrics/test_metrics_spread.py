"""The spread and border of maps at any rank, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from camkit.metrics import spread_and_border
from camkit.metrics.spread import _top_sum


def test_spread_and_border_of_a_ramp_match_hand_computation():
    ramp = torch.arange(1, 101, dtype=torch.float32).reshape(1, 10, 10)  # pixel (r, c) holds 10 r + c + 1
    spread, border = spread_and_border(torch.cat([ramp, torch.zeros(1, 10, 10)]))
    # top 10% = the 10 largest pixels, 91..100, sum 955, of a total 5050
    assert spread[0].item() == pytest.approx(955 / 5050, rel=1e-6)
    # a frame 1 pixel wide; the 8x8 inside sums 10 * 36 * 8 + 36 * 8 + 64 = 3232
    assert border[0].item() == pytest.approx((5050 - 3232) / 5050, rel=1e-6)
    assert torch.isnan(spread[1]) and torch.isnan(border[1])  # an all-zero map has no energy to share


@pytest.mark.parametrize("k", [1, 7, 500, 1200])
def test_cpu_top_sum_equals_topk(k):
    flat = torch.rand(5, 1200, generator=torch.Generator().manual_seed(k))
    expected = flat.double().topk(k, dim=1).values.sum(dim=1)
    got = _top_sum(flat, k)
    assert got.dtype == torch.float32 and got.shape == (5,)
    assert torch.allclose(got.double(), expected, rtol=1e-5, atol=0)


def test_spread_and_border_of_2d_maps_by_hand():
    maps = torch.zeros(2, 10, 10)
    maps[0, 5, 5], maps[0, 0, 0], maps[0, 9, 4] = 6.0, 1.0, 1.0  # two of 8 units on the 1-pixel frame
    maps[1] = 1.0  # flat: the 10 top pixels hold 10 of 100; the frame 36 of 100
    spread, border = spread_and_border(maps)
    assert spread.dtype == torch.float32 and spread.tolist() == [1.0, pytest.approx(0.1)]
    assert border.tolist() == [0.25, pytest.approx(0.36)]
    # top 20% of a 10x10 map is 20 pixels; a frame of 0.25 * 10 -> round(2.5) = 2 pixels
    spread, border = spread_and_border(maps, top=0.2, frame=0.25)
    assert spread.tolist() == [1.0, pytest.approx(0.2)] and border.tolist() == [0.25, pytest.approx(0.64)]


def test_spread_and_border_of_3d_maps_by_hand_and_border_axes():
    maps = torch.zeros(1, 10, 10, 10, dtype=torch.float64)
    maps[0, 5, 5, 5], maps[0, 0, 5, 5], maps[0, 5, 0, 5] = 2.0, 1.0, 1.0
    spread, border = spread_and_border(maps)
    assert spread.dtype == torch.float64 and (spread.item(), border.item()) == (1.0, 0.5)
    # a video [T, H, W]: height and width framed, time not: the voxel at t=0 is inside
    spread, border = spread_and_border(maps, border_axes=(-2, -1))
    assert (spread.item(), border.item()) == (1.0, 0.25)
    assert spread_and_border(maps, border_axes=(1,))[1].item() == 0.25  # only the time axis framed
    # top 10% of 1000 voxels = 100 voxels; of a ramp 1..1000 they sum 901 + ... + 1000 = 95050
    ramp = torch.arange(1, 1001, dtype=torch.float64).reshape(1, 10, 10, 10)
    assert spread_and_border(ramp)[0].item() == pytest.approx(95050 / 500500, rel=1e-12)


def test_spread_and_border_of_flat_zero_and_nan_maps_is_nan():
    maps = torch.zeros(3, 4, 5, 6)
    maps[1] = 2.0
    maps[2, 0, 0, 0] = float("nan")
    spread, border = spread_and_border(maps)
    assert math.isnan(spread[0]) and math.isnan(border[0])  # all zero: no energy to share
    # flat: the top ceil(0.1 * 4 * 5 * 6) = 12 of 120 voxels; frame of 1 on every axis leaves 2 x 3 x 4 inside
    assert spread[1].item() == pytest.approx(12 / 120) and border[1].item() == pytest.approx(1 - 24 / 120)
    assert math.isnan(spread[2]) and math.isnan(border[2])


def test_spread_and_border_counts_ten_percent_of_150_positions_as_15():
    """10% of 3 x 50 positions is 15, though ``0.1 * 3 * 50`` computes to 15.000000000000002 (the image
    audit's left-to-right product counted 16 before spread_and_border was shared)."""
    maps = torch.arange(1, 151, dtype=torch.float32).reshape(1, 3, 50)
    assert spread_and_border(maps)[0].item() == pytest.approx(sum(range(136, 151)) / sum(range(1, 151)), rel=1e-6)
    odd = torch.arange(1, 225, dtype=torch.float64).reshape(1, 14, 16)  # 22.4 -> the 23 largest
    assert spread_and_border(odd)[0].item() == pytest.approx(sum(range(202, 225)) / sum(range(1, 225)), rel=1e-12)
