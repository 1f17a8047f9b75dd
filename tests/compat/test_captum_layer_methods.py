"""camkit.compat.captum's InternalInfluence, LayerGradientShap, LayerDeepLift(Shap), LayerFeatureAblation,
NeuronConductance and NeuronFeatureAblation (LayerIntegratedGradients on a list of layers: captum's own
multi-layer tests in the peer suite).

Each equals captum's own answer on a small float64 model (non-linear after the layers read), an
example's answer does not depend on its batch, the model is left as it was, and where a value is
easy to derive by hand the test derives it.
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

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.out(self.act(self.lin2(self.relu(self.lin1(x))))) * scale


@pytest.fixture
def net() -> nn.Module:
    torch.manual_seed(0)
    return _Net().double().eval()


@pytest.fixture
def x() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(3, 3, dtype=torch.float64)


def _untouched(net: nn.Module) -> None:
    assert all(p.grad is None for p in net.parameters())
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in net.modules())


CASES = {
    "InternalInfluence": lambda m, lib: lib.InternalInfluence(m, m.lin1).attribute(
        XS, baselines=0.5, target=1, n_steps=20),
    "LayerDeepLift": lambda m, lib: lib.LayerDeepLift(m, m.lin2).attribute(XS, baselines=0.3, target=0),
    "LayerDeepLiftShap": lambda m, lib: lib.LayerDeepLiftShap(m, m.lin1).attribute(XS, baselines=BASES, target=1),
    "LayerFeatureAblation": lambda m, lib: lib.LayerFeatureAblation(m, m.lin1).attribute(XS, target=0),
    "NeuronConductance": lambda m, lib: lib.NeuronConductance(m, m.lin1).attribute(
        XS, neuron_selector=2, target=1, n_steps=20, method="gausslegendre"),
    "NeuronFeatureAblation": lambda m, lib: lib.NeuronFeatureAblation(m, m.lin2).attribute(XS, neuron_selector=1),
}
torch.manual_seed(2)
XS = torch.randn(3, 3, dtype=torch.float64)
BASES = torch.randn(4, 3, dtype=torch.float64)


@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_captum(net, name):
    mine, theirs = CASES[name](net, ours), CASES[name](net, ca)
    mine = mine if isinstance(mine, (list, tuple)) else [mine]
    theirs = theirs if isinstance(theirs, (list, tuple)) else [theirs]
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    _untouched(net)


@pytest.mark.parametrize("name", sorted(CASES))
def test_batch_equals_one_by_one(net, name):
    global XS
    whole, full = CASES[name](net, ours), XS
    try:
        rows = []
        for i in range(full.shape[0]):
            XS = full[i : i + 1]
            rows.append(CASES[name](net, ours))
    finally:
        XS = full
    whole = whole if isinstance(whole, list) else [whole]
    rows_by_part = [[r if isinstance(r, list) else [r] for r in rows][i] for i in range(len(rows))]
    for k, part in enumerate(whole):
        torch.testing.assert_close(part, torch.cat([r[k] for r in rows_by_part]), atol=1e-9, rtol=1e-7)


def test_deltas_equal_captum(net):
    for cls, kwargs in (("LayerDeepLift", {"baselines": 0.3}), ("LayerDeepLiftShap", {"baselines": BASES})):
        a, d = getattr(ours, cls)(net, net.lin2).attribute(XS, target=0, return_convergence_delta=True, **kwargs)
        b, e = getattr(ca, cls)(net, net.lin2).attribute(XS, target=0, return_convergence_delta=True, **kwargs)
        torch.testing.assert_close(a, b)
        assert d.shape == e.shape
        torch.testing.assert_close(d, e, atol=1e-6, rtol=1e-5)


def test_internal_influence_on_a_linear_tail_is_the_downstream_weights():
    # after lin1 the model is linear: dS/da is the constant row of W_out @ W_2, whatever the path
    net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2, bias=False)).double()
    found = ours.InternalInfluence(net, net[0]).attribute(XS, target=1, n_steps=5, method="riemann_middle")
    torch.testing.assert_close(found, net[1].weight[1].detach().expand(3, 4))


def test_internal_influence_integrates_a_relu_step_exactly_where_captum_falls_short():
    # captum's test_simple_with_baseline_internal_inf: units 1-3 of linear1 are x1 + 1, active on
    # 81 of the path's 100 units (x1 from -20 to 80); the integral is 0.81. camkit's trapezoid gets
    # it; captum's weights sum to (n - 1)/n and its test expects 0.8 within 0.01.
    from captum.testing.helpers.basic_models import BasicModel_MultiLayer

    net = BasicModel_MultiLayer()
    inp, base = torch.tensor([[0.0, 80.0, 0.0]]), torch.tensor([[0.0, -20.0, 0.0]])
    found = ours.InternalInfluence(net, net.linear1).attribute(inp, baselines=base, target=0, n_steps=500,
                                                               method="riemann_trapezoid")
    torch.testing.assert_close(found, torch.tensor([[0.70, 0.81, 0.81, 0.81]]), atol=2e-3, rtol=0)


def test_layer_gradient_shap_is_exact_on_a_linear_model():
    # linear: dS/da = w, so every draw gives w * (a(x') - a(b)); without noise and with one baseline, exactly
    net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2, bias=False)).double()
    base = torch.randn(1, 3, dtype=torch.float64)
    found, delta = ours.LayerGradientShap(net, net[0]).attribute(XS, base, n_samples=4, target=0,
                                                                return_convergence_delta=True)
    expected = net[1].weight[0].detach() * (net[0](XS) - net[0](base)).detach()
    torch.testing.assert_close(found, expected)
    assert delta.shape == (3 * 4,)
    torch.testing.assert_close(delta, torch.zeros_like(delta), atol=1e-6, rtol=0)


def test_layer_gradient_shap_equals_captum_after_the_same_seeds(net):
    # captum's draws (numpy's and torch's global generators), so the same seeds give the same answer
    # (tests/compat/test_captum_shap_draws.py has the other forms)
    answers = []
    for lib in (ours, ca):
        np.random.seed(3)
        torch.manual_seed(3)
        answers.append(lib.LayerGradientShap(net, net.lin1).attribute(XS, BASES, n_samples=6, stdevs=0.1, target=1))
    torch.testing.assert_close(answers[0], answers[1], atol=1e-7, rtol=1e-5)


def test_training_flag_and_inputs_are_left_alone(net):
    net.train()
    before = XS.clone()
    ours.LayerDeepLift(net, net.lin1).attribute(XS, target=0)
    ours.NeuronConductance(net, net.lin1).attribute(XS, neuron_selector=0, target=0, n_steps=4)
    assert net.training and all(m.training for m in net.modules())
    assert torch.equal(XS, before) and not XS.requires_grad
    _untouched(net)
