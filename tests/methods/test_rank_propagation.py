"""DeepLift, DeepLiftShap and LRP on signals [B, C, T] and volumes or videos [B, C, D, H, W].

Summation-to-delta and conservation on nets of Conv1d/3d, BatchNorm1d/3d, ReLU,
MaxPool1d/3d, AvgPool1d/3d and AdaptiveAvgPool1d/3d (none of which may draw a
NoRuleWarning), the max-pooling rule window by window, DeepLiftShap as the mean of DeepLift
over its baselines, and LRP-epsilon against its closed form on bias-free ReLU nets. The 2-D
results are held by tests/methods/test_propagation.py.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import camkit

RANKS = (1, 3)
SIZES = {1: (16,), 3: (4, 8, 8)}
CONV = {1: nn.Conv1d, 3: nn.Conv3d}
NORM = {1: nn.BatchNorm1d, 3: nn.BatchNorm3d}
MAX = {1: nn.MaxPool1d, 3: nn.MaxPool3d}
AVG = {1: nn.AvgPool1d, 3: nn.AvgPool3d}
ADAPTIVE = {1: nn.AdaptiveAvgPool1d, 3: nn.AdaptiveAvgPool3d}


def _input(spatial_dims: int, batch: int = 3, seed: int = 1) -> Tensor:
    return torch.randn(batch, 3, *SIZES[spatial_dims], generator=torch.Generator().manual_seed(seed))


class PoolNet(nn.Module):
    """conv -> BN -> ReLU -> max-pool -> conv -> ReLU -> avg-pool -> adaptive avg-pool -> linear, of any rank.

    Every operation has a DeepLift rule or needs none, so attributions sum to the score difference.
    """

    def __init__(self, spatial_dims: int, bias: bool = True, norm: bool = True, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv1 = CONV[spatial_dims](3, 4, 3, padding=1, bias=bias)
        self.bn = NORM[spatial_dims](4) if norm else nn.Identity()
        self.relu1 = nn.ReLU(inplace=True)
        self.pool1 = MAX[spatial_dims](2)
        self.conv2 = CONV[spatial_dims](4, 5, 3, padding=1, bias=bias)
        self.relu2 = nn.ReLU()
        self.pool2 = AVG[spatial_dims](2)
        self.pool3 = ADAPTIVE[spatial_dims](1)
        self.fc = nn.Linear(5, 4, bias=bias)
        if norm:
            with torch.no_grad():
                self.bn.running_mean.uniform_(-0.2, 0.2)
                self.bn.running_var.uniform_(0.5, 1.5)
                self.bn.weight.uniform_(0.5, 1.5)
                self.bn.bias.uniform_(-0.2, 0.2)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool1(self.relu1(self.bn(self.conv1(x))))
        return self.fc(self.pool3(self.pool2(self.relu2(self.conv2(x)))).flatten(1))


def _sum(raw: Tensor, lead: int = 1) -> Tensor:
    return raw.sum(dim=tuple(range(lead, raw.dim())))


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_deeplift_sums_to_the_score_difference_without_any_missing_rule(spatial_dims):
    model = PoolNet(spatial_dims).eval()
    x = _input(spatial_dims)
    targets = torch.tensor([[0, 2], [3, 1], [1, 1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", camkit.NoRuleWarning)  # max-pooling, BN, pooling of this rank all have rules
        e = camkit.DeepLift(model, baseline=-0.3).explain(x, targets)
    difference = e.scores - e.extras["baseline_scores"]
    assert difference.abs().min() > 1e-2, "a degenerate case: the score barely moves"
    torch.testing.assert_close(_sum(e.raw, 2), difference, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(e.extras["delta"], _sum(e.raw, 2) - difference)
    assert e.raw.shape == (3, 2, 3, *SIZES[spatial_dims]) and e.maps.shape == (3, 2, *SIZES[spatial_dims])
    # the plain input x gradient does not sum to it: the rules did something
    plain = camkit.InputXGradient(model).explain(x + 0.3, targets)
    assert (_sum(plain.raw, 2) - difference).abs().max() > 1e-3


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_deeplift_max_pool_rule_passes_each_windows_change(spatial_dims):
    torch.manual_seed(7)
    size = SIZES[spatial_dims]
    x = torch.randn(1, 2, *size)
    x0 = torch.randn(1, 2, *size)
    windows = math.prod(s // 2 for s in size)
    net = nn.Sequential(MAX[spatial_dims](2), nn.Flatten(), nn.Linear(2 * windows, 1))
    _, _, _, multipliers = camkit.DeepLift(net, baseline=x0)._multipliers(x, x0, 0)
    pool = F.max_pool1d if spatial_dims == 1 else F.max_pool3d
    y, y0 = pool(x, 2), pool(x0, 2)
    contributions = (x - x0) * multipliers
    # gather each disjoint 2^n window's contributions: every window passes w * (y - y0), exactly
    per_window = contributions
    for axis in range(2, 2 + spatial_dims):
        per_window = per_window.unfold(axis, 2, 2)
    per_window = per_window.sum(dim=tuple(range(-spatial_dims, 0)))
    weights = net[2].weight.detach().view(1, 2, *y.shape[2:])
    torch.testing.assert_close(per_window, weights * (y - y0))
    assert (per_window.abs() > 1e-4).float().mean() > 0.9


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_deeplift_batch_equals_one_by_one(spatial_dims):
    model = PoolNet(spatial_dims).eval()
    x = _input(spatial_dims)
    target = torch.tensor([0, 3, 1])
    batched = camkit.DeepLift(model, baseline=0.1).explain(x, target)
    for i in range(3):
        single = camkit.DeepLift(model, baseline=0.1).explain(x[i : i + 1], target[i : i + 1])
        torch.testing.assert_close(batched.raw[i], single.raw[0], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(batched.maps[i], single.maps[0], atol=1e-5, rtol=0)


@pytest.mark.heavy
@pytest.mark.parametrize("spatial_dims", RANKS)
@pytest.mark.parametrize("max_batch", [3, 32])  # one baseline per pass, all in one pass
def test_deepliftshap_is_the_mean_of_deeplift_over_its_baselines(spatial_dims, max_batch):
    model = PoolNet(spatial_dims).eval()
    x = _input(spatial_dims)
    baselines = torch.randn(3, 3, *SIZES[spatial_dims], generator=torch.Generator().manual_seed(4))
    e = camkit.DeepLiftShap(model, baselines, max_batch=max_batch).explain(x, 2)
    each = [camkit.DeepLift(model, baseline=b).explain(x, 2) for b in baselines]
    torch.testing.assert_close(e.raw, torch.stack([d.raw for d in each]).mean(dim=0), atol=1e-6, rtol=1e-5)
    base_mean = torch.stack([d.extras["baseline_scores"] for d in each]).mean(dim=0)
    torch.testing.assert_close(_sum(e.raw), e.scores - base_mean, atol=1e-5, rtol=1e-5)
    assert e.extras["delta"].shape == (3,)


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_lrp_epsilon_is_input_times_gradient_on_bias_free_relu_nets_and_conserves(spatial_dims):
    # Without biases and with epsilon = 0, the epsilon rule through convolutions, ReLUs, max- and
    # average pooling equals x * dS/dx, and the relevance of each input sums to its score.
    model = PoolNet(spatial_dims, bias=False, norm=False).eval()
    x = _input(spatial_dims)
    with warnings.catch_warnings():
        warnings.simplefilter("error", camkit.NoRuleWarning)
        e = camkit.LRP(model, "epsilon", epsilon=0.0).explain(x, torch.tensor([1, 0, 3]))
    torch.testing.assert_close(e.raw, camkit.InputXGradient(model).explain(x, torch.tensor([1, 0, 3])).raw)
    torch.testing.assert_close(_sum(e.raw), e.scores, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(e.extras["delta"], _sum(e.raw) - e.scores)
    assert e.scores.abs().min() > 1e-2


@pytest.mark.parametrize("spatial_dims", RANKS)
def test_lrp_epsilon_conserves_through_batch_norm_of_the_rank(spatial_dims):
    # Batch norm with zero running mean and zero shift is a per-channel scaling: the epsilon rule conserves through it.
    model = PoolNet(spatial_dims, bias=False).eval()
    with torch.no_grad():
        model.bn.running_mean.zero_()
        model.bn.bias.zero_()
    x = _input(spatial_dims)
    with warnings.catch_warnings():
        warnings.simplefilter("error", camkit.NoRuleWarning)
        e = camkit.LRP(model, "epsilon", epsilon=1e-9).explain(x, 2)
    torch.testing.assert_close(_sum(e.raw), e.scores, atol=1e-5, rtol=1e-4)
    # with a shift the batch norm absorbs relevance, as a bias does
    with torch.no_grad():
        model.bn.bias.fill_(0.5)
    shifted = camkit.LRP(model, "epsilon", epsilon=1e-9).explain(x, 2)
    assert (_sum(shifted.raw) - shifted.scores).abs().max() > 1e-3


@pytest.mark.heavy
@pytest.mark.parametrize("spatial_dims", RANKS)
@pytest.mark.parametrize("rule", ["zplus", "gamma", "alphabeta", "epsilongammabox"])
def test_lrp_rules_run_on_every_rank(spatial_dims, rule):
    model = PoolNet(spatial_dims).eval()
    x = _input(spatial_dims)
    e = camkit.LRP(model, rule).explain(x, 2)
    assert e.raw.shape == (3, 3, *SIZES[spatial_dims]) and e.maps.shape == (3, *SIZES[spatial_dims])
    assert torch.isfinite(e.raw).all() and not e.flat.any()
    assert e.extras["delta"].shape == (3,)
    single = camkit.LRP(model, rule).explain(x[1:2], 2)
    torch.testing.assert_close(e.raw[1:2], single.raw, atol=1e-6, rtol=1e-5)
