"""Pointing game and energy pointing game: hits, misses, tolerance, exclusive box ends, NaN."""

from __future__ import annotations

import pytest
import torch

from camkit.errors import InvalidInputError
from camkit.metrics import energy_pointing_game, pointing_game, region_masks


def peak_map(row: int, col: int, size: int = 4) -> torch.Tensor:
    m = torch.zeros(size, size)
    m[row, col] = 1.0
    return m


def test_box_hits_and_misses_with_exclusive_ends(device):
    maps = torch.stack([peak_map(1, 2)] * 4).to(device)
    boxes = torch.tensor(
        [
            [2, 1, 3, 2],  # exactly pixel (1, 2): hit
            [0, 0, 2, 2],  # columns 0-1 (x1 = 2 exclusive): miss
            [0, 0, 4, 1],  # row 0 only (y1 = 1 exclusive): miss
            [1.5, 0.5, 2.5, 1.5],  # fractional bounds include column 2 and row 1: hit
        ]
    )
    hits = pointing_game(maps, boxes)
    assert hits.tolist() == [True, False, False, True]
    assert hits.dtype == torch.bool and hits.device.type == device.type


def test_tolerance_is_euclidean_pixels():
    maps = torch.stack([peak_map(0, 0)] * 2)
    only_11 = torch.tensor([[1, 1, 2, 2], [3, 0, 4, 1]])  # (1,1) at distance sqrt(2); (0,3) at 3
    assert pointing_game(maps, only_11).tolist() == [False, False]
    assert pointing_game(maps, only_11, tolerance=1).tolist() == [False, False]
    assert pointing_game(maps, only_11, tolerance=2).tolist() == [True, False]
    assert pointing_game(maps, only_11, tolerance=3).tolist() == [True, True]


def test_masks_agree_with_boxes_with_and_without_tolerance():
    g = torch.Generator().manual_seed(0)
    maps = torch.rand(6, 9, 7, generator=g)
    boxes = torch.tensor([[0, 0, 3, 3], [2, 4, 7, 9], [5, 1, 6, 2], [1, 1, 1, 5], [0, 0, 7, 9], [3, 3, 5, 4]])
    masks = region_masks(boxes, maps)
    for tol in (0, 1, 2, 4):
        assert torch.equal(pointing_game(maps, boxes, tol), pointing_game(maps, masks, tol))
    assert torch.allclose(energy_pointing_game(maps, boxes), energy_pointing_game(maps, masks))
    # the box [1, 1, 1, 5] has x1 == x0: empty, so never a hit
    assert not bool(pointing_game(maps, boxes, 4)[3]) and float(energy_pointing_game(maps, boxes)[3]) == 0.0


def test_ties_at_the_maximum_go_to_the_first_in_row_major_order():
    m = torch.zeros(1, 4, 4)
    m[0, 0, 3] = m[0, 2, 0] = 1.0
    assert pointing_game(m, torch.tensor([[3, 0, 4, 1]])).tolist() == [True]
    assert pointing_game(m, torch.tensor([[0, 2, 1, 3]])).tolist() == [False]


def test_nan_maps_miss_and_give_nan_energy():
    maps = torch.stack([peak_map(1, 1), peak_map(1, 1)])
    maps[1, 3, 3] = float("nan")
    box = torch.tensor([[0, 0, 4, 4], [0, 0, 4, 4]])
    assert pointing_game(maps, box).tolist() == [True, False]
    energy = energy_pointing_game(maps, box)
    assert float(energy[0]) == 1.0 and torch.isnan(energy[1])


def test_energy_exact_values():
    maps = torch.tensor([[[1.0, 3.0], [2.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]])
    masks = torch.tensor([[[False, True], [False, True]], [[True, True], [True, True]], [[True, False], [False, False]]])
    energy = energy_pointing_game(maps, masks)
    assert energy[0].item() == pytest.approx(0.7) and energy[2].item() == pytest.approx(0.25)
    assert torch.isnan(energy[1])  # an all-zero map has no energy to share
    boxes = torch.tensor([[0, 1, 2, 2], [0, 0, 2, 2], [0, 0, 1, 1]])  # row 1; all; pixel (0,0)
    assert energy_pointing_game(maps, boxes)[0].item() == pytest.approx(0.6)


def test_region_errors_name_the_fix():
    maps = torch.rand(2, 4, 4)
    with pytest.raises(InvalidInputError, match=r"regions > 0\.5"):
        pointing_game(maps, torch.ones(2, 4, 4))
    with pytest.raises(InvalidInputError, match=r"boxes\[None\]"):
        pointing_game(maps, torch.tensor([0, 0, 2, 2]))
    with pytest.raises(InvalidInputError, match=r"expected the maps' \[2, 4, 4\]"):
        energy_pointing_game(maps, torch.ones(2, 3, 4, dtype=torch.bool))
    with pytest.raises(InvalidInputError, match="tolerance"):
        pointing_game(maps, torch.tensor([[0, 0, 2, 2]] * 2), tolerance=-1)
