"""camkit.DeepLift and DeepLiftShap with a NeuronTarget: the reference's neuron is read in the reference's pass."""

from __future__ import annotations

import torch
from torch import nn

import camkit


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Conv2d(3, 2, 1), nn.Tanh(),
                         nn.Flatten(), nn.Linear(32, 3)).double().eval()


def _neuron(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return net[:3](x)[:, 1, 2, 0]


def test_deeplift_of_a_neuron_sums_to_its_change_for_one_baseline_and_one_per_image():
    net = _net()
    torch.manual_seed(1)
    x = torch.randn(3, 2, 4, 4, dtype=torch.float64)
    target = camkit.NeuronTarget("2", 1, (2, 0))
    for base in (torch.randn(1, 2, 4, 4, dtype=torch.float64), torch.randn(3, 2, 4, 4, dtype=torch.float64)):
        e = camkit.DeepLift(net, baseline=base).explain(x, target)
        change = _neuron(net, x) - _neuron(net, base)
        # conv, relu, conv: the Rescale rule carries the neuron's change exactly
        torch.testing.assert_close(e.raw.sum(dim=(1, 2, 3)), change.float(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(e.extras["delta"], torch.zeros(3, dtype=e.extras["delta"].dtype), atol=1e-5, rtol=0)
        one = camkit.DeepLift(net, baseline=base[-1:]).explain(x[-1:], target)
        torch.testing.assert_close(one.extras["delta"], torch.zeros_like(one.extras["delta"]), atol=1e-5, rtol=0)


def test_deeplift_shap_of_a_neuron_is_the_mean_over_baselines():
    net = _net()
    torch.manual_seed(2)
    x, dist = torch.randn(2, 2, 4, 4, dtype=torch.float64), torch.randn(3, 2, 4, 4, dtype=torch.float64)
    target = camkit.NeuronTarget("2", 0, (1, 1))
    shap = camkit.DeepLiftShap(net, baselines=dist).explain(x, target).raw
    each = [camkit.DeepLift(net, baseline=dist[j : j + 1]).explain(x, target).raw for j in range(3)]
    torch.testing.assert_close(shap, torch.stack(each).mean(dim=0))
    assert all(p.grad is None for p in net.parameters())
