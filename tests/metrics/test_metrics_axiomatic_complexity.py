"""Completeness, non-sensitivity, input invariance; sparseness, complexity, effective complexity:
values by hand, every rank, batch equals one by one, hygiene."""

from __future__ import annotations

import math

import pytest
import torch
from models import RankNet, TinyNet, rank_input, tiny_input
from torch import nn

import camkit
from camkit.errors import InvalidInputError
from camkit.metrics import (
    completeness,
    complexity,
    effective_complexity,
    input_invariance,
    non_sensitivity,
    sparseness,
)


class Weighted(nn.Module):
    def __init__(self, w: torch.Tensor, bias: float = 0.0) -> None:
        super().__init__()
        self.w, self.bias = w, bias

    def forward(self, x):
        s = self.bias + (x * self.w).flatten(1).sum(dim=1)
        return torch.stack([s, -s], dim=1)


def test_sparseness_by_hand():
    # sorted 0, 1, 3: (2*1-4)*0 + (2*2-4)*1 + (2*3-4)*3 = 6; / (3 * 4) = 0.5
    assert sparseness(torch.tensor([[3.0, 0.0, -1.0]])).item() == pytest.approx(0.5)
    one_hot = torch.zeros(1, 4, 4)
    one_hot[0, 1, 2] = 5.0
    assert sparseness(one_hot).item() == pytest.approx(1 - 1 / 16)
    assert sparseness(torch.ones(2, 3, 2, 2)).tolist() == pytest.approx([0.0, 0.0])  # channel maps too
    assert torch.isnan(sparseness(torch.zeros(1, 4))).all()


def test_complexity_by_hand():
    # p = 1/4, 1/4, 1/2: H = 2 * (1/4) ln 4 + (1/2) ln 2 = 1.5 ln 2
    assert complexity(torch.tensor([[1.0, -1.0, 2.0]])).item() == pytest.approx(1.5 * math.log(2))
    assert complexity(torch.ones(1, 2, 3, 4)).item() == pytest.approx(math.log(24))
    assert torch.isnan(complexity(torch.zeros(1, 4))).all()


def test_effective_complexity_by_hand():
    maps = torch.tensor([[0.5, -0.2, 0.0, 1e-6], [0.0, 0.0, 0.0, 0.0]])
    assert effective_complexity(maps).tolist() == [2, 0]
    assert effective_complexity(maps, eps=0.3).tolist() == [1, 0]
    with pytest.raises(InvalidInputError, match="eps"):
        effective_complexity(maps, eps=-1.0)
    with pytest.raises(InvalidInputError, match="maps must be"):
        sparseness(torch.ones(4))


def test_completeness_by_hand():
    w = torch.tensor([[[1.0, -2.0, 3.0]]])
    net = Weighted(w, bias=0.5)
    x = torch.tensor([[[1.0, 1.0, 2.0]]])
    assert completeness(net, x, (x * w)[:, 0], 0).item() == pytest.approx(0.0)
    assert completeness(net, x, torch.ones(1, 3), 0).item() == pytest.approx(3.0 - 5.0)
    # from a baseline of 1: f(x) - f(1) = 3 * (2 - 1) = 3, the input-times-gradient from it
    assert completeness(net, x, ((x - 1) * w)[:, 0], 0, baseline=1.0).item() == pytest.approx(0.0)


def test_non_sensitivity_by_hand():
    w = torch.tensor([[[1.0, 1.0, 0.0, 0.0]]])
    net, x = Weighted(w), torch.ones(1, 1, 4)
    assert non_sensitivity(net, x, torch.tensor([[1.0, 1.0, 0.0, 0.0]]), 0).item() == 0
    assert non_sensitivity(net, x, torch.tensor([[1.0, 0.0, 1.0, 0.0]]), 0).item() == 2
    # groups of two in index order: {0, 1} used, {2, 3} unused; map zero at 1 and 2 -> both wrong
    assert non_sensitivity(net, x, torch.tensor([[1.0, 0.0, 0.0, 1.0]]), 0, features_in_step=2).item() == 2
    # a strongly negative attribution is not "unattributed"
    assert non_sensitivity(net, x, torch.tensor([[1.0, -1.0, 0.0, 0.0]]), 0).item() == 0


def test_input_invariance_gradient_yes_input_times_gradient_no():
    net, x = TinyNet().eval(), tiny_input(2)

    def saliency(model, inputs, target):
        return camkit.Saliency(model)(inputs, target)

    def gradient_times_input(model, inputs, target):
        inputs = inputs.clone().requires_grad_(True)
        score = model(inputs).gather(1, target[:, None]).sum()
        return (inputs * torch.autograd.grad(score, inputs)[0]).sum(dim=1)

    target = torch.tensor([1, 3])
    assert input_invariance(saliency, net, x, target).tolist() == [1.0, 1.0]
    assert input_invariance(gradient_times_input, net, x, target).tolist() == [0.0, 0.0]
    assert all(p.grad is None for p in net.parameters())


def test_input_invariance_shifted_inputs_given():
    """``shifted=x + shift`` is the default; inputs shifted by another amount are seen by the second model as
    ``x + (other - shift)``: the product of the input and a linear model's gradient then differs by that much."""
    net, seen = nn.Sequential(nn.Flatten(), nn.Linear(6, 2)).eval(), []

    def gradient_times_input(model, inputs, target):
        seen.append(inputs)
        inputs = inputs.clone().requires_grad_(True)
        score = model(inputs).gather(1, target[:, None]).sum()
        return inputs * torch.autograd.grad(score, inputs)[0]

    x, target = torch.rand(2, 1, 6), torch.tensor([0, 1])
    assert input_invariance(gradient_times_input, net, x, target, shift=0.0, shifted=x).tolist() == [1.0, 1.0]
    assert torch.equal(seen[-1], x)
    assert input_invariance(gradient_times_input, net, x, target, shift=0.0, shifted=x + 1.0).tolist() == [0.0, 0.0]
    assert torch.equal(seen[-1], x + 1.0)
    with pytest.raises(InvalidInputError, match="shape"):
        input_invariance(gradient_times_input, net, x, target, shifted=x[:1])


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_every_rank_and_batch_equals_one_by_one(dims):
    net, x = RankNet(dims), rank_input(dims, batch=2)
    maps = torch.rand(2, *x.shape[2:], generator=torch.Generator().manual_seed(4)) - 0.3
    step = max(1, maps[0].numel() // 8)
    for call in (
        lambda xx, mm, c: completeness(net, xx, mm, chunk_size=c),
        lambda xx, mm, c: non_sensitivity(net, xx, mm, eps=0.05, features_in_step=step, chunk_size=c),
        lambda xx, mm, c: torch.stack([sparseness(mm), complexity(mm), effective_complexity(mm, 0.2).double()]),
    ):
        whole = call(x, maps, 1)
        alone = torch.cat([call(x[i : i + 1], maps[i : i + 1], 64) for i in range(2)], dim=-1)
        torch.testing.assert_close(whole, alone)


def test_model_inputs_and_grads_untouched():
    net, x = TinyNet(), tiny_input(2)
    net.train()
    flags = [m.training for m in net.modules()]
    state = {k: v.clone() for k, v in net.state_dict().items()}
    maps = torch.rand(2, 8, 8, generator=torch.Generator().manual_seed(5))
    x0, maps0 = x.clone(), maps.clone()
    completeness(net, x, maps)
    non_sensitivity(net, x, maps, features_in_step=16)
    for f in (sparseness, complexity, effective_complexity):
        f(maps)
    assert [m.training for m in net.modules()] == flags
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    assert all(p.grad is None for p in net.parameters())
    assert torch.equal(x, x0) and torch.equal(maps, maps0)
