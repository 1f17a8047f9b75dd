"""Pixel flipping, faithfulness correlation and estimate, monotonicity and monotonicity correlation:
values by hand on linear models, every rank, batch equals one by one, channel maps, hygiene."""

from __future__ import annotations

import pytest
import torch
from models import RankNet, TinyNet, rank_input, tiny_input
from torch import nn

from camkit.errors import InvalidInputError
from camkit.metrics import (
    faithfulness_correlation,
    faithfulness_estimate,
    monotonicity,
    monotonicity_correlation,
    pixel_flipping,
)


class Weighted(nn.Module):
    """score = bias + sum_i w_i x_i over every element (any rank); class 1 scores the negative."""

    def __init__(self, w: torch.Tensor, bias: float = 0.0) -> None:
        super().__init__()
        self.w, self.bias = w, bias

    def forward(self, x):
        s = self.bias + (x * self.w).flatten(1).sum(dim=1)
        return torch.stack([s, -s], dim=1)


def test_pixel_flipping_by_hand():
    x = torch.tensor([[[1.0, 2.0, 4.0]]])
    net = Weighted(torch.ones(1, 1, 3))
    maps = torch.tensor([[0.1, 0.5, 0.9]])
    assert pixel_flipping(net, x, maps, 0).tolist() == [[3.0, 1.0, 0.0]]
    assert pixel_flipping(net, x, maps, 0, features_in_step=2).tolist() == [[1.0, 0.0]]
    assert pixel_flipping(net, x, maps, 0, baseline=1.0).tolist() == [[4.0, 3.0, 3.0]]
    # ties keep index order: equal values remove the first position first
    assert pixel_flipping(net, x, torch.ones(1, 3), 0).tolist() == [[6.0, 4.0, 0.0]]


def test_channel_maps_remove_single_elements():
    x = torch.tensor([[[1.0, 2.0], [10.0, 20.0]]])  # [1, 2 channels, T=2]
    net = Weighted(torch.ones(1, 2, 2))
    position = pixel_flipping(net, x, torch.tensor([[1.0, 0.0]]), 0)  # position 0 in both channels first
    assert position.tolist() == [[22.0, 0.0]]
    element = pixel_flipping(net, x, torch.tensor([[[0.0, 3.0], [1.0, 2.0]]]), 0)  # 2, then 20, then 10, then 1
    assert element.tolist() == [[31.0, 11.0, 1.0, 0.0]]


def test_faithfulness_estimate_by_hand():
    x = torch.ones(1, 1, 3)
    net = Weighted(torch.tensor([1.0, 2.0, 3.0]))
    # removal order by the map 3, 2, 1: features 0, 2, 1 drop the score by 1, 3, 2
    # pearson([3, 2, 1], [1, 3, 2]) = -1 / 2
    got = faithfulness_estimate(net, x, torch.tensor([[3.0, 1.0, 2.0]]), 0)
    assert got.item() == pytest.approx(-0.5)
    assert faithfulness_estimate(net, x, torch.tensor([[1.0, 2.0, 3.0]]), 0).item() == pytest.approx(1.0)
    # groups of two: {2, 1} then {0}: map sums 5, 1 and drops 5, 1
    assert faithfulness_estimate(net, x, torch.tensor([[1.0, 2.0, 3.0]]), 0, features_in_step=2).item() == (
        pytest.approx(1.0)
    )


def test_faithfulness_correlation_by_hand_with_given_subsets():
    x = torch.ones(1, 1, 4)
    net = Weighted(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    maps = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    subsets = torch.tensor([[[0, 1], [2, 3], [0, 3]]])
    # attribution sums 7, 3, 5; score drops 3, 7, 5: perfectly anti-correlated
    assert faithfulness_correlation(net, x, maps, 0, subsets=subsets).item() == pytest.approx(-1.0)
    # baseline 1.0 removes nothing from x = 1: the drops are constant and the correlation undefined
    assert torch.isnan(faithfulness_correlation(net, x, maps, 0, subsets=subsets, baseline=1.0)).all()


def test_faithfulness_correlation_fill_gives_each_run_its_own_value():
    x = torch.ones(2, 1, 4)
    net = Weighted(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    maps = torch.tensor([[4.0, 3.0, 2.0, 1.0], [1.0, 1.0, 2.0, 5.0]])
    subsets = torch.tensor([[[0, 1], [2, 3], [0, 3]]] * 2)
    # sample 0, run values 0, 0.5, 1: drops (1 + 2)(1 - 0) = 3, (3 + 4)(1 - 0.5) = 3.5, (1 + 4)(1 - 1) = 0
    # against sums 7, 3, 5; sample 1 with fill 0 everywhere: drops 3, 7, 5 against sums 2, 7, 6
    fill = torch.tensor([[0.0, 0.5, 1.0], [0.0, 0.0, 0.0]])
    got = faithfulness_correlation(net, x, maps, 0, subsets=subsets, fill=fill)
    def pearson(a, b):
        a, b = torch.tensor(a) - sum(a) / 3, torch.tensor(b) - sum(b) / 3
        return float((a * b).sum() / (a.norm() * b.norm()))
    assert got.tolist() == pytest.approx([pearson([7, 3, 5], [3, 3.5, 0]), pearson([2, 7, 6], [3, 7, 5])])
    assert torch.allclose(got[1], faithfulness_correlation(net, x[1:], maps[1:], 0, subsets=subsets[1:]))
    with pytest.raises(InvalidInputError, match=r"fill must be a tensor \[B, runs\]"):
        faithfulness_correlation(net, x, maps, 0, subsets=subsets, fill=fill[:, :2])


def test_faithfulness_correlation_draws_follow_the_generator_only():
    net, x = TinyNet(), tiny_input(2)
    maps = torch.rand(2, 8, 8, generator=torch.Generator().manual_seed(3))
    kw = dict(runs=6, subset_size=10)
    a = faithfulness_correlation(net, x, maps, **kw, generator=torch.Generator().manual_seed(1), chunk_size=5)
    b = faithfulness_correlation(net, x, maps, **kw, generator=torch.Generator().manual_seed(1), chunk_size=64)
    c = faithfulness_correlation(net, x, maps, **kw, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_monotonicity_by_hand_restores_features():
    x = torch.tensor([[[1.0, -2.0, 4.0]]])
    net = Weighted(torch.ones(1, 1, 3))
    # least relevant first: -2, 1, 4 -> scores -2, -1, 3: rising
    assert monotonicity(net, x, x[:, 0], 0).item() == 1.0
    # |x| puts 1 first: 1, -1, 3: falls once
    assert monotonicity(net, x, x[:, 0].abs(), 0).item() == 0.0
    # from a baseline of 5: 5 + 5 + 1 = 11 after restoring x_0 = 1, then 11 - 7 = 4: falls
    assert monotonicity(net, x, torch.tensor([[1.0, 2.0, 3.0]]), 0, baseline=5.0).item() == 0.0


def test_monotonicity_correlation_by_hand():
    x = torch.full((1, 1, 4), 2.0)
    w = torch.tensor([1.0, 3.0, 2.0, 4.0])
    net = Weighted(w, bias=1.0)
    zeros = torch.zeros(1, 4, 3, 1)  # every draw replaces the feature by 0: variance 4 w_i^2 / f(x)^2
    assert monotonicity_correlation(net, x, w[None], 0, fill=zeros).item() == pytest.approx(1.0)
    assert monotonicity_correlation(net, x, -w[None], 0, fill=zeros).item() == pytest.approx(-1.0)
    # groups of two (least relevant first: {0, 2}, {1, 3}): map sums 3, 7 and variances rise too
    fill = torch.zeros(1, 2, 3, 2)
    assert monotonicity_correlation(net, x, w[None], 0, fill=fill, features_in_step=2).item() == pytest.approx(1.0)


@pytest.mark.heavy
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_every_rank_and_batch_equals_one_by_one(dims):
    net, x = RankNet(dims), rank_input(dims, batch=2)
    maps = torch.rand(2, *x.shape[2:], generator=torch.Generator().manual_seed(4))
    step = max(1, maps[0].numel() // 8)
    calls = {
        "pixel_flipping": lambda xx, mm, c: pixel_flipping(net, xx, mm, features_in_step=step, chunk_size=c),
        "estimate": lambda xx, mm, c: faithfulness_estimate(net, xx, mm, features_in_step=step, chunk_size=c),
        "monotonicity": lambda xx, mm, c: monotonicity(net, xx, mm, features_in_step=step, chunk_size=c),
    }
    for name, call in calls.items():
        whole = call(x, maps, 3)
        alone = torch.cat([call(x[i : i + 1], maps[i : i + 1], 64) for i in range(2)])
        torch.testing.assert_close(whole, alone, msg=name)
    subsets = torch.randint(0, maps[0].numel(), (2, 4, 3), generator=torch.Generator().manual_seed(0))
    whole = faithfulness_correlation(net, x, maps, subsets=subsets, chunk_size=3)
    alone = torch.cat([faithfulness_correlation(net, x[i : i + 1], maps[i : i + 1], subsets=subsets[i : i + 1]) for i in range(2)])
    torch.testing.assert_close(whole, alone)
    count = -(-maps[0].numel() // step)
    fill = torch.rand(2, count, 2, step, generator=torch.Generator().manual_seed(0))
    whole = monotonicity_correlation(net, x, maps, fill=fill, features_in_step=step, chunk_size=5)
    alone = torch.cat([
        monotonicity_correlation(net, x[i : i + 1], maps[i : i + 1], fill=fill[i : i + 1], features_in_step=step)
        for i in range(2)
    ])  # fmt: skip
    torch.testing.assert_close(whole, alone)


def test_nan_map_gives_nan_for_that_sample_only():
    net, x = TinyNet(), tiny_input(2)
    maps = torch.rand(2, 8, 8, generator=torch.Generator().manual_seed(3))
    maps[1, 2, 2] = float("nan")
    curve = pixel_flipping(net, x, maps, features_in_step=16)
    assert not torch.isnan(curve[0]).any() and torch.isnan(curve[1]).all()
    assert torch.isnan(faithfulness_estimate(net, x, maps, features_in_step=16)[1])


def test_model_inputs_and_grads_untouched():
    net, x = TinyNet(), tiny_input(2)
    net.train()
    net.bn1.eval()
    net.fc.weight.requires_grad_(False)
    flags = [m.training for m in net.modules()]
    state = {k: v.clone() for k, v in net.state_dict().items()}
    maps = torch.rand(2, 8, 8, generator=torch.Generator().manual_seed(5))
    x0, maps0 = x.clone(), maps.clone()
    pixel_flipping(net, x, maps, features_in_step=16, chunk_size=3)
    faithfulness_correlation(net, x, maps, runs=3, subset_size=4, generator=torch.Generator().manual_seed(0))
    faithfulness_estimate(net, x, maps, features_in_step=16)
    monotonicity(net, x, maps, features_in_step=16)
    monotonicity_correlation(net, x, maps, samples=2, features_in_step=16, generator=torch.Generator())
    assert [m.training for m in net.modules()] == flags
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    assert all(p.grad is None for p in net.parameters())
    assert net.fc.weight.requires_grad is False and net.conv1.weight.requires_grad is True
    assert torch.equal(x, x0) and torch.equal(maps, maps0)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in net.modules())


def test_errors_say_what_to_do():
    net, x = TinyNet(), tiny_input(2)
    with pytest.raises(InvalidInputError, match="upsample_maps"):
        pixel_flipping(net, x, torch.rand(2, 4, 4))
    with pytest.raises(InvalidInputError, match="one value per channel"):
        pixel_flipping(net, x, torch.rand(2, 2, 8, 8))
    with pytest.raises(InvalidInputError, match="features_in_step"):
        pixel_flipping(net, x, torch.rand(2, 8, 8), features_in_step=0)
    with pytest.raises(InvalidInputError, match="subset_size"):
        faithfulness_correlation(net, x, torch.rand(2, 8, 8), subset_size=65)
    with pytest.raises(InvalidInputError, match="fill must be"):
        monotonicity_correlation(net, x, torch.rand(2, 8, 8), fill=torch.zeros(2, 3, 1, 1))
