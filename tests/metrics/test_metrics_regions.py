"""Region perturbation, selectivity, IROF, sufficiency, ROAD's hit curve: by hand, every rank,
batch equals one by one, hygiene."""

from __future__ import annotations

import pytest
import torch
from models import RankNet, TinyNet, rank_input, tiny_input
from torch import nn

from camkit.errors import InvalidInputError, InvalidTargetError
from camkit.metrics import irof, region_perturbation, road_curve, selectivity, sufficiency
from camkit.metrics.regions import patch_labels


class Weighted(nn.Module):
    def __init__(self, w: torch.Tensor, bias: float = 0.0) -> None:
        super().__init__()
        self.w, self.bias = w, bias

    def forward(self, x):
        s = self.bias + (x * self.w).flatten(1).sum(dim=1)
        return torch.stack([s, -s], dim=1)


def test_patch_grid_every_rank():
    assert patch_labels((5,), 2, torch.device("cpu")).tolist() == [0, 0, 1, 1, 2]
    grid = patch_labels((3, 4), 2, torch.device("cpu"))
    assert grid.tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3]]
    cube = patch_labels((2, 2, 3), 2, torch.device("cpu"))
    assert cube.unique().tolist() == [0, 1] and cube[:, :, 2].eq(1).all()


def test_region_perturbation_by_hand():
    x = torch.arange(1.0, 17.0).view(1, 1, 4, 4)
    net = Weighted(torch.ones(1, 1, 4, 4))
    # 2x2 patches: sums 14, 22, 46, 54 -> morf removes 54, 46, 22, 14
    drops = region_perturbation(net, x, x[:, 0], 0, patch_size=2)
    assert drops.tolist() == [[54.0, 100.0, 122.0, 136.0]]
    assert region_perturbation(net, x, x[:, 0], 0, patch_size=2, order="lerf", regions=2).tolist() == [[14.0, 36.0]]
    # baseline 1: removing patch p changes its sum to 4
    assert region_perturbation(net, x, x[:, 0], 0, patch_size=2, regions=1, baseline=1.0).tolist() == [[50.0]]
    # per-step fill values: the first patch becomes 2, the second 0
    fill = torch.tensor([[2.0, 0.0]])
    assert region_perturbation(net, x, x[:, 0], 0, patch_size=2, regions=2, fill=fill).tolist() == [[46.0, 92.0]]
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    r1 = region_perturbation(net, x, x[:, 0], 0, patch_size=2, order="random", generator=g1)
    assert torch.equal(r1, region_perturbation(net, x, x[:, 0], 0, patch_size=2, order="random", generator=g2))
    assert r1[0, -1].item() == 136.0


def test_selectivity_by_hand_and_channel_maps():
    x = torch.arange(1.0, 17.0).view(1, 1, 4, 4)
    net = Weighted(torch.ones(1, 1, 4, 4))
    assert selectivity(net, x, x[:, 0], 0, patch_size=2).tolist() == [[82.0, 36.0, 14.0, 0.0]]
    x3 = x.expand(1, 3, 4, 4)
    net3 = Weighted(torch.ones(1, 3, 4, 4))
    channel_maps = torch.stack([x[:, 0], -x[:, 0], x[:, 0]], dim=1)  # channel sums: the map itself
    assert selectivity(net3, x3, channel_maps, 0, patch_size=2).tolist() == [[246.0, 108.0, 42.0, 0.0]]


def test_irof_by_hand():
    x = torch.tensor([[[4.0, 2.0, 1.0, 1.0]]])
    net = Weighted(torch.ones(1, 1, 4), bias=0.0)
    segments = torch.tensor([[0, 1, 2, 2]])
    # segment means of the map x: 4, 2, 1 -> removal leaves 4, 2, 0 of 8: curve 1, 1/2, 1/4, 0 over 0, 1/3, 2/3, 1
    area = (1 / 3) * ((1 + 0.5) / 2 + (0.5 + 0.25) / 2 + 0.25 / 2)
    got = irof(net, x, x[:, 0], 0, segments=segments, baseline=0.0, softmax=False)
    assert got.item() == pytest.approx(1 - area)
    # two samples with different segment counts: each uses its own K
    x2 = torch.cat([x, x])
    seg2 = torch.tensor([[0, 1, 2, 2], [0, 0, 1, 1]])
    both = irof(net, x2, x2[:, 0], 0, segments=seg2, baseline=0.0, softmax=False)
    assert both[0].item() == pytest.approx(1 - area)
    assert both[1].item() == pytest.approx(1 - 0.5 * ((1 + 2 / 8) / 2 + (2 / 8) / 2))
    with pytest.raises(InvalidInputError, match="segments must be"):
        irof(net, x, x[:, 0], 0, segments=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(InvalidInputError, match="SLIC"):
        irof(net, x, x[:, 0], 0)


def test_irof_default_slic_segments_on_images():
    net, x = TinyNet(), tiny_input(2).abs()
    maps = torch.rand(2, 8, 8, generator=torch.Generator().manual_seed(0))
    got = irof(net, x, maps)
    assert got.shape == (2,) and torch.isfinite(got).all()


def test_sufficiency_by_hand_and_seuclidean_as_scipy():
    scipy_distance = pytest.importorskip("scipy.spatial.distance")
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2))
    with torch.no_grad():
        net[1].weight.copy_(torch.eye(2))
        net[1].bias.zero_()
    x = torch.tensor([[[1.0, 0.0]], [[2.0, 0.0]], [[0.0, 1.0]], [[0.0, 3.0]]])  # classes 0, 0, 1, 1
    maps = torch.tensor([[0.0, 0.0], [0.1, 0.3], [0.2, 0.1], [2.0, 2.0]])
    d = torch.from_numpy(scipy_distance.cdist(maps.numpy(), maps.numpy(), "seuclidean"))
    threshold = 0.37  # scipy's distances: 0-1 0.362, 0-2 0.254, 1-2 0.256, 3 further than 2.9 from all
    near = (d <= threshold) & ~torch.eye(4, dtype=torch.bool)
    classes = torch.tensor([0, 0, 1, 1])
    want = [float((near[i] & (classes == classes[i])).sum() / near[i].sum()) if near[i].any() else 0.0 for i in range(4)]
    assert sufficiency(net, x, maps, threshold=threshold).tolist() == pytest.approx(want)
    assert want == [0.5, 0.5, 0.0, 0.0]


def test_road_hit_curve():
    net, x = TinyNet(), tiny_input(2)
    maps = torch.rand(2, 8, 8, generator=torch.Generator().manual_seed(0))
    _, hits = road_curve(net, x, maps, fractions=[0.0, 0.5], noise=0.0, hits=True)
    assert hits[:, 0].tolist() == [1.0, 1.0]  # nothing removed: the top-1 class is the target
    _, scores = road_curve(net, x, maps, fractions=[0.5], noise=0.0)
    out = net.eval()(x)
    assert set(hits[:, 1].tolist()) <= {0.0, 1.0} and scores.shape == (2, 1)
    with pytest.raises(InvalidTargetError, match="class targets"):
        road_curve(net, x, maps, lambda o: o[:, 0], fractions=[0.5], hits=True)
    del out


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_every_rank_and_batch_equals_one_by_one(dims):
    net, x = RankNet(dims), rank_input(dims, batch=2)
    maps = torch.rand(2, *x.shape[2:], generator=torch.Generator().manual_seed(4))
    segments = patch_labels(tuple(x.shape[2:]), 3, x.device).expand(2, *x.shape[2:])
    calls = (
        lambda xx, mm, ss, c: region_perturbation(net, xx, mm, patch_size=3, chunk_size=c),
        lambda xx, mm, ss, c: selectivity(net, xx, mm, patch_size=4, chunk_size=c),
        lambda xx, mm, ss, c: irof(net, xx, mm, segments=ss, chunk_size=c),
    )
    for call in calls:
        whole = call(x, maps, segments, 3)
        alone = torch.cat([call(x[i : i + 1], maps[i : i + 1], segments[i : i + 1], 64) for i in range(2)])
        torch.testing.assert_close(whole, alone)


def test_model_inputs_and_grads_untouched():
    net, x = TinyNet(), tiny_input(2)
    net.train()
    flags = [m.training for m in net.modules()]
    state = {k: v.clone() for k, v in net.state_dict().items()}
    maps = torch.rand(2, 8, 8, generator=torch.Generator().manual_seed(5))
    x0, maps0 = x.clone(), maps.clone()
    region_perturbation(net, x, maps, patch_size=4)
    selectivity(net, x, maps, patch_size=4)
    irof(net, x, maps, segments=patch_labels((8, 8), 4, x.device).expand(2, 8, 8))
    sufficiency(net, x, maps)
    assert [m.training for m in net.modules()] == flags
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    assert all(p.grad is None for p in net.parameters())
    assert torch.equal(x, x0) and torch.equal(maps, maps0)


def test_errors():
    net, x = TinyNet(), tiny_input(1)
    with pytest.raises(InvalidInputError, match="order"):
        region_perturbation(net, x, torch.rand(1, 8, 8), order="up")
    with pytest.raises(InvalidInputError, match="fill must be"):
        region_perturbation(net, x, torch.rand(1, 8, 8), patch_size=4, fill=torch.zeros(1, 3))
    with pytest.raises(InvalidInputError, match="distance"):
        sufficiency(net, x, torch.rand(1, 8, 8), distance="cosine")
