"""Layer attributions: hand-computed values on a tiny model and parity with captum."""

from __future__ import annotations

import pytest
import torch
from models import TinyNet, tiny_input
from torch import Tensor, nn

import camkit


class Square(nn.Module):
    """a = conv(x) = 2 x (a 1x1 convolution, the layer "conv"); score S = sum(a^2) (class 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 1, bias=False)
        with torch.no_grad():
            self.conv.weight.fill_(2.0)

    def forward(self, x: Tensor) -> Tensor:
        s = (self.conv(x) ** 2).sum(dim=(1, 2, 3))
        return torch.stack([s, -s], dim=1)


X = torch.tensor([[[[1.0, -2.0]]]])  # a = [2, -4], a^2 = [4, 16]


def test_layer_activation_by_hand():
    e = camkit.LayerActivation(Square(), "conv").explain(X, target=[[0, 1]])
    assert e.raw.tolist() == [[[[[2.0, -4.0]]], [[[2.0, -4.0]]]]]  # [B, K, C, h, w]: the same for both targets
    assert e.scores.tolist() == [[20.0, -20.0]]


def test_layer_gradient_x_activation_by_hand():
    # A * dS/dA = a * 2a = 2 a^2
    assert camkit.LayerGradientXActivation(Square(), "conv").explain(X, 0).raw.tolist() == [[[[8.0, 32.0]]]]


def test_layer_integrated_gradients_by_hand():
    # baseline 0 gives a0 = 0; (a - a0) * int_0^1 2 alpha a d(alpha) = a^2, exact for Gauss-Legendre
    e = camkit.LayerIntegratedGradients(Square(), "conv", steps=3).explain(X, 0)
    torch.testing.assert_close(e.raw, torch.tensor([[[[4.0, 16.0]]]]))
    assert abs(e.extras["completeness_gap"].item()) < 1e-5
    torch.testing.assert_close(e.extras["map"], torch.tensor([[[4.0, 16.0]]]))


@pytest.mark.parametrize("steps", [1, 4])
def test_layer_conductance_by_hand(steps):
    # x_i = (i / n) x, a_i = (i / n) a, dS/da = 2 a_i:
    # sum_{i < n} 2 (i / n) a * (a / n) = a^2 (n - 1) / n
    e = camkit.LayerConductance(Square(), "conv", steps=steps, max_batch=3).explain(X, 0)
    torch.testing.assert_close(e.raw, torch.tensor([[[[4.0, 16.0]]]]) * (steps - 1) / steps)
    assert e.extras["completeness_gap"].item() == pytest.approx(-20.0 / steps, abs=1e-5)


def test_one_layer_only():
    net = TinyNet().eval()
    with pytest.raises(camkit.InvalidInputError, match="one layer"):
        camkit.LayerGradientXActivation(net, ["conv1", "conv2"]).explain(tiny_input())


def test_path_methods_do_not_depend_on_max_batch():
    net = TinyNet().eval()
    x = tiny_input(batch=2)
    for cls in (camkit.LayerIntegratedGradients, camkit.LayerConductance):
        a = cls(net, "conv2", steps=5, max_batch=2).explain(x, [1, 2]).raw
        b = cls(net, "conv2", steps=5, max_batch=50).explain(x, [1, 2]).raw
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


# --- parity with captum ---------------------------------------------------------------------

captum_attr = pytest.importorskip("captum.attr", reason="captum is not installed")
TARGET = torch.tensor([0, 3, 1])


def test_layer_activation_and_gradxact_match_captum():
    net = TinyNet().eval()
    x = tiny_input()
    ours = camkit.LayerActivation(net, "conv2").explain(x, TARGET).raw
    torch.testing.assert_close(ours, captum_attr.LayerActivation(net, net.conv2).attribute(x), atol=1e-5, rtol=0)
    ours = camkit.LayerGradientXActivation(net, "conv2").explain(x, TARGET).raw
    theirs = captum_attr.LayerGradientXActivation(net, net.conv2).attribute(x, target=TARGET)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_layer_integrated_gradients_matches_captum():
    net = TinyNet().eval()
    x = tiny_input()
    ours = camkit.LayerIntegratedGradients(net, "conv2", steps=16, max_batch=7).explain(x, TARGET).raw
    theirs = captum_attr.LayerIntegratedGradients(net, net.conv2).attribute(x, baselines=0.0, target=TARGET, n_steps=16)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_layer_conductance_matches_captum_riemann_trapezoid():
    net = TinyNet().eval()
    x = tiny_input()
    ours = camkit.LayerConductance(net, "conv2", steps=10, max_batch=7).explain(x, TARGET).raw
    theirs = captum_attr.LayerConductance(net, net.conv2).attribute(
        x, baselines=0.0, target=TARGET, n_steps=10, method="riemann_trapezoid"
    )
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_captum_default_conductance_leaves_out_the_path_ends():
    # After relu2 the network is linear (pool, fc): dS/da is constant, so a Riemann sum of
    # dS/da * (a_{i+1} - a_i) telescopes exactly. camkit's points include alpha = 0 and 1, so its
    # sum is S(x) - S(0). captum's default Gauss-Legendre points run from the first to the last
    # inner node, so its sum is S(alpha_last x) - S(alpha_first x), not S(x) - S(0).
    import numpy as np

    net = TinyNet().eval()
    x = tiny_input(batch=1)
    steps = 2  # captum's nodes: 0.11, 0.5, 0.89
    theirs = captum_attr.LayerConductance(net, net.relu2).attribute(x, baselines=0.0, target=2, n_steps=steps)
    nodes = (np.polynomial.legendre.leggauss(steps + 1)[0] + 1) / 2
    with torch.no_grad():
        s = lambda alpha: net(alpha * x)[0, 2].item()  # noqa: E731
        inner, whole = s(nodes[-1]) - s(nodes[0]), s(1.0) - s(0.0)
    assert theirs.sum().item() == pytest.approx(inner, abs=1e-5)
    assert abs(inner - whole) > 0.05 * abs(whole)  # captum misses this share of S(x) - S(0)
    ours = camkit.LayerConductance(net, "relu2", steps=steps).explain(x, 2)
    assert ours.raw.sum().item() == pytest.approx(whole, abs=1e-5)
    assert abs(ours.extras["completeness_gap"].item()) < 1e-5


def test_on_every_device(device):
    net = TinyNet().eval()
    x = tiny_input(batch=2)
    for make in (
        lambda m: camkit.FeatureAblation(m, cells=2),
        lambda m: camkit.KernelShap(m, cells=2, samples=4),
        lambda m: camkit.LayerIntegratedGradients(m, "conv2", steps=4),
        lambda m: camkit.LayerConductance(m, "conv2", steps=4),
    ):
        here = make(net.to(device)).explain(x.to(device), [0, 1])
        assert here.maps.device.type == device.type
        cpu = make(net.cpu()).explain(x, [0, 1])
        torch.testing.assert_close(here.raw.cpu(), cpu.raw, atol=1e-4, rtol=1e-4)
