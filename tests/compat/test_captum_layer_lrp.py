"""camkit.compat.captum's LayerLRP: captum's relevance at a layer, computed by camkit's LRP.

Equal to captum's on small float64 models (a layer's output and its input, captum's rule objects,
a list of layers with a delta each); the relevance at a layer of a linear chain by hand.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from camkit.compat.captum import attr as ours

ca = pytest.importorskip("captum.attr")
rules = pytest.importorskip("captum.attr._utils.lrp_rules")


class _Cnn(nn.Module):
    """conv, relu, conv, relu, linear (flattened in forward: captum has no rule for an nn.Flatten module)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Conv2d(3, 2, 1), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def __getitem__(self, index: int) -> nn.Module:
        return self.head if index == 5 else self.body[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return _Cnn().double().eval()


def _close(mine, theirs) -> None:
    pairs = list(zip(mine, theirs)) if isinstance(mine, (list, tuple)) else [(mine, theirs)]
    for m, t in pairs:
        assert m.shape == t.shape and m.dtype == t.dtype
        torch.testing.assert_close(m, t, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("to_input", [False, True])
def test_layer_lrp_equals_captum_at_a_convolution(to_input):
    torch.manual_seed(1)
    x = torch.randn(2, 2, 4, 4, dtype=torch.float64)
    before = x.clone()
    answers = []
    for lib, rule_set in ((ours, ours), (ca, rules)):
        net = _cnn()
        net[0].rule = rule_set.GammaRule(gamma=0.5)  # below the layer: no part in its relevance
        net[5].rule = rule_set.EpsilonRule(epsilon=0.5)
        answers.append(lib.LayerLRP(net, net[2]).attribute(x, target=[0, 2], return_convergence_delta=True,
                                                           attribute_to_layer_input=to_input))
        assert all(p.grad is None for p in net.parameters())
        assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in net.modules())
    (mine, delta), (theirs, their_delta) = answers
    _close(mine, theirs)
    _close(delta, their_delta)
    assert torch.equal(x, before)


def test_layer_lrp_of_a_list_of_layers_equals_captum_with_a_delta_each():
    torch.manual_seed(2)
    x = torch.randn(3, 2, 4, 4, dtype=torch.float64)
    net = _cnn()
    layers = [net[0], net[2], net[5]]
    mine, deltas = ours.LayerLRP(net, layers).attribute(x, target=1, return_convergence_delta=True)
    theirs, their_deltas = ca.LayerLRP(net, layers).attribute(x, target=1, return_convergence_delta=True)
    assert isinstance(mine, list) and len(mine) == len(deltas) == 3
    _close(mine, theirs)
    _close(deltas, their_deltas)


def test_layer_lrp_of_a_linear_chain_by_hand():
    # x -> W1 x (no bias) -> relu -> w2 . h: with the epsilon rule and no bias, each hidden unit's
    # relevance is its contribution w2_j h_j to the score, and they sum to the score (delta 0)
    net = nn.Sequential(nn.Linear(3, 2, bias=False), nn.ReLU(), nn.Linear(2, 1, bias=False)).double()
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, 0.0, 2.0], [-1.0, 1.0, 1.0]]))
        net[2].weight.copy_(torch.tensor([[3.0, -2.0]]))
    x = torch.tensor([[1.0, 2.0, 0.5], [0.0, 1.0, 3.0]], dtype=torch.float64)
    found, delta = ours.LayerLRP(net, net[1]).attribute(x, target=0, return_convergence_delta=True)
    hidden = torch.relu(x @ net[0].weight.detach().T)
    torch.testing.assert_close(found, hidden * net[2].weight.detach()[0])
    torch.testing.assert_close(delta, torch.zeros(2, dtype=torch.float64), atol=1e-7, rtol=0)


def test_layer_lrp_refuses_what_captum_refuses():
    net = _cnn()
    net[0].rule = 1
    with pytest.raises(TypeError):
        ours.LayerLRP(net, net[0])
    net = _cnn()
    net.add_module("extra", nn.Sigmoid())
    with pytest.raises(TypeError):
        ours.LayerLRP(net, net[0]).attribute(torch.randn(1, 2, 4, 4, dtype=torch.float64), target=0)
