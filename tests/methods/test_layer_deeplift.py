"""camkit.LayerDeepLift and LayerDeepLiftShap: hand values, summation to delta, captum's values, the Shap mean."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import camkit


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Conv2d(3, 2, 1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(32, 3)).double().eval()


def test_rescale_by_hand():
    # a = x (identity conv), then relu and weights (1, -2): relu's multipliers are (f(a) - f(0)) / a
    net = nn.Sequential(nn.Conv2d(1, 1, 1, bias=False), nn.ReLU(), nn.Flatten(), nn.Linear(2, 1, bias=False))
    with torch.no_grad():
        net[0].weight.fill_(1.0)
        net[3].weight.copy_(torch.tensor([[1.0, -2.0]]))
    e = camkit.LayerDeepLift(net, "0", baseline=-1.0).explain(torch.tensor([[[[3.0, 2.0]]]]), 0)
    # unit 0: a - a0 = 4, m = (3 - 0) / 4 * 1; unit 1: a - a0 = 3, m = (2 - 0) / 3 * -2
    torch.testing.assert_close(e.raw, torch.tensor([[[[3.0, -4.0]]]]))
    torch.testing.assert_close(e.extras["delta"], torch.zeros(1), atol=1e-6, rtol=0)


def test_sums_to_the_score_change_and_batch_equals_one_by_one():
    net, x = _net(), torch.randn(3, 2, 4, 4, dtype=torch.float64)
    e = camkit.LayerDeepLift(net, "2", baseline=0.2).explain(x, [0, 1, 2])
    torch.testing.assert_close(e.extras["delta"], torch.zeros(3, dtype=e.extras["delta"].dtype), atol=1e-5, rtol=0)
    one = torch.cat([camkit.LayerDeepLift(net, "2", baseline=0.2).explain(x[i : i + 1], [i]).raw for i in range(3)])
    torch.testing.assert_close(e.raw, one)


def test_equals_captum():
    ca = pytest.importorskip("captum.attr")
    net, x = _net(), torch.randn(2, 2, 4, 4, dtype=torch.float64)
    ours = camkit.LayerDeepLift(net, "2", baseline=0.1).explain(x, 1).raw
    theirs = ca.LayerDeepLift(net, net[2]).attribute(x, baselines=0.1, target=1)
    torch.testing.assert_close(ours.double(), theirs, atol=1e-6, rtol=1e-5)


def test_shap_is_the_mean_over_baselines_and_leaves_the_model_alone():
    net, x = _net(), torch.randn(2, 2, 4, 4, dtype=torch.float64)
    bases = torch.randn(3, 2, 4, 4, dtype=torch.float64)
    net.train()
    e = camkit.LayerDeepLiftShap(net, "0", bases).explain(x, 2)
    each = [camkit.LayerDeepLift(net, "0", baseline=b).explain(x, 2).raw for b in bases]
    torch.testing.assert_close(e.raw, sum(each) / 3)
    assert e.extras["pair_deltas"].shape == (2, 3)
    assert net.training and all(p.grad is None for p in net.parameters())
    assert not any(m._forward_hooks or m._backward_hooks for m in net.modules())
