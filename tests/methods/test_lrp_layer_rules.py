"""LRP with rules per layer (``layer_rules``): hand values, names or modules, clear errors, no hooks left."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import camkit


def _net(second: list[float]) -> nn.Sequential:
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False), nn.ReLU(), nn.Linear(2, 1, bias=False)).double()
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[1.0, 1.0], [1.0, -1.0]]))
        net[3].weight.copy_(torch.tensor([second]))
    return net


X = torch.tensor([[[3.0, 1.0]]], dtype=torch.float64)


def test_a_rule_on_one_layer_by_hand():
    # h = [4, 2]; the last layer (epsilon) gives R_h = [4, 4]. z+ on the first: unit 0 shares 4 as 3:1,
    # unit 1 keeps only its positive contribution 3 * 1: R_x = [3, 1] + [4, 0]
    net = _net([1.0, 2.0])
    plain = camkit.LRP(net, "epsilon", epsilon=0.0).explain(X, 0).raw
    torch.testing.assert_close(plain[0, 0].double(), torch.tensor([9.0, -1.0], dtype=torch.float64))
    mixed = camkit.LRP(net, "epsilon", epsilon=0.0, stabilizer=0.0, layer_rules={"1": "zplus"}).explain(X, 0).raw
    torch.testing.assert_close(mixed[0, 0].double(), torch.tensor([7.0, 1.0], dtype=torch.float64))


def test_a_rule_with_its_own_settings_by_module():
    # the last layer with gamma = 1: weights [2, -0.5] on h = [4, 2], contributions [8, -1], so
    # R_h = 3 [8, -1] / 7; the first layer (epsilon) shares them as 3:1 and 3:-1 over their sums 4 and 2
    net = _net([1.0, -0.5])
    e = camkit.LRP(net, "epsilon", epsilon=0.0, layer_rules={net[3]: {"rule": "gamma", "gamma": 1.0, "stabilizer": 0.0}}).explain(X, 0)
    torch.testing.assert_close(e.raw[0, 0].double(), torch.tensor([27 / 14, 15 / 14], dtype=torch.float64))
    assert abs(float(e.extras["delta"][0])) < 1e-9  # conserved: the score is 3
    for module in net.modules():  # the rules' bookkeeping is gone after the call
        assert not module._forward_hooks and not module._forward_pre_hooks


def test_the_innermost_module_named_wins():
    net = _net([1.0, 2.0])
    outer = nn.Sequential(net)
    nested = camkit.LRP(outer, "epsilon", epsilon=0.0, stabilizer=0.0, layer_rules={"0": "zplus", "0.3": "epsilon"}).explain(X, 0)
    only_first = camkit.LRP(net, "zplus", epsilon=0.0, stabilizer=0.0, layer_rules={"3": "epsilon"}).explain(X, 0)
    torch.testing.assert_close(nested.raw, only_first.raw)
    torch.testing.assert_close(nested.raw[0, 0].double(), torch.tensor([7.0, 1.0], dtype=torch.float64))


def test_bad_layer_rules_are_refused():
    net = _net([1.0, 2.0])
    with pytest.raises(camkit.InvalidInputError, match="no module named"):
        camkit.LRP(net, layer_rules={"9": "zplus"})
    with pytest.raises(camkit.InvalidInputError, match="not a module of the model"):
        camkit.LRP(net, layer_rules={nn.Linear(2, 2): "zplus"})
    with pytest.raises(camkit.InvalidInputError, match="must be one of"):
        camkit.LRP(net, layer_rules={"1": "epsilongammabox"})
    with pytest.raises(camkit.InvalidInputError, match="must be one of"):
        camkit.LRP(net, layer_rules={"1": {"rule": "gamma", "gama": 1.0}})
    with pytest.raises(camkit.InvalidInputError, match="alpha - beta"):
        camkit.LRP(net, layer_rules={"1": {"rule": "alphabeta", "alpha": 3.0}})


def test_the_pass_rule_hands_each_value_its_relevance_by_hand():
    # h = [4, 2] and R_h = [4, 4] under epsilon on the last layer; "pass" on a square first layer hands
    # R_h to x value by value, so R_x = [4, 4] whatever its weights (the epsilon rule gives [9, -1])
    net = _net([1.0, 2.0])
    e = camkit.LRP(net, "epsilon", epsilon=0.0, layer_rules={"1": "pass"}).explain(X, 0)
    torch.testing.assert_close(e.raw[0, 0].double(), torch.tensor([4.0, 4.0], dtype=torch.float64))
    assert float(e.extras["delta"][0]) == pytest.approx(0.0, abs=1e-9)  # bias-free: conserved
    # x = [3, 0]: h = [3, 3], R_h = [3, 6]; the value 0 carries none of its 6 (relevance is x times the
    # modified gradient)
    x0 = X * torch.tensor([1.0, 0.0], dtype=torch.float64)
    zero = camkit.LRP(net, "epsilon", epsilon=0.0, layer_rules={"1": "pass"}).explain(x0, 0)
    torch.testing.assert_close(zero.raw[0, 0].double(), torch.tensor([3.0, 0.0], dtype=torch.float64))
    for module in net.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


def test_the_pass_rule_needs_a_layer_that_keeps_its_input_shape():
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 3, bias=False), nn.ReLU(), nn.Linear(3, 1, bias=False)).double()
    with pytest.raises(camkit.InvalidInputError, match="input's shape"):
        camkit.LRP(net, layer_rules={"1": "pass"}).explain(X, 0)
    with pytest.raises(camkit.InvalidInputError, match="must be one of"):
        camkit.LRP(net, "pass")  # type: ignore[arg-type]  # a rule for one layer, not for the whole model
