"""Infidelity (equal to captum's on the same perturbations) and sensitivity-n (per sample, as the paper)."""

from __future__ import annotations

import pytest
import torch
from models import RankNet, TinyNet, rank_input, tiny_input
from torch import nn

from camkit.errors import InvalidInputError
from camkit.metrics import infidelity, sensitivity_n


class Weighted(nn.Module):
    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = w

    def forward(self, x):
        s = (x * self.w).flatten(1).sum(dim=1)
        return torch.stack([s, s * s], dim=1)


def test_infidelity_by_hand():
    w = torch.tensor([[[1.0, 2.0]]])
    net, x = Weighted(w), torch.tensor([[[1.0, 1.0]]])
    plan = torch.tensor([[[[1.0, 0.0]], [[0.0, 1.0]]]])  # [B=1, K=2, C=1, T=2]
    # class 0 is linear: drops 1 and 2; map (3, 0): I.a = 3 and 0 -> ((3-1)^2 + (0-2)^2) / 2 = 4
    assert infidelity(net, x, torch.tensor([[3.0, 0.0]]), 0, perturbations=plan).item() == pytest.approx(4.0)
    # normalized: beta = (3*1 + 0) / (9 + 0) = 1/3 -> ((1-1)^2 + (0-2)^2) / 2 = 2
    got = infidelity(net, x, torch.tensor([[3.0, 0.0]]), 0, perturbations=plan, normalize=True)
    assert got.item() == pytest.approx(2.0)
    # class 1 is (w.x)^2 = 9: drops 9 - 4 = 5 and 9 - 1 = 8 against I.a of the gradient 6 * w = (6, 12)
    assert infidelity(net, x, torch.tensor([[6.0, 12.0]]), 1, perturbations=plan).item() == pytest.approx(
        ((6 - 5) ** 2 + (12 - 8) ** 2) / 2
    )


@pytest.mark.parametrize("normalize", [False, True])
def test_infidelity_equals_captum_on_the_same_perturbations(normalize):
    captum_metrics = pytest.importorskip("captum.metrics")
    net, x = TinyNet().eval(), tiny_input(3)
    maps = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    target = torch.tensor([0, 4, 2])
    k = 5
    noise = 0.1 * torch.randn(3, k, 3, 8, 8, generator=torch.Generator().manual_seed(7))

    def perturb(inputs):  # captum repeats each input k times, sample-major: row b * k + j
        return noise.flatten(0, 1), inputs - noise.flatten(0, 1)

    theirs = captum_metrics.infidelity(net, perturb, x, maps, target=target, n_perturb_samples=k, normalize=normalize)
    ours = infidelity(net, x, maps, target, perturbations=noise, normalize=normalize, chunk_size=4)
    torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-4, atol=1e-6)
    # a map without channels reads the same on every channel
    flat = infidelity(net, x, maps[:, 0], target, perturbations=noise, normalize=normalize)
    same = infidelity(net, x, maps[:, :1].expand(3, 3, 8, 8), target, perturbations=noise, normalize=normalize)
    torch.testing.assert_close(flat, same)


def test_infidelity_draws_follow_the_generator():
    net, x = TinyNet(), tiny_input(2)
    maps = torch.rand(2, 8, 8, generator=torch.Generator().manual_seed(3))
    a = infidelity(net, x, maps, samples=4, generator=torch.Generator().manual_seed(1), chunk_size=3)
    b = infidelity(net, x, maps, samples=4, generator=torch.Generator().manual_seed(1), chunk_size=50)
    c = infidelity(net, x, maps, samples=4, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_sensitivity_n_by_hand_and_per_sample():
    w = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    net, x = Weighted(w), torch.ones(2, 1, 4)
    subsets = [torch.tensor([[[0], [1], [3]], [[0], [1], [2]]]), torch.tensor([[[0, 1], [2, 3], [1, 3]]] * 2)]
    exact = w[:, 0].expand(2, 4)
    sizes, r = sensitivity_n(net, x, exact, 0, subsets=subsets)
    assert sizes.tolist() == [1, 2] and r.flatten().tolist() == pytest.approx([1.0] * 4)
    # a reversed map: size 1 subsets {0}, {1}, {3} carry 4, 3, 1 against drops 1, 2, 4 -> -1
    _, r = sensitivity_n(net, x, exact.flip(1), 0, subsets=subsets)
    assert r[0, 0].item() == pytest.approx(-1.0)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_every_rank_and_batch_equals_one_by_one(dims):
    net, x = RankNet(dims), rank_input(dims, batch=2)
    maps = torch.rand(2, *x.shape[2:], generator=torch.Generator().manual_seed(4))
    noise = 0.1 * torch.randn(2, 3, *x.shape[1:], generator=torch.Generator().manual_seed(0))
    whole = infidelity(net, x, maps, perturbations=noise, chunk_size=4)
    alone = torch.cat([infidelity(net, x[i : i + 1], maps[i : i + 1], perturbations=noise[i : i + 1]) for i in range(2)])
    torch.testing.assert_close(whole, alone)
    n = maps[0].numel()
    subsets = [torch.rand(2, 4, n, generator=torch.Generator().manual_seed(s)).topk(s, dim=2).indices for s in (1, 3)]
    _, whole = sensitivity_n(net, x, maps, subsets=subsets, chunk_size=5)
    alone = torch.cat([sensitivity_n(net, x[i : i + 1], maps[i : i + 1], subsets=[s[i : i + 1] for s in subsets])[1] for i in range(2)])
    torch.testing.assert_close(whole, alone)


def test_default_sizes_and_errors():
    net, x = TinyNet(), tiny_input(1)
    sizes, r = sensitivity_n(net, x, torch.rand(1, 8, 8), samples=3, generator=torch.Generator().manual_seed(0))
    assert sizes.tolist()[0] == 1 and sizes.tolist()[-1] == int(0.8 * 64) and r.shape == (1, len(sizes))
    with pytest.raises(InvalidInputError, match="sizes"):
        sensitivity_n(net, x, torch.rand(1, 8, 8), sizes=[0])
    with pytest.raises(InvalidInputError, match="perturbations must be"):
        infidelity(net, x, torch.rand(1, 8, 8), perturbations=torch.zeros(1, 2, 8, 8))
    with pytest.raises(InvalidInputError, match="std"):
        infidelity(net, x, torch.rand(1, 8, 8), std=0.0)
