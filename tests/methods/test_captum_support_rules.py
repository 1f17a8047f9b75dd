"""What camkit's methods gained for the captum translation: Riemann left/right rules, per-draw and per-baseline gaps."""

from __future__ import annotations

import torch
from torch import nn

import camkit
from camkit.functional import integration_points


def test_left_and_right_riemann_rules():
    left, w_left = integration_points(4, "left", dtype=torch.float64)
    right, w_right = integration_points(4, "right", dtype=torch.float64)
    assert left.tolist() == [0.0, 0.25, 0.5, 0.75] and right.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert w_left.tolist() == w_right.tolist() == [0.25] * 4
    # the integral of 2a over [0, 1] is 1: the left sum falls short by 1/4, the right one exceeds it by 1/4
    assert abs(float((2 * left * w_left).sum()) - 0.75) < 1e-12
    assert abs(float((2 * right * w_right).sum()) - 1.25) < 1e-12


def test_smoothgrad_keeps_each_draws_completeness_gap():
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2)).double()
    x = torch.rand(2, 1, 2, 2, dtype=torch.float64)
    e = camkit.SmoothGrad(camkit.IntegratedGradients(net, steps=4), samples=3, sigma=0.1, seed=0).explain(x, target=0)
    gaps = e.extras["draw_gaps"]
    assert gaps.shape == (3, 2)
    assert gaps.abs().max() < 1e-5  # a linear model: each noisy copy's integral is exact
    plain = camkit.SmoothGrad(camkit.Saliency(net), samples=2, seed=0).explain(x, target=0)
    assert "draw_gaps" not in plain.extras


def test_deepliftshap_reports_each_baselines_gap():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).double()
    x = torch.rand(2, 1, 2, 2, dtype=torch.float64)
    bases = torch.rand(3, 1, 2, 2, dtype=torch.float64)
    e = camkit.DeepLiftShap(net, bases).explain(x, target=1)
    pairs = e.extras["pair_deltas"]
    assert pairs.shape == (2, 3)
    assert pairs.abs().max() < 1e-5  # ReLU networks: every DeepLift sums to its score difference
    for j in range(3):
        single = camkit.DeepLift(net, baseline=bases[j : j + 1]).explain(x, target=1)
        torch.testing.assert_close(pairs[:, j], single.extras["delta"].to(pairs.dtype), atol=1e-6, rtol=0)
