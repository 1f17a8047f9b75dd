"""Occlusion, RISE and the region methods on signals [B, C, T] and volumes [B, C, D, H, W].

Hand-computed values on linear and additive models (the score lost under a window or a
cell is the sum of weight x input there), RISE masks against their formula per axis, the
defaults per rank, SLIC supervoxels, batch equals one by one, and the refusals.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from models import RankNet, rank_input
from torch import Tensor, nn

import camkit
from camkit.functional.perturbation import default_window, rise_masks
from camkit.functional.regions import grid_regions, superpixel_regions

SIGNAL, VOLUME = (10,), (4, 6, 6)


class Linear(nn.Module):
    """Score 0 is ``sum(w * x)`` over channels and positions, score 1 is ``-sum(x)``."""

    def __init__(self, shape: tuple[int, ...], seed: int = 0) -> None:
        super().__init__()
        self.w = torch.randn(shape, generator=torch.Generator().manual_seed(seed))

    def forward(self, x: Tensor) -> Tensor:
        return torch.stack([(x * self.w).flatten(1).sum(1), -x.flatten(1).sum(1)], dim=1)


class Additive(nn.Module):
    """Score 0 is ``sum(w * x ** 2)``: a sum of one term per position, so every coalition's
    score is the sum of its regions' terms and the Shapley value of a region is its own
    terms, ``sum over the region of w * (x ** 2 - baseline ** 2)``."""

    def __init__(self, shape: tuple[int, ...], seed: int = 0) -> None:
        super().__init__()
        self.w = torch.randn(shape, generator=torch.Generator().manual_seed(seed))

    def forward(self, x: Tensor) -> Tensor:
        f = (self.w * x**2).flatten(1).sum(1)
        return torch.stack([f, -f], dim=1)


def _input(size: tuple[int, ...], batch: int = 2, channels: int = 2, seed: int = 3) -> Tensor:
    return torch.randn(batch, channels, *size, generator=torch.Generator().manual_seed(seed))


def _boxes(size, window, starts):
    """Every window as a tuple of slices, from the starts listed by hand on each axis."""
    for corner in itertools.product(*starts):
        yield tuple(slice(s, s + w) for s, w in zip(corner, window))


# --- Occlusion ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "window", "stride", "starts"),
    [
        (SIGNAL, 4, 4, [[0, 4, 6]]),  # the last window flush with the end
        (SIGNAL, (3,), (2,), [[0, 2, 4, 6, 7]]),
        (VOLUME, (2, 3, 4), (2, 3, 2), [[0, 2], [0, 3], [0, 2]]),
        (VOLUME, 2, 2, [[0, 2], [0, 2, 4], [0, 2, 4]]),  # tiles: each position's value is its tile's drop
    ],
)
def test_occlusion_on_a_linear_model_by_hand(size, window, stride, starts):
    x = _input(size)
    model = Linear(x.shape[1:])
    baseline = 0.25
    e = camkit.Occlusion(model, window=window, stride=stride, baseline=baseline, batch_size=5).explain(x, target=0)
    window = (window,) * len(size) if isinstance(window, int) else window
    total, count = torch.zeros(2, *size), torch.zeros(size)
    for box in _boxes(size, window, starts):
        # covering the window loses sum(w * (x - baseline)) over it, in every channel
        drop = (model.w[(slice(None), *box)] * (x[(slice(None), slice(None), *box)] - baseline)).flatten(1).sum(1)
        total[(slice(None), *box)] += drop.view(2, *(1,) * len(size))
        count[box] += 1
    assert e.raw.shape == (2, *size) and e.maps.shape == (2, *size)
    torch.testing.assert_close(e.raw, total / count, atol=1e-5, rtol=1e-5)


def test_occlusion_defaults_per_rank():
    occlusion = camkit.Occlusion(nn.Identity())
    assert occlusion.windows((224, 224)) == ((16, 16), (8, 8))  # an image: unchanged
    assert occlusion.windows((1000,)) == ((32,), (16,))  # a signal: ceil(T / 32)
    assert occlusion.windows((16, 112, 112)) == ((4, 28, 28), (2, 14, 14))  # ceil(S / 4): 7 per axis
    assert occlusion.windows((4, 8, 8)) == ((1, 2, 2), (1, 1, 1))
    assert default_window((5,)) == (1,) and default_window((3, 3, 3)) == (1, 1, 1)
    # 7 window positions per axis of a volume, 343 forwards
    assert camkit.Occlusion(nn.Identity()).windows((96, 96, 96)) == ((24, 24, 24), (12, 12, 12))


def test_occlusion_default_runs_on_small_signals_and_volumes():
    for n, size, forwards in ((1, (16,), 16), (3, (4, 8, 8), 4 * 7 * 7)):
        model = RankNet(n).eval()
        x = rank_input(n, batch=1)
        calls: list[int] = []
        handle = model.register_forward_hook(lambda m, i, o, calls=calls: calls.append(i[0].shape[0]))
        try:
            e = camkit.Occlusion(model, batch_size=1000).explain(x, target=2)
        finally:
            handle.remove()
        assert e.maps.shape == (1, *size)
        assert sum(calls) == 1 + forwards  # the plain forward and one per window position


def test_occlusion_refuses_windows_that_do_not_fit_the_rank():
    x = _input(VOLUME, batch=1)
    model = Linear(x.shape[1:])
    with pytest.raises(camkit.InvalidInputError, match=r"window \(8, 8, 8\) does not fit .*\(D, H, W\) = \(4, 6, 6\)"):
        camkit.Occlusion(model, window=8).explain(x)
    with pytest.raises(camkit.InvalidInputError, match=r"3 spatial axes \(D, H, W\).*window=\(4, 4, 4\)"):
        camkit.Occlusion(model, window=(4, 4)).explain(x)
    with pytest.raises(camkit.InvalidInputError, match=r"1 spatial axis \(T\)"):
        camkit.Occlusion(Linear((2, 10)), stride=(1, 1)).explain(_input(SIGNAL, batch=1))
    with pytest.raises(camkit.InvalidInputError, match="positive int"):
        camkit.Occlusion(model, window=(2, 0, 2))


# --- RISE -------------------------------------------------------------------------------------


def test_rise_masks_of_a_signal_by_hand():
    # 2 cells on 4 samples: cells of 2, the grid [1, 0] is upsampled linearly to 6 samples at
    # (j + 0.5) / 3 - 0.5 = -1/3 (clamped), 0, 1/3, 2/3, 1, 4/3: [1, 1, 2/3, 1/3, 0, 0].
    grid = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    masks = rise_masks(grid, torch.tensor([[0], [1]]), (4,))
    torch.testing.assert_close(masks, torch.tensor([[1.0, 1.0, 2 / 3, 1 / 3], [1.0, 2 / 3, 1 / 3, 0.0]]))


def test_rise_masks_of_a_volume_shift_each_axis():
    size = (4, 6, 6)
    grids = torch.rand(5, 2, 3, 3, generator=torch.Generator().manual_seed(0))
    shifts = torch.tensor([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]])
    masks = rise_masks(grids, shifts, size)
    assert masks.shape == (5, *size)
    # cells ceil(4 / 2) = 2, ceil(6 / 3) = 2, 2: each grid upsampled trilinearly to 3 x 4 x 4 cells
    big = F.interpolate(grids[:, None], size=(6, 8, 8), mode="trilinear", align_corners=False)[:, 0]
    for i, (a, b, c) in enumerate(shifts.tolist()):
        torch.testing.assert_close(masks[i], big[i, a : a + 4, b : b + 6, c : c + 6])
    # a grid that varies along depth only: a shift in height or width changes nothing
    depth = torch.tensor([1.0, 0.0]).view(1, 2, 1, 1).expand(3, 2, 3, 3)
    ramp = rise_masks(depth, torch.tensor([[0, 0, 0], [0, 1, 1], [1, 0, 0]]), size)
    torch.testing.assert_close(ramp[0], ramp[1])
    # 2 -> 6 frames linearly: [1, 1, 2/3, 1/3, 0, 0], cropped to 4 from frame 0 or 1
    torch.testing.assert_close(ramp[0, :, 0, 0], torch.tensor([1.0, 1.0, 2 / 3, 1 / 3]))
    torch.testing.assert_close(ramp[2, :, 0, 0], torch.tensor([1.0, 2 / 3, 1 / 3, 0.0]))
    with pytest.raises(camkit.InvalidInputError, match=r"shifts \[N, 3\]"):
        rise_masks(grids, shifts[:, :2], size)


@pytest.mark.parametrize(("size", "grid"), [(SIGNAL, 4), (VOLUME, (2, 3, 2))])
def test_rise_plan_per_axis_and_its_formula(size, grid):
    x = _input(size, channels=3)
    model = Linear(x.shape[1:])
    explainer = camkit.RISE(model, masks=9, seed=2, grid=grid, batch_size=4)
    grids, shifts = explainer._plan(size)
    cells = (grid,) * len(size) if isinstance(grid, int) else grid
    assert grids.shape == (9, *cells) and shifts.shape == (9, len(size))
    for axis, (length, g) in enumerate(zip(size, cells)):
        assert 0 <= int(shifts[:, axis].min()) and int(shifts[:, axis].max()) < -(-length // g)
    masks = rise_masks(grids, shifts, size)
    got = explainer.explain(x, target=torch.tensor([0, 1])).raw
    expected = torch.zeros(2, *size)
    for b, cls in enumerate([0, 1]):
        for i in range(9):
            expected[b] += model(x[b : b + 1] * masks[i]).softmax(dim=1)[0, cls] * masks[i]
    torch.testing.assert_close(got, expected / (9 * 0.5), atol=1e-5, rtol=1e-5)


def test_rise_grid_must_match_the_rank():
    with pytest.raises(camkit.InvalidInputError, match=r"grid=\(7, 7\) has 2 entries, but the input has 3 spatial axes"):
        camkit.RISE(Linear((2, *VOLUME)), masks=4, grid=(7, 7)).explain(_input(VOLUME))


# --- region methods ---------------------------------------------------------------------------


def test_grid_regions_per_axis():
    assert grid_regions((5,), 2).tolist() == [0, 0, 0, 1, 1]
    ids = grid_regions((2, 3, 4), (2, 1, 2))
    assert ids.shape == (2, 3, 4)
    expected = torch.tensor([[0, 0, 1, 1]] * 3)
    assert torch.equal(ids[0], expected) and torch.equal(ids[1], expected + 2)
    with pytest.raises(camkit.InvalidInputError, match="cells"):
        grid_regions((4, 4, 4), (2, 2))


@pytest.mark.parametrize(("size", "cells"), [(SIGNAL, 4), (VOLUME, (2, 3, 1)), (VOLUME, 2)])
def test_feature_ablation_by_hand_with_cells_per_axis(size, cells):
    x = _input(size)
    model = Linear(x.shape[1:])
    e = camkit.FeatureAblation(model, cells=cells, baseline=0.5, batch_size=3).explain(x, target=0)
    counts = (cells,) * len(size) if isinstance(cells, int) else cells
    ids = e.extras["regions"]
    assert ids.shape == (2, *size) and e.extras["evaluated"] == 2 * torch.Size(counts).numel()
    expected = torch.zeros(2, *size)
    for cell in itertools.product(*(range(c) for c in counts)):
        # the cell's box: position i of an axis of length S cut in c cells is in cell i * c // S
        box = tuple(
            slice(min(i for i in range(s) if i * c // s == k), max(i for i in range(s) if i * c // s == k) + 1)
            for s, c, k in zip(size, counts, cell)
        )
        drop = (model.w[(slice(None), *box)] * (x[(slice(None), slice(None), *box)] - 0.5)).flatten(1).sum(1)
        expected[(slice(None), *box)] = drop.view(2, *(1,) * len(size))
    torch.testing.assert_close(e.raw, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("size", [SIGNAL, VOLUME])
@pytest.mark.parametrize(
    "make",
    [
        # 2 regions of a signal: every coalition; 8 of a volume: 30 sampled ones
        lambda m, base: camkit.KernelShap(m, cells=2, samples=30, seed=1, baseline=base),
        lambda m, base: camkit.ShapleyValueSampling(m, cells=2, samples=2, seed=1, baseline=base),
        lambda m, base: camkit.Lime(m, cells=2, samples=40, seed=1, baseline=base),
    ],
    ids=["kernelshap", "shapleyvaluesampling", "lime"],
)
def test_shapley_and_lime_exact_on_an_additive_model(size, make):
    # additive game: every estimator recovers each region's own terms, from any coalitions
    x = _input(size)
    model = Additive(x.shape[1:])
    baseline = torch.linspace(-1, 1, 2 * torch.Size(size).numel()).view(2, *size)  # [C, *S]
    e = make(model, baseline).explain(x, target=0)
    ids = e.extras["regions"]
    m = int(ids.max()) + 1
    assert m == 2 ** len(size)
    terms = (model.w * (x**2 - baseline**2)).sum(1)  # [B, *S]
    for b in range(2):
        exact = torch.stack([terms[b][ids[b] == r].sum() for r in range(m)])
        torch.testing.assert_close(e.extras["values"][b], exact, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(e.raw[b], exact[ids[b]], atol=1e-4, rtol=1e-4)


def test_kernel_shap_exact_by_enumeration_on_a_volume():
    # 4 regions (2 x 2 in height and width, the whole depth): samples >= 2^4 - 2 uses every
    # coalition with its kernel weight, giving the exact Shapley values of the model's
    # (non-additive) game
    model = RankNet(3).eval()
    x = rank_input(3, batch=1)
    ids = grid_regions(x.shape[2:], (1, 2, 2))
    e = camkit.KernelShap(model, regions=ids, samples=14).explain(x, target=1)
    assert e.extras["evaluated"] == 16
    value = {}
    with torch.no_grad():
        for z in itertools.product([0, 1], repeat=4):
            value[z] = model(x * torch.tensor(z, dtype=torch.float32)[ids])[0, 1].double()
    exact = torch.zeros(4, dtype=torch.float64)
    for z, v in value.items():
        for i in range(4):
            if not z[i]:
                s = sum(z)
                with_i = tuple(1 if j == i else z[j] for j in range(4))
                exact[i] += math.factorial(s) * math.factorial(3 - s) / math.factorial(4) * (value[with_i] - v)
    assert exact.abs().max() > 1e-3  # a game worth checking
    torch.testing.assert_close(e.extras["values"][0].double(), exact, atol=1e-4, rtol=0)


def test_region_ids_given_per_rank():
    x = _input(SIGNAL)
    model = Linear(x.shape[1:])
    ids = torch.tensor([5, 5, 5, 9, 9, 9, 9, 1, 1, 1])  # [T], the same for both samples
    e = camkit.FeatureAblation(model, regions=ids).explain(x, target=1)
    # score 1 is -sum(x): removing a region (baseline 0) changes it by +sum(x) over the region
    for b in range(2):
        for old, new in ((1, 0), (5, 1), (9, 2)):
            assert e.extras["values"][b, new].item() == pytest.approx(-x[b][:, ids == old].sum().item(), abs=1e-5)
    per_sample = camkit.FeatureAblation(model, regions=ids.expand(2, 10)).explain(x, target=1)
    torch.testing.assert_close(per_sample.raw, e.raw, atol=0, rtol=0)
    with pytest.raises(camkit.InvalidInputError, match=r"\[D, H, W\] or \[B, D, H, W\]"):
        camkit.FeatureAblation(Linear((2, *VOLUME)), regions=torch.zeros(6, 6, dtype=torch.long)).explain(_input(VOLUME))
    with pytest.raises(camkit.InvalidInputError, match=r"\[C, T\], \[1, C, T\] or \[B, C, T\]"):
        camkit.FeatureAblation(model, cells=2, baseline=torch.zeros(2, 4)).explain(x)
    with pytest.raises(camkit.InvalidInputError, match=r"cells=\(2, 2\) has 2 entries, but the input has 1 spatial axis"):
        camkit.FeatureAblation(model, cells=(2, 2)).explain(x)


def test_region_defaults_per_rank():
    region = camkit.FeatureAblation(nn.Identity())
    assert region.grid_cells((1000,)) == (64,)  # 64 regions on every rank
    assert region.grid_cells((224, 224)) == (8, 8)
    assert region.grid_cells((16, 112, 112)) == (4, 4, 4)
    assert region.grid_cells((10,)) == (10,) and region.grid_cells((2, 8, 8)) == (2, 4, 4)  # at most the length


def test_slic_supervoxels_on_a_synthetic_volume():
    x = torch.zeros(2, 1, 8, 8, 8)
    x[:, :, 4:] = 1.0  # sample 0: an edge across depth
    x[1] = x[1].transpose(1, 3).clone()  # sample 1: the same edge across width
    ids = superpixel_regions(x, "slic", n_segments=8)
    assert ids.shape == (2, 8, 8, 8) and ids.dtype == torch.long
    assert not set(ids[0, :4].unique().tolist()) & set(ids[0, 4:].unique().tolist())
    assert not set(ids[1, ..., :4].unique().tolist()) & set(ids[1, ..., 4:].unique().tolist())
    assert len(ids[0].unique()) > 2  # supervoxels, not just the two halves
    model = Linear((1, 8, 8, 8))
    e = camkit.FeatureAblation(model, regions="slic", segments={"n_segments": 8}).explain(x, target=0)
    relabelled = e.extras["regions"]
    for b in range(2):
        for r in relabelled[b].unique().tolist():
            inside = relabelled[b] == r
            drop = (model.w[0] * x[b, 0])[inside].sum()
            assert e.raw[b][inside].unique().numel() == 1
            assert e.raw[b][inside][0].item() == pytest.approx(drop.item(), abs=1e-5)


def test_superpixels_refuse_signals_and_2d_only_algorithms_on_volumes():
    with pytest.raises(camkit.InvalidInputError, match=r"not signals.*regions='grid' with cells=N"):
        camkit.Lime(Linear((2, *SIGNAL)), regions="slic").explain(_input(SIGNAL))
    for method in ("quickshift", "felzenszwalb"):
        with pytest.raises(camkit.InvalidInputError, match=rf"'{method}' segments 2-D images only.*'slic'"):
            superpixel_regions(torch.rand(1, 3, 4, 8, 8), method)


# --- every method, every rank -----------------------------------------------------------------

FACTORIES = {
    "occlusion": lambda m: camkit.Occlusion(m, window=2, stride=2, batch_size=7),
    "rise": lambda m: camkit.RISE(m, masks=24, seed=0, grid=3, batch_size=7),
    "featureablation": lambda m: camkit.FeatureAblation(m, cells=2, batch_size=7),
    "shapleyvaluesampling": lambda m: camkit.ShapleyValueSampling(m, samples=2, cells=2, batch_size=7),
    "kernelshap": lambda m: camkit.KernelShap(m, samples=10, cells=2, batch_size=7),
    "lime": lambda m: camkit.Lime(m, samples=10, cells=2, batch_size=7),
}


@pytest.mark.heavy
@pytest.mark.parametrize("spatial_dims", [1, 3])
@pytest.mark.parametrize("key", sorted(FACTORIES))
def test_batch_equals_one_by_one(key, spatial_dims):
    model = RankNet(spatial_dims).eval()
    x = rank_input(spatial_dims)
    target = torch.tensor([0, 3, 1])
    explainer = FACTORIES[key](model)
    whole = explainer.explain(x, target=target)
    assert whole.maps.shape == x[:, 0].shape and whole.raw.shape == x[:, 0].shape
    assert not whole.flat.any()
    for b in range(3):
        one = explainer.explain(x[b : b + 1], target=target[b : b + 1])
        torch.testing.assert_close(one.raw, whole.raw[b : b + 1], atol=1e-5, rtol=1e-5)


@pytest.mark.heavy
@pytest.mark.parametrize("spatial_dims", [1, 3])
def test_every_method_on_the_device(device, spatial_dims):
    # the windows, masks and region ids are built on the host and moved once: same maps on a GPU
    model = RankNet(spatial_dims).eval()
    x = rank_input(spatial_dims, batch=2)
    for key, make in sorted(FACTORIES.items()):
        here = make(model).explain(x, target=1).raw
        there = make(model.to(device)).explain(x.to(device), target=1)
        model.cpu()
        assert there.raw.device.type == device.type, key
        torch.testing.assert_close(there.raw.cpu(), here, atol=1e-4, rtol=1e-3, msg=key)
