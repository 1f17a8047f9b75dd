"""DeepLift's softmax rule: exact summation-to-delta, nothing carried by a common shift, hand values."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import camkit


class _Head(nn.Module):
    """Linear, ReLU, linear, then softmax in the spelling given."""

    def __init__(self, spelling: str) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(6, 7), nn.ReLU(), nn.Linear(7, 4))
        self.spelling = spelling
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.body(x)
        if self.spelling == "module":
            return self.softmax(z)
        if self.spelling == "functional":
            return F.softmax(z, dim=-1)
        if self.spelling == "torch":
            return torch.softmax(z, 1)
        return z.softmax(dim=1)


@pytest.mark.parametrize("spelling", ["module", "functional", "torch", "method"])
def test_attributions_sum_to_the_softmax_change(spelling):
    torch.manual_seed(0)
    net = _Head(spelling).double().eval()
    x = torch.randn(3, 2, 3, dtype=torch.float64)
    base = torch.randn(1, 2, 3, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a rule now: no NoRuleWarning
        e = camkit.DeepLift(net, baseline=base).explain(x, 2)
    with torch.no_grad():
        change = net(x)[:, 2] - net(base)[:, 2]
    torch.testing.assert_close(e.raw.flatten(1).sum(dim=1).double(), change, atol=1e-6, rtol=0)
    one_by_one = torch.cat([camkit.DeepLift(net, baseline=base).explain(x[i : i + 1], 2).raw for i in range(3)])
    torch.testing.assert_close(e.raw, one_by_one)


def test_two_classes_by_hand():
    # softmax of two inputs: y_1 = sigmoid(z_1 - z_2). J's rows are p1 p2 [1, -1] at both ends, so the
    # multipliers of y_1 are c [1, -1] with c (dz_1 - dz_2) = dy_1: a = dy_1 [dz_1, -dz_2] / (dz_1 - dz_2)
    net = nn.Sequential(nn.Flatten(), nn.Softmax(dim=1)).double()
    x = torch.tensor([[[2.0, 0.0]], [[1.0, -1.0]]], dtype=torch.float64)
    raw = camkit.DeepLift(net, baseline=0.0).explain(x, 0).raw
    dy = torch.tensor([1 / (1 + math.exp(-2.0)) - 0.5] * 2, dtype=torch.float64)
    expected = torch.stack([torch.stack([dy[0], torch.tensor(0.0, dtype=torch.float64)]), dy[1] * torch.ones(2, dtype=torch.float64) / 2])
    torch.testing.assert_close(raw[:, 0].double(), expected, atol=1e-6, rtol=0)


def test_a_common_shift_of_the_logits_carries_nothing():
    # input 0 adds the same amount to every logit: softmax does not see it, so its attribution is 0
    torch.manual_seed(1)
    weights = torch.randn(3, 4, dtype=torch.float64)

    class Shifted(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            flat = x.flatten(1)
            logits = flat[:, 1:] @ weights + 5.0 * flat[:, :1]
            return torch.softmax(logits, dim=1)

    x = torch.randn(2, 1, 4, dtype=torch.float64)
    e = camkit.DeepLift(Shifted(), baseline=0.0).explain(x, 1)
    assert e.raw[:, 0, 0].abs().max() < 1e-7
    with torch.no_grad():
        change = Shifted()(x)[:, 1] - Shifted()(torch.zeros_like(x))[:, 1]
    torch.testing.assert_close(e.raw.flatten(1).sum(dim=1).double(), change, atol=1e-6, rtol=0)


def test_several_baselines_each_sum_exactly():
    torch.manual_seed(2)
    net = _Head("module").double().eval()
    x = torch.randn(2, 2, 3, dtype=torch.float64)
    bases = torch.randn(4, 2, 3, dtype=torch.float64)
    e = camkit.DeepLiftShap(net, baselines=bases).explain(x, 0)
    with torch.no_grad():
        change = net(x)[:, 0] - net(bases)[:, 0].mean()
    torch.testing.assert_close(e.raw.flatten(1).sum(dim=1).double(), change, atol=1e-6, rtol=0)
