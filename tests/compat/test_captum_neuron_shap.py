"""camkit.compat.captum's NeuronGradientShap, NeuronDeepLift and NeuronDeepLiftShap.

Each equals captum's answer on small float64 models (NeuronGradientShap after the same seeds, as
it draws captum's numbers), for a neuron of a layer's output and of its input, with int, tuple,
slice and callable selectors; the Rescale rule's value is derived by hand where it is short.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat.captum import attr as ours

ca = pytest.importorskip("captum.attr")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(3, 4)
        self.relu = nn.ReLU()
        self.lin2 = nn.Linear(4, 3)
        self.act = nn.Tanh()
        self.out = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.lin2(self.relu(self.lin1(x)))))


class _Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(3, 2, 3, padding=1)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * 4 * 4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv2(self.relu(self.conv(x))))


@pytest.fixture
def net() -> nn.Module:
    torch.manual_seed(0)
    return _Net().double().eval()


@pytest.fixture
def cnn() -> nn.Module:
    torch.manual_seed(0)
    return _Cnn().double().eval()


def _close(mine, theirs) -> None:
    # equal up to camkit's float32 sums
    pairs = zip(mine, theirs) if isinstance(mine, tuple) else [(mine, theirs)]
    for m, t in pairs:
        assert m.shape == t.shape and m.dtype == t.dtype
        torch.testing.assert_close(m, t, atol=1e-7, rtol=1e-5)


def _untouched(model: nn.Module) -> None:
    assert all(p.grad is None for p in model.parameters())
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules())


def _seeded(call):
    np.random.seed(11)
    torch.manual_seed(11)
    return call()


SELECTORS = {"int": 2, "tuple": (1,), "slice": (slice(0, 3),), "callable": lambda a: a[:, 1] * a[:, 2]}


@pytest.mark.parametrize("name", list(SELECTORS))
def test_neuron_gradient_shap_equals_captum_after_the_same_seeds(net, name):
    torch.manual_seed(1)
    x, dist = torch.randn(3, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    before = x.clone()
    for to_input in (False, True):
        for multiply in (True, False):
            def run(lib, to_input=to_input, multiply=multiply):
                return lib.NeuronGradientShap(net, net.lin2, multiply_by_inputs=multiply).attribute(
                    x, SELECTORS[name], dist, n_samples=4, stdevs=0.2, attribute_to_neuron_input=to_input)

            _close(_seeded(lambda: run(ours)), _seeded(lambda: run(ca)))
    assert torch.equal(x, before)
    _untouched(net)


def test_neuron_gradient_shap_of_a_linear_neuron_by_hand(net):
    # lin1's unit 1 is linear in x: every draw gives (x - b) * w, whatever the draws
    torch.manual_seed(2)
    x, base = torch.randn(2, 3, dtype=torch.float64), torch.randn(1, 3, dtype=torch.float64)
    found = ours.NeuronGradientShap(net, net.lin1).attribute(x, 1, base, n_samples=3)
    torch.testing.assert_close(found, (x - base) * net.lin1.weight[1].detach())


@pytest.mark.parametrize("to_input", [False, True])
def test_neuron_deeplift_and_shap_equal_captum_on_images(cnn, to_input):
    torch.manual_seed(3)
    x = torch.randn(2, 2, 4, 4, dtype=torch.float64)
    base, dist = torch.randn(1, 2, 4, 4, dtype=torch.float64), torch.randn(3, 2, 4, 4, dtype=torch.float64)
    for multiply in (True, False):
        _close(ours.NeuronDeepLift(cnn, cnn.conv2, multiply).attribute(x, (1, 2, 0), base,
                                                                       attribute_to_neuron_input=to_input),
               ca.NeuronDeepLift(cnn, cnn.conv2, multiply).attribute(x, (1, 2, 0), base,
                                                                     attribute_to_neuron_input=to_input))
        _close(ours.NeuronDeepLiftShap(cnn, cnn.conv2, multiply).attribute(x, (0, 1, 3), dist,
                                                                           attribute_to_neuron_input=to_input),
               ca.NeuronDeepLiftShap(cnn, cnn.conv2, multiply).attribute(x, (0, 1, 3), dist,
                                                                         attribute_to_neuron_input=to_input))
    _untouched(cnn)


def test_neuron_deeplift_through_a_relu_by_hand(net):
    # lin2's unit 0 = sum_j v_j relu(z_j) + c with z = W x + b: the Rescale rule gives each z_j the
    # multiplier v_j (relu(z_j) - relu(z0_j)) / (z_j - z0_j), and x the sum of those times W
    torch.manual_seed(4)
    x, base = torch.randn(2, 3, dtype=torch.float64), torch.randn(1, 3, dtype=torch.float64)
    found = ours.NeuronDeepLift(net, net.lin2).attribute(x, 0, base)
    with torch.no_grad():
        w, v = net.lin1.weight, net.lin2.weight[0]
        z, z0 = net.lin1(x), net.lin1(base)
        slope = (torch.relu(z) - torch.relu(z0)) / (z - z0)
        expected = (slope * v) @ w * (x - base)
    torch.testing.assert_close(found, expected)
    total = found.sum(dim=1)
    with torch.no_grad():
        torch.testing.assert_close(total, (net.lin2(net.relu(net.lin1(x))) - net.lin2(net.relu(net.lin1(base))))[:, 0])


def test_neuron_deeplift_of_two_inputs_with_a_custom_function_equals_captum():
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(5, 3)
            self.relu = nn.ReLU()

        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return self.relu(self.lin(torch.cat([a, b], dim=1))).sum(dim=1, keepdim=True)

    torch.manual_seed(5)
    model = Two().double()
    xs = (torch.randn(2, 2, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64))
    dist = (torch.randn(3, 2, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64))

    def func(multipliers, inputs, baselines):
        return tuple(m * (i - b) ** 2 for m, i, b in zip(multipliers, inputs, baselines))

    _close(ours.NeuronDeepLift(model, model.relu).attribute(xs, 1, custom_attribution_func=func),
           ca.NeuronDeepLift(model, model.relu).attribute(xs, 1, custom_attribution_func=func))
    _close(ours.NeuronDeepLiftShap(model, model.relu).attribute(xs, 2, dist, custom_attribution_func=func),
           ca.NeuronDeepLiftShap(model, model.relu).attribute(xs, 2, dist, custom_attribution_func=func))
    with pytest.raises(ours.NotComputedError, match="attribute_to_neuron_input"):
        ours.NeuronDeepLift(model, model.relu).attribute(xs, 1, custom_attribution_func=func,
                                                        attribute_to_neuron_input=True)
