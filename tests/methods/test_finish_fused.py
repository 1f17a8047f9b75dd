"""The map-finishing path (flatness, upsampling, normalisation, zero fill in few kernels) against the steps it fuses.

The reference is written out from the public functions it replaces on the explainers' path:
``flat_maps`` on the raw map, ``upsample_maps`` then ``normalize_maps``, then flat maps set to zero.
Equality is bit for bit, NaN positions and signs of zero included, on both of its paths: the host's,
which reads which maps need the zero fill, and the device's, which reads nothing.
"""

from __future__ import annotations

import pytest
import torch

from camkit._internal import syncs as _syncs
from camkit.functional import flat_maps, normalize_maps, upsample_maps
from camkit.methods._core.output import _finish_one, finish_maps


def _reference(raw: torch.Tensor, size: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(size)
    flat = flat_maps(raw, spatial_dims=n)
    maps, _ = normalize_maps(upsample_maps(raw, size), spatial_dims=n)
    return maps.masked_fill_(flat.view(*flat.shape, *(1,) * n), 0.0), flat


SHAPES = [
    ((3, 8, 8), (64, 64)),  # an image, upsampled 8x
    ((2, 4, 5), (9, 13)),  # uneven factors
    ((2, 3, 4, 5), (9, 13)),  # [B, K, h, w] maps of K targets
    ((2, 7), (21,)),  # signals
    ((2, 3, 4, 4), (6, 8, 8)),  # volumes
    ((2, 8, 8), (8, 8)),  # already at the input's size: no upsampling
    ((2, 8, 8), (4, 4)),  # a layer finer than the input
    ((1, 1, 1), (5, 5)),  # one position
]


def _variants(raw: torch.Tensor) -> dict[str, torch.Tensor]:
    n = raw[0].numel()
    out = {"random": raw, "relu": raw.clamp_min(0), "negative": -raw.abs() - 3, "zeros": torch.zeros_like(raw)}
    constant = raw.clone()
    constant[0] = 2.5
    out["one constant"] = constant
    rounding = raw.clone()
    rounding[0] = 1.44e-6
    rounding[0].view(-1)[0] += 1e-13  # flat up to float rounding
    out["rounding noise"] = rounding
    nan = raw.clone()
    nan[-1].view(-1)[n // 2] = float("nan")
    out["a NaN"] = nan
    inf = raw.clone()
    inf[-1].view(-1)[0] = float("inf")
    inf[0].view(-1)[-1] = float("-inf")
    out["infinities"] = inf
    zeros = raw.clamp_min(0)
    zeros[zeros == 0] = -0.0  # negative zeros where the ReLU cut, positive values elsewhere
    zeros[0] = torch.where(torch.arange(n).view(raw[0].shape) % 2 == 0, 0.0, -0.0)  # a map of signed zeros only
    out["signed zeros"] = zeros
    extremes = raw.clone()
    extremes[0] = float("nan")  # NaN everywhere
    extremes[-1] = float("inf")  # +inf everywhere
    out["all NaN, all inf"] = extremes
    overflow = raw.clone()
    overflow[0].view(-1)[0], overflow[0].view(-1)[-1] = 3e38, -3e38  # the span overflows float32
    overflow[-1] = raw[-1] * 1e-39  # subnormal values
    out["overflow, subnormals"] = overflow
    return out


@pytest.fixture(params=["host", "device path"])
def reads(request, monkeypatch):
    """Both paths of the zero fill: read on the host (the CPU), or not read (what a GPU takes)."""
    if request.param == "device path":
        monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: False)
    return request.param


@pytest.mark.parametrize(("shape", "size"), SHAPES)
def test_fused_finish_equals_the_steps_it_replaces_bit_for_bit(shape, size, reads):
    raw = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))
    for name, variant in _variants(raw).items():
        before = variant.clone()
        want, want_flat = _reference(variant.clone(), size)
        got, got_flat = _finish_one(variant, size)
        assert torch.equal(got_flat, want_flat), name
        assert got.shape == want.shape, name
        assert torch.equal(got.isnan(), want.isnan()), name
        assert torch.equal(got.nan_to_num(), want.nan_to_num()), name
        assert torch.equal(torch.signbit(got), torch.signbit(want)), name
        assert torch.equal(variant.nan_to_num(), before.nan_to_num()), f"{name}: the raw map was written to"


def test_fused_finish_values_by_hand():
    raw = torch.tensor([[[1.0, 3.0]], [[2.0, 2.0]], [[1.0, 1.0 + 1e-9]], [[-4.0, -2.0]]])
    maps, flat = _finish_one(raw, (1, 2))
    assert maps.tolist() == [[[0.0, 1.0]], [[0.0, 0.0]], [[0.0, 0.0]], [[0.0, 1.0]]]
    assert flat.tolist() == [False, True, True, False]


def test_finish_maps_of_several_layers_still_fuses_by_the_mean():
    g = torch.Generator().manual_seed(3)
    a, b = torch.rand(2, 4, 4, generator=g), torch.rand(2, 2, 2, generator=g)
    b[1] = 0.0  # flat in one layer only: the fused map is not flat
    maps, flat = finish_maps([a, b], (8, 8))
    first, _ = _reference(a, (8, 8))
    second, _ = _reference(b, (8, 8))
    want, _ = normalize_maps((first + second) / 2)
    assert flat.tolist() == [False, False]
    torch.testing.assert_close(maps, want, rtol=0, atol=1e-7)
