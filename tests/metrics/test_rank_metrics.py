"""The metrics on signals [B, C, T] and volumes [B, C, D, H, W]: values by hand and by formula.

Deletion and insertion, the baselines, ROAD's imputation, the pointing games and the sanity
check run through the same code on every rank; the 2-D cases live in the other test files
of this folder and are unchanged.
"""

from __future__ import annotations

import math

import pytest
import torch
from models import RankNet, rank_input
from torch import Tensor, nn

import camkit
from camkit.errors import InvalidInputError
from camkit.metrics import (
    auc,
    average_drop,
    blur_baseline,
    deletion_curve,
    energy_pointing_game,
    insertion_curve,
    noisy_linear_imputation,
    pointing_game,
    randomization_check,
    region_masks,
    road_curve,
    spearman,
    ssim,
)


class SumNet(nn.Module):
    """Score of class 0: the sum of every value of the input, whatever its rank."""

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(1).sum(dim=1)[:, None]


class LinearNet(nn.Module):
    """Score of class 0: ``sum_c sum_p weight[c, p] * x[c, p] + 0.5`` over every position p."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.clone())

    def forward(self, x: Tensor) -> Tensor:
        return ((x * self.weight).flatten(1).sum(dim=1) + 0.5)[:, None]


def expected_deletion(weight: Tensor, x: Tensor, maps: Tensor, counts: list[int], insert: bool = False) -> list:
    """The linear model's score with the top ``count`` positions of each map set to 0 (kept, for insertion).

    The order is written out: map value highest first, equal values in the flattened (row-major) order.
    """
    rows = []
    for image, m in zip(x, maps):
        values = m.flatten().tolist()
        order = sorted(range(len(values)), key=lambda p: (-values[p], p))
        contribution = (weight * image).flatten(1).sum(dim=0)  # [N]: every position's share of the score
        row = []
        for count in counts:
            chosen = set(order[:count])
            row.append(0.5 + sum(float(contribution[p]) for p in range(len(values)) if (p in chosen) == insert))
        rows.append(row)
    return rows


# ---------------------------------------------------------------- deletion and insertion


def test_deletion_and_insertion_of_a_signal_by_hand():
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]]])  # B=1, C=2, T=4
    maps = torch.tensor([[0.1, 0.4, 0.3, 0.2]])  # order: t1, t2, t3, t0
    fractions, scores = deletion_curve(SumNet(), x, maps, 0, steps=4)
    assert fractions.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert scores[0].tolist() == [110.0, 88.0, 55.0, 11.0, 0.0]  # both channels of a step go together
    _, inserted = insertion_curve(SumNet(), x, maps, 0, steps=4)
    assert inserted[0].tolist() == [0.0, 22.0, 55.0, 99.0, 110.0]
    assert auc(fractions, scores).tolist() == pytest.approx([0.25 * (110 / 2 + 88 + 55 + 11)])


def test_deletion_of_a_volume_by_hand_ties_in_row_major_order():
    x = torch.arange(1.0, 9.0).view(1, 1, 2, 2, 2)  # voxel (d, h, w) holds 1 + 4d + 2h + w
    flat_map = torch.ones(1, 2, 2, 2)  # all tied: the first slice (d = 0: 1 + 2 + 3 + 4) goes first
    _, scores = deletion_curve(SumNet(), x, flat_map, 0, steps=2)
    assert scores[0].tolist() == [36.0, 26.0, 0.0]
    peak = torch.zeros(1, 2, 2, 2)
    peak[0, 1, 1, 1] = 1.0  # voxel 8 first, then the rest in row-major order
    _, scores = deletion_curve(SumNet(), x, peak, 0, steps=8)
    assert scores[0].tolist() == [36.0, 28.0, 27.0, 25.0, 22.0, 18.0, 13.0, 7.0, 0.0]
    _, inserted = insertion_curve(SumNet(), x, peak, 0, steps=8)
    assert inserted[0].tolist() == [0.0, 8.0, 9.0, 11.0, 14.0, 18.0, 23.0, 29.0, 36.0]


@pytest.mark.parametrize("spatial", [(7,), (3, 2, 4)], ids=["signal", "volume"])
def test_curves_of_a_linear_model_follow_the_formula(spatial):
    g = torch.Generator().manual_seed(len(spatial))
    x = torch.randn(3, 2, *spatial, generator=g, dtype=torch.float64)
    weight = torch.randn(2, *spatial, generator=g, dtype=torch.float64)
    maps = torch.randint(0, 4, (3, *spatial), generator=g).double()  # many ties
    n, steps = math.prod(spatial), 5
    counts = [math.ceil(k * n / steps) for k in range(steps + 1)]
    model = LinearNet(weight).double()
    fractions, deleted = deletion_curve(model, x, maps, 0, steps=steps, chunk_size=4)
    _, inserted = insertion_curve(model, x, maps, 0, steps=steps, chunk_size=1)
    torch.testing.assert_close(fractions, torch.tensor(counts, dtype=torch.float64) / n)
    torch.testing.assert_close(deleted, torch.tensor(expected_deletion(weight, x, maps, counts), dtype=torch.float64))
    torch.testing.assert_close(
        inserted, torch.tensor(expected_deletion(weight, x, maps, counts, insert=True), dtype=torch.float64)
    )
    # A batch gives what its images give one by one.
    alone = torch.cat([deletion_curve(model, x[i : i + 1], maps[i : i + 1], 0, steps=steps)[1] for i in range(3)])
    torch.testing.assert_close(deleted, alone)


def test_baselines_of_each_rank():
    x = torch.tensor([[[1.0, 3.0, 5.0, 7.0]]])  # mean 4
    maps = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    _, scores = deletion_curve(SumNet(), x, maps, 0, steps=4, baseline="mean")
    assert scores[0].tolist() == [16.0, 19.0, 20.0, 19.0, 16.0]
    _, scores = deletion_curve(SumNet(), x, maps, 0, steps=1, baseline=torch.tensor([[2.0]]))  # [C, 1]
    assert scores[0].tolist() == [16.0, 8.0]
    volume = torch.stack([torch.zeros(2, 2, 2), torch.ones(2, 2, 2) * 6.0])[None]  # C=2: channel means 0 and 6
    _, scores = deletion_curve(SumNet(), volume, torch.ones(1, 2, 2, 2), 0, steps=1, baseline="mean")
    assert scores[0].tolist() == [48.0, 48.0]
    _, scores = deletion_curve(SumNet(), volume, torch.ones(1, 2, 2, 2), 0, steps=1, baseline=torch.ones(2, 1, 1, 1))
    assert scores[0].tolist() == [48.0, 16.0]
    with pytest.raises(InvalidInputError, match=r"\[C, 1, 1, 1\], \[C, D, H, W\] or \[B, C, D, H, W\]"):
        deletion_curve(SumNet(), volume, torch.ones(1, 2, 2, 2), baseline=torch.zeros(3, 1, 1))
    with pytest.raises(InvalidInputError, match=r"\[C, 1\], \[C, T\] or \[B, C, T\]"):
        deletion_curve(SumNet(), x, maps, baseline=torch.zeros(2, 4))


def test_blur_of_a_signal_and_a_volume_is_the_separable_gaussian():
    sigma, radius = 1.0, 3
    taps = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-0.5 * (taps / sigma) ** 2)
    kernel = kernel / kernel.sum()
    signal = torch.zeros(1, 1, 11, dtype=torch.float64)
    signal[..., 5] = 1.0
    torch.testing.assert_close(blur_baseline(signal, sigma)[0, 0, 2:9], kernel)
    volume = torch.zeros(1, 1, 9, 9, 9, dtype=torch.float64)
    volume[..., 4, 4, 4] = 1.0
    blurred = blur_baseline(volume, sigma)[0, 0, 1:8, 1:8, 1:8]
    torch.testing.assert_close(blurred, kernel[:, None, None] * kernel[None, :, None] * kernel[None, None, :])
    constant = torch.full((2, 3, 3, 4, 5), 0.7)
    torch.testing.assert_close(blur_baseline(constant), constant)  # edges replicated: nothing leaks in
    # The "blur" baseline of deletion is this blur: the last step scores the blurred volume.
    x = torch.rand(1, 1, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    _, scores = deletion_curve(SumNet(), x, x[:, 0], 0, steps=2, baseline="blur")
    torch.testing.assert_close(scores[0, -1], blur_baseline(x).sum())


def test_average_drop_of_a_volume_by_hand():
    x = torch.ones(2, 1, 2, 2, 2)
    maps = torch.zeros(2, 2, 2, 2)
    maps[0, 0] = 1.0  # half the voxels shown: O = 4 of Y = 8
    maps[1] = 0.75
    assert average_drop(SumNet(), x, maps, softmax=False).tolist() == [0.5, 0.25]


def test_maps_of_the_wrong_rank_are_refused_with_what_to_pass():
    volume = torch.rand(2, 1, 3, 4, 4)
    with pytest.raises(InvalidInputError, match=r"maps must be \[B, D, H, W\] for inputs \[B, C, D, H, W\]"):
        deletion_curve(SumNet(), volume, torch.rand(2, 4, 4))  # an image's maps for a volume
    with pytest.raises(InvalidInputError, match=r"maps\[:, 0\]"):
        deletion_curve(SumNet(), volume, torch.rand(2, 1, 3, 4, 4))
    with pytest.raises(InvalidInputError, match=r"maps\[None\]"):
        road_curve(SumNet(), volume[:1], torch.rand(3, 4, 4))
    with pytest.raises(InvalidInputError, match=r"expected \[2, 3, 4, 4\].*upsample_maps"):
        insertion_curve(SumNet(), volume, torch.rand(2, 3, 2, 2))
    with pytest.raises(InvalidInputError, match=r"maps must be \[B, T\] for inputs \[B, C, T\]"):
        deletion_curve(SumNet(), torch.rand(2, 1, 8), torch.rand(2, 1, 8, 1))
    with pytest.raises(InvalidInputError, match="no pixels"):
        deletion_curve(SumNet(), torch.rand(2, 1, 0, 4, 4), torch.rand(2, 0, 4, 4))


# ---------------------------------------------------------------- ROAD


def test_imputation_of_a_signal_is_linear_interpolation():
    x = torch.tensor([[[0.0, 4.0, 8.0, 2.0]]], dtype=torch.float64)

    def removed(*positions: int) -> Tensor:
        mask = torch.zeros(1, 4, dtype=torch.bool)
        mask[0, list(positions)] = True
        return mask

    assert noisy_linear_imputation(x, removed(1), noise=0.0)[0, 0].tolist() == pytest.approx([0.0, 4.0, 8.0, 2.0])
    two = noisy_linear_imputation(x, removed(1, 2), noise=0.0)[0, 0]  # from 0 at t0 to 2 at t3
    torch.testing.assert_close(two, torch.tensor([0.0, 2 / 3, 4 / 3, 2.0], dtype=torch.float64))
    assert noisy_linear_imputation(x, removed(0), noise=0.0)[0, 0].tolist() == pytest.approx([4.0, 4.0, 8.0, 2.0])
    assert torch.equal(x, torch.tensor([[[0.0, 4.0, 8.0, 2.0]]], dtype=torch.float64))  # x untouched


def test_imputation_of_a_volume_uses_the_six_face_neighbours():
    x = torch.zeros(1, 2, 3, 3, 3, dtype=torch.float64)
    x[0, 0, 0, 1, 1] = 6.0  # a face neighbour of the centre: weight 1/6
    x[0, 0, 1, 2, 1] = 12.0  # another face neighbour
    x[0, 0, 0, 0, 1] = 100.0  # an edge neighbour: not a neighbour here
    x[0, 1] = 5.0  # the second channel is constant
    centre = torch.zeros(1, 3, 3, 3, dtype=torch.bool)
    centre[0, 1, 1, 1] = True
    out = noisy_linear_imputation(x, centre, noise=0.0)
    assert out[0, :, 1, 1, 1].tolist() == pytest.approx([(6.0 + 12.0) / 6, 5.0])
    assert torch.equal(out.masked_fill(centre[:, None], 0.0), x.masked_fill(centre[:, None], 0.0))
    # A corner voxel has three face neighbours inside: it takes their mean.
    x = torch.zeros(1, 1, 3, 3, 3, dtype=torch.float64)
    x[0, 0, 1, 0, 0], x[0, 0, 0, 1, 0], x[0, 0, 1, 1, 1] = 9.0, 3.0, 50.0
    corner = torch.zeros(1, 3, 3, 3, dtype=torch.bool)
    corner[0, 0, 0, 0] = True
    assert noisy_linear_imputation(x, corner, noise=0.0)[0, 0, 0, 0, 0].item() == pytest.approx(4.0)
    # Two removed voxels in a row along W between a 0 and a 3 (their other neighbours all 0):
    # v1 = (0 + v2 + 0 * 4) / 6 and v2 = (v1 + 3) / 6, so v1 = 3 / 35 and v2 = 18 / 35.
    x = torch.zeros(1, 1, 3, 3, 4, dtype=torch.float64)
    x[0, 0, 1, 1, 3] = 3.0
    pair = torch.zeros(1, 3, 3, 4, dtype=torch.bool)
    pair[0, 1, 1, 1:3] = True
    filled = noisy_linear_imputation(x, pair, noise=0.0)[0, 0, 1, 1]
    torch.testing.assert_close(filled, torch.tensor([0.0, 3 / 35, 18 / 35, 3.0], dtype=torch.float64))


def test_imputation_of_a_batch_of_volumes_equals_one_by_one():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 2, 3, 4, 5, generator=g, dtype=torch.float64)
    removed = torch.rand(3, 3, 4, 5, generator=g) < 0.4
    together = noisy_linear_imputation(x, removed, noise=0.0)
    apart = torch.cat([noisy_linear_imputation(x[i : i + 1], removed[i : i + 1], noise=0.0) for i in range(3)])
    torch.testing.assert_close(together, apart)
    with pytest.raises(InvalidInputError, match=r"bool tensor \[3, 3, 4, 5\]"):
        noisy_linear_imputation(x, removed[:, 0])  # an image's mask for a volume


def test_road_curve_of_a_signal_by_hand():
    x = torch.tensor([[[1.0, 5.0, 3.0, 7.0]]])
    maps = torch.tensor([[0.0, 1.0, 0.0, 0.0]])  # order t1, then the ties t0, t2, t3
    fractions, morf = road_curve(SumNet(), x, maps, 0, fractions=[0.25, 0.5], noise=0.0)
    assert fractions.tolist() == [0.25, 0.5]
    # t1 <- (1 + 3) / 2 = 2: 13; then t0 and t1 together: v0 = v1, v1 = (v0 + 3) / 2 = 3: 16
    assert morf[0].tolist() == pytest.approx([13.0, 16.0])
    # LeRF from the bottom of the same ranking: t3 <- 3: 12; then t2, t3 <- 5: 16
    _, lerf = road_curve(SumNet(), x, maps, 0, fractions=[0.25, 0.5], order="lerf", noise=0.0)
    assert lerf[0].tolist() == pytest.approx([12.0, 16.0])


def test_road_curve_of_a_volume_by_hand():
    x = torch.zeros(2, 1, 3, 3, 3)
    x[:, 0, 0, 1, 1] = 6.0
    x[:, 0, 1, 2, 1] = 12.0
    x[1, 0, 1, 1, 1] = 30.0  # the second volume's centre is replaced by 3 as well
    maps = torch.zeros(2, 3, 3, 3)
    maps[:, 1, 1, 1] = 1.0
    fractions, scores = road_curve(SumNet(), x, maps, 0, fractions=[1 / 27], noise=0.0)
    assert fractions.tolist() == pytest.approx([1 / 27])
    assert scores[:, 0].tolist() == pytest.approx([21.0, 21.0])  # 6 + 12 + (6 + 12) / 6


# ---------------------------------------------------------------- pointing games


def volume_maps() -> Tensor:
    maps = torch.zeros(2, 2, 3, 3)
    maps[0, 1, 2, 0] = 1.0
    maps[1, 0, 0, 0] = 1.0
    return maps


def test_pointing_game_on_volumes_by_hand():
    maps = volume_maps()
    masks = torch.zeros(2, 2, 3, 3, dtype=torch.bool)
    masks[0, 1, 2, 0] = True  # the peak of map 0
    masks[1, 1, 1, 1] = True  # sqrt(3) voxels from the peak of map 1
    assert pointing_game(maps, masks).tolist() == [True, False]
    assert pointing_game(maps, masks, tolerance=1).tolist() == [True, False]
    assert pointing_game(maps, masks, tolerance=2).tolist() == [True, True]  # 3 <= 2 ** 2
    assert pointing_game(maps, masks[:, None], tolerance=2).tolist() == [True, True]  # [B, 1, D, H, W] masks
    face = torch.zeros(2, 2, 3, 3, dtype=torch.bool)
    face[:, 1, 0, 0] = True  # one voxel deeper than map 1's peak; map 0's peak is sqrt(4 + 0) = 2 from it
    assert pointing_game(maps, face, tolerance=1).tolist() == [False, True]
    assert pointing_game(maps, face, tolerance=2).tolist() == [True, True]
    nan = maps.clone()
    nan[0, 0, 0, 1] = float("nan")
    assert pointing_game(nan, masks).tolist() == [False, False]


def test_pointing_tolerance_in_3d_is_the_euclidean_ball():
    g = torch.Generator().manual_seed(3)
    maps = torch.rand(16, 3, 4, 5, generator=g)
    masks = torch.rand(16, 3, 4, 5, generator=g) < 0.05
    for tolerance in (0, 1, 2, 3):
        expected = []
        for m, region in zip(maps, masks):
            peak = divmod(int(m.argmax()), 20)
            peak = (peak[0], *divmod(peak[1], 5))
            inside = region.nonzero().tolist()
            expected.append(any(sum((a - b) ** 2 for a, b in zip(p, peak)) <= tolerance**2 for p in inside))
        assert 0 < sum(expected) < 16  # hits and misses at every tolerance, some on the ball's surface
        assert pointing_game(maps, masks, tolerance).tolist() == expected


def test_pointing_game_on_signals():
    maps = torch.tensor([[0.0, 0.2, 0.9, 0.1, 0.0], [0.5, 0.0, 0.0, 0.0, 0.1]])
    masks = torch.zeros(2, 5, dtype=torch.bool)
    masks[:, 3:5] = True
    assert pointing_game(maps, masks).tolist() == [False, False]
    assert pointing_game(maps, masks, tolerance=1).tolist() == [True, False]
    assert pointing_game(maps, masks, tolerance=3).tolist() == [True, True]
    assert energy_pointing_game(maps, masks).tolist() == pytest.approx([0.1 / 1.2, 0.1 / 0.6])


def test_energy_pointing_game_on_volumes_by_hand():
    maps = torch.arange(1.0, 19.0).view(1, 2, 3, 3)  # slice 0 holds 1..9 (45) of 171
    masks = torch.zeros(1, 2, 3, 3, dtype=torch.bool)
    masks[0, 0] = True
    assert energy_pointing_game(maps, masks).tolist() == pytest.approx([45 / 171])
    assert energy_pointing_game(maps, masks[:, None]).tolist() == pytest.approx([45 / 171])
    assert torch.isnan(energy_pointing_game(torch.zeros(1, 2, 3, 3), masks)).all()


def test_regions_of_the_wrong_rank_are_refused_with_what_to_pass():
    maps = torch.rand(2, 4, 3, 3)
    with pytest.raises(InvalidInputError, match=r"volumes or videos \[B, D, H, W\].*bool masks \[2, 4, 3, 3\].*images"):
        pointing_game(maps, torch.zeros(2, 3, 3, dtype=torch.bool))  # an image's masks for volume maps
    with pytest.raises(InvalidInputError, match=r"boxes \[B, 4\] are for images"):
        energy_pointing_game(maps, torch.tensor([[0, 0, 2, 2], [0, 0, 1, 1]]))
    with pytest.raises(InvalidInputError, match=r"expected the maps' \[2, 4, 3, 3\]"):
        pointing_game(maps, torch.zeros(2, 4, 3, 4, dtype=torch.bool))
    with pytest.raises(InvalidInputError, match=r"regions > 0\.5"):
        pointing_game(maps, torch.zeros(2, 4, 3, 3))
    with pytest.raises(InvalidInputError, match=r"regions.expand\(\[2, 4, 3, 3\]\)"):
        pointing_game(maps, torch.zeros(4, 3, 3, dtype=torch.bool))  # one volume's mask, no batch axis
    with pytest.raises(InvalidInputError, match=r"signals \[B, T\]"):
        pointing_game(torch.rand(2, 8), torch.zeros(2, 2, 8, dtype=torch.bool))
    with pytest.raises(InvalidInputError, match=r"maps must be \[B, T\] \(signals\), \[B, H, W\] \(images\)"):
        pointing_game(torch.rand(1, 2, 2, 2, 2), torch.zeros(1, 2, 2, 2, 2, dtype=torch.bool))
    assert region_masks(torch.ones(2, 1, 4, 3, 3, dtype=torch.bool), maps).shape == (2, 4, 3, 3)


# ---------------------------------------------------------------- sanity checks


def test_spearman_and_ssim_on_signals_and_volumes():
    from skimage.metrics import structural_similarity

    g = torch.Generator().manual_seed(0)
    signals = torch.rand(2, 16, generator=g)
    assert spearman(signals, signals**3).tolist() == pytest.approx([1.0, 1.0])
    assert spearman(signals, -signals).tolist() == pytest.approx([-1.0, -1.0])
    assert ssim(signals, signals).tolist() == pytest.approx([1.0, 1.0])
    noisy = (signals + 0.2 * torch.rand(2, 16, generator=g)).clamp(0, 1)
    direct = [structural_similarity(a.double().numpy(), b.double().numpy(), data_range=1.0, win_size=7)
              for a, b in zip(signals, noisy)]  # fmt: skip
    assert ssim(signals, noisy).tolist() == pytest.approx(direct, abs=1e-6)
    volumes = torch.rand(2, 4, 8, 8, generator=g)
    other = torch.rand(2, 4, 8, 8, generator=g)
    direct = [structural_similarity(a.double().numpy(), b.double().numpy(), data_range=1.0, win_size=3)
              for a, b in zip(volumes, other)]  # fmt: skip  # the shortest axis, 4, fits a window of 3
    assert ssim(volumes, other).tolist() == pytest.approx(direct, abs=1e-6)
    assert spearman(volumes, volumes.flip(-1)).shape == (2,)
    with pytest.raises(InvalidInputError, match="spearman"):
        ssim(torch.rand(1, 2, 8, 8), torch.rand(1, 2, 8, 8))  # a depth of 2 fits no window


@pytest.mark.parametrize("spatial_dims", [1, 3])
def test_randomization_check_on_signals_and_volumes(spatial_dims):
    model, x = RankNet(spatial_dims).eval(), rank_input(spatial_dims, batch=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = randomization_check(lambda m: camkit.GradCAM(m, "conv2"), model, x, keep_maps=True)
    assert res.layers == ("original", "fc", "conv2", "bn1", "conv1")
    assert res.spearman.shape == res.ssim.shape == (5, 2)
    assert res.maps is not None and res.maps.shape == (5, 2, *x.shape[2:])
    torch.testing.assert_close(res.maps[0], camkit.GradCAM(model, "conv2").explain(x).maps)
    assert bool((res.ssim[0] > 0.999).all()) and bool((res.spearman[0] > 0.999).all())
    assert not torch.equal(res.maps[-1], res.maps[0])  # every layer random: other maps
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the model is untouched


def test_randomization_check_refuses_maps_of_another_rank():
    model, x = RankNet(3).eval(), rank_input(3, batch=2)
    with pytest.raises(InvalidInputError, match=r"maps \[B, D, H, W\] with B=2"):
        randomization_check(lambda m: lambda x, t: torch.zeros(2, 8, 8), model, x)
