"""The painter: unit scores added into their boxes (pixel centres in half-open boxes), summed over views."""

from __future__ import annotations

import math

import pytest
import torch

from camkit.errors import InvalidInputError
from camkit.vlm.paint import paint


def _naive(scores: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    out = torch.zeros(scores.shape[0], *size, dtype=torch.float64)
    for u, (y0, x0, y1, x1) in enumerate(boxes.tolist()):
        if any(math.isnan(v) for v in (y0, x0, y1, x1)):
            continue
        for i in range(size[0]):
            for j in range(size[1]):
                if y0 <= i + 0.5 < y1 and x0 <= j + 0.5 < x1:
                    out[:, i, j] += scores[:, u].double()
    return out.float()


def test_random_boxes_paint_as_the_pixel_by_pixel_rule():
    gen = torch.Generator().manual_seed(0)
    corners = torch.rand(12, 2, 2, generator=gen) * torch.tensor([9.0, 13.0]) - 1.0
    boxes = torch.cat([corners.amin(1), corners.amax(1)], dim=1)  # some reach outside the image
    boxes[3] = float("nan")
    scores = torch.randn(3, 12, generator=gen)
    torch.testing.assert_close(paint(scores, boxes, (7, 11)), _naive(scores, boxes, (7, 11)), rtol=1e-5, atol=1e-5)


def test_views_add_up_and_empty_regions_stay_zero():
    boxes = torch.tensor([[0.0, 0.0, 1.5, 2.0], [0.0, 0.0, 3.0, 3.0]])  # a tile and the whole-image view
    maps = paint(torch.tensor([[2.0, 1.0]]), boxes, (3, 4))
    assert maps.tolist() == [[[3.0, 3.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]]]  # row 1: centre 1.5


def test_bad_shapes_are_refused():
    with pytest.raises(InvalidInputError, match=r"scores \[T, U\] and boxes \[U, 4\]"):
        paint(torch.ones(2, 3), torch.ones(2, 4), (4, 4))
