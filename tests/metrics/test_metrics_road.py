"""ROAD: noisy linear imputation solved by hand on tiny images, MoRF/LeRF curves, hygiene."""

from __future__ import annotations

import pytest
import torch
from models import TinyNet, tiny_input
from torch import nn

from camkit.errors import InvalidInputError, InvalidTargetError
from camkit.metrics import noisy_linear_imputation, road_curve


class SumNet(nn.Module):
    def forward(self, x):
        return x.sum(dim=(1, 2, 3))[:, None]


def mask_of(shape, *pixels):
    m = torch.zeros(shape, dtype=torch.bool)
    for p in pixels:
        m[p] = True
    return m


def test_centre_and_corner_are_weighted_neighbour_means(device):
    x = torch.tensor([[[[1.0, 2.0, 0.0], [4.0, 9.0, 6.0], [0.0, 0.0, 12.0]]]], device=device)
    centre = noisy_linear_imputation(x, mask_of((1, 3, 3), (0, 1, 1)).to(device), noise=0.0)
    # edge neighbours weigh 1/6, diagonal ones 1/12: (2 + 4 + 6 + 0) / 6 + (1 + 0 + 0 + 12) / 12
    assert centre[0, 0, 1, 1].item() == pytest.approx(2.0 + 13 / 12)
    corner = noisy_linear_imputation(x, mask_of((1, 3, 3), (0, 0, 0)).to(device), noise=0.0)
    # neighbours (0,1) and (1,0) at 1/6, (1,1) at 1/12; total weight 5/12: (2*2 + 2*4 + 9) / 5
    assert corner[0, 0, 0, 0].item() == pytest.approx(21 / 5)
    keep = ~mask_of((1, 3, 3), (0, 0, 0))
    assert torch.equal(corner[:, 0].cpu()[keep], x[:, 0].cpu()[keep])  # kept pixels untouched
    assert centre.device.type == device.type


def test_coupled_unknowns_are_solved_jointly():
    x = torch.tensor([[[[1.0, 0.0], [0.0, 5.0]]]])
    out = noisy_linear_imputation(x, mask_of((1, 2, 2), (0, 0, 1), (0, 1, 0)), noise=0.0)
    # v = (2*1 + 2*5 + v) / 5 for both unknowns, so v = 3
    assert out[0, 0].flatten().tolist() == pytest.approx([1.0, 3.0, 3.0, 5.0])


def test_channels_and_images_are_independent():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 1, 6, 5, generator=g)
    x = torch.cat([x, 10 * x], dim=1)
    removed = torch.rand(3, 6, 5, generator=g) < 0.5
    together = noisy_linear_imputation(x, removed, noise=0.0)
    assert torch.allclose(together[:, 1], 10 * together[:, 0], atol=1e-5)
    apart = torch.cat([noisy_linear_imputation(x[i : i + 1], removed[i : i + 1], noise=0.0) for i in range(3)])
    assert torch.allclose(together, apart, atol=1e-6)
    assert torch.equal(together.permute(0, 2, 3, 1)[~removed], x.permute(0, 2, 3, 1)[~removed])


def test_noise_has_the_requested_scale_and_is_reproducible():
    x = torch.zeros(1, 1, 40, 40)
    removed = torch.zeros(1, 40, 40, dtype=torch.bool)
    removed[:, ::2] = True  # 800 pixels, each with known neighbours all zero
    a = noisy_linear_imputation(x, removed, noise=0.5, generator=torch.Generator().manual_seed(1))
    b = noisy_linear_imputation(x, removed, noise=0.5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    filled = a[0, 0][removed[0]]
    assert filled.std().item() == pytest.approx(0.5, rel=0.1) and abs(filled.mean().item()) < 0.06
    assert torch.equal(a[0, 0][~removed[0]], torch.zeros(800))


def test_road_curve_morf_and_lerf_by_hand():
    x = torch.tensor([[[[1.0, 5.0, 3.0]]]])
    fr, morf = road_curve(SumNet(), x, x[:, 0], fractions=[1 / 3, 2 / 3], noise=0.0)
    # MoRF removes 5 (filled (1 + 3) / 2 = 2: sum 6), then 5 and 3 (both filled with 1: sum 3)
    assert fr.tolist() == pytest.approx([1 / 3, 2 / 3]) and morf[0].tolist() == pytest.approx([6.0, 3.0])
    _, lerf = road_curve(SumNet(), x, x[:, 0], fractions=[1 / 3, 2 / 3], order="lerf", noise=0.0)
    # LeRF removes 1 (filled with 5: sum 13), then 1 and 3 (both filled with 5: sum 15)
    assert lerf[0].tolist() == pytest.approx([13.0, 15.0])


def test_road_batch_chunks_and_hygiene():
    net, x = TinyNet(), tiny_input(3)
    net.train()
    flags = [m.training for m in net.modules()]
    state = {k: v.clone() for k, v in net.state_dict().items()}
    maps = torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(2))
    maps[2, 0, 0] = float("nan")
    _, batched = road_curve(net, x, maps, fractions=[0.25, 0.5], noise=0.0, chunk_size=4)
    singles = torch.cat([road_curve(net, x[i : i + 1], maps[i : i + 1], fractions=[0.25, 0.5], noise=0.0)[1] for i in range(2)])
    assert torch.allclose(batched[:2], singles, atol=1e-5)
    assert torch.isnan(batched[2]).all()
    other = road_curve(net, x, maps, fractions=[0.25, 0.5], noise=0.0, chunk_size=1)[1]
    assert torch.allclose(other[:2], batched[:2], atol=1e-5)
    assert [m.training for m in net.modules()] == flags
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    assert all(p.grad is None for p in net.parameters())


def test_road_errors():
    x = torch.rand(1, 1, 2, 2)
    with pytest.raises(InvalidInputError, match="nothing to impute"):
        road_curve(SumNet(), x, x[:, 0], fractions=[0.9])  # ceil(0.9 * 4) = 4 pixels
    with pytest.raises(InvalidInputError, match="'morf'"):
        road_curve(SumNet(), x, x[:, 0], order="top")
    with pytest.raises(InvalidInputError, match=r"bool tensor \[1, 2, 2\]"):
        noisy_linear_imputation(x, torch.ones(1, 2, 2))


class CountingSum(SumNet):
    def __init__(self) -> None:
        super().__init__()
        self.images = 0

    def forward(self, x):
        self.images += x.shape[0]
        return super().forward(x)


def test_road_runs_the_clean_images_only_to_find_the_top1_class():
    x = torch.rand(3, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    net = CountingSum()
    _, given = road_curve(net, x, x[:, 0], target=0, fractions=[0.25, 0.5], noise=0.0, chunk_size=4)
    assert net.images == 3 * 2
    net.images = 0
    _, found = road_curve(net, x, x[:, 0], fractions=[0.25, 0.5], noise=0.0, chunk_size=4)
    assert net.images == 3 + 3 * 2 and torch.equal(given, found)
    with pytest.raises(InvalidTargetError, match="out of range"):
        road_curve(net, x, x[:, 0], target=[0, 0, 1], fractions=[0.25])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy warnings from inside the reference
def test_imputation_matches_the_reference_imputer():
    road = pytest.importorskip("pytorch_grad_cam.metrics.road")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 12, 10, generator=g)
    removed = torch.rand(2, 12, 10, generator=g) < 0.6
    ours = noisy_linear_imputation(x, removed, noise=0.0)
    reference = road.NoisyLinearImputer(noise=0.0)
    theirs = torch.stack([reference(x[i], (~removed[i]).float()) for i in range(2)])
    assert torch.allclose(ours, theirs, atol=1e-5)
