"""camkit.compat.captum's local forms (``multiply_by_inputs=False``) and conductance's path points, against captum and formulas.

Each case runs on a float64 model whose gradient changes along the path (tanh after the layer), so
that the integration points matter.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import camkit
from camkit.compat.captum import attr as ours
from camkit.compat.captum._support import (
    _reshape_and_sum,
    apply_gradient_requirements,
    approximation_parameters,
    undo_gradient_requirements,
)

ca = pytest.importorskip("captum.attr")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.act = nn.Tanh()
        self.fc = nn.Linear(3 * 16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(self.conv(x)).flatten(1))


@pytest.fixture
def net() -> nn.Module:
    torch.manual_seed(0)
    return _Net().double().eval()


@pytest.fixture
def x() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(2, 2, 4, 4, dtype=torch.float64)


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-6) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    torch.testing.assert_close(a, b, atol=atol, rtol=1e-5)


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_trapezoid", "riemann_left", "riemann_right", "riemann_middle"])
def test_layer_conductance_every_method_equals_captum(net, x, method):
    mine, my_delta = ours.LayerConductance(net, net.conv).attribute(
        x, target=1, n_steps=7, method=method, return_convergence_delta=True)
    theirs, delta = ca.LayerConductance(net, net.conv).attribute(
        x, target=1, n_steps=7, method=method, return_convergence_delta=True)
    _close(mine, theirs, atol=1e-5)
    _close(my_delta, delta, atol=1e-5)


def test_camkit_conductance_gap_is_against_the_path_ends_for_every_rule(net, x):
    # Gauss-Legendre's points leave out both ends: the gap is sum(raw) - (S(x) - S(0)), not zero
    e = camkit.LayerConductance(net, "conv", steps=3, rule="gausslegendre").explain(x, 1)
    with torch.no_grad():
        whole = net(x)[:, 1] - net(torch.zeros_like(x))[:, 1]
    torch.testing.assert_close(e.extras["completeness_gap"].double(), e.raw.double().flatten(1).sum(1) - whole,
                               atol=1e-5, rtol=0)
    assert e.extras["completeness_gap"].abs().max() > 1e-3  # three inner points miss part of the path
    with pytest.raises(camkit.InvalidInputError):
        camkit.LayerConductance(net, "conv", rule="simpson")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["IntegratedGradients", "DeepLift"])
def test_local_form_equals_captum_and_times_the_change_gives_the_global_form(net, x, name):
    base = torch.full_like(x, 0.3)
    kwargs = {"n_steps": 9} if name == "IntegratedGradients" else {}
    local = getattr(ours, name)(net, multiply_by_inputs=False).attribute(x, base, target=2, **kwargs)
    theirs = getattr(ca, name)(net, multiply_by_inputs=False).attribute(x, base, target=2, **kwargs)
    _close(local, theirs, atol=1e-6)
    whole = getattr(ours, name)(net).attribute(x, base, target=2, **kwargs)
    _close(local * (x - base), whole, atol=1e-6)
    assert not getattr(ours, name)(net, multiply_by_inputs=False).multiplies_by_inputs


def test_local_form_delta_is_captums(net, x):
    mine = ours.IntegratedGradients(net, multiply_by_inputs=False).attribute(x, target=0, n_steps=5,
                                                                              return_convergence_delta=True)
    theirs = ca.IntegratedGradients(net, multiply_by_inputs=False).attribute(x, target=0, n_steps=5,
                                                                              return_convergence_delta=True)
    _close(mine[1], theirs[1], atol=1e-6)


def test_deepliftshap_local_form_equals_captum(net, x):
    torch.manual_seed(2)
    dist = torch.randn(3, 2, 4, 4, dtype=torch.float64)
    _close(ours.DeepLiftShap(net, multiply_by_inputs=False).attribute(x, dist, target=1),
           ca.DeepLiftShap(net, multiply_by_inputs=False).attribute(x, dist, target=1))


def test_gradient_shap_local_form_of_a_linear_model_is_its_weights():
    # every draw of a linear model has the same gradient, so captum's and camkit's draws agree exactly
    torch.manual_seed(0)
    lin = nn.Linear(5, 2).double()
    x, dist = torch.rand(3, 5, dtype=torch.float64), torch.rand(4, 5, dtype=torch.float64)
    local = ours.GradientShap(lin, multiply_by_inputs=False).attribute(x, dist, target=1, n_samples=6)
    _close(local, lin.weight[1].detach().expand(3, 5))
    _close(local, ca.GradientShap(lin, multiply_by_inputs=False).attribute(x, dist, target=1, n_samples=6))


def test_layer_local_forms_equal_captum(net, x):
    _close(ours.LayerGradientXActivation(net, net.conv, multiply_by_inputs=False).attribute(x, target=0),
           ca.LayerGradientXActivation(net, net.conv, multiply_by_inputs=False).attribute(x, target=0))
    _close(ours.LayerIntegratedGradients(net, net.conv, multiply_by_inputs=False).attribute(x, target=0, n_steps=6),
           ca.LayerIntegratedGradients(net, net.conv, multiply_by_inputs=False).attribute(x, target=0, n_steps=6),
           atol=1e-6)
    _close(ours.NeuronIntegratedGradients(net, net.conv, multiply_by_inputs=False).attribute(x, (1, 2, 2), n_steps=6),
           ca.NeuronIntegratedGradients(net, net.conv, multiply_by_inputs=False).attribute(x, (1, 2, 2), n_steps=6))


def test_grad_kwargs_materialising_unused_gradients_is_accepted_others_refused(net, x):
    _close(ours.LayerConductance(net, net.conv).attribute(x, target=0, n_steps=4, grad_kwargs={"materialize_grads": True}),
           ours.LayerConductance(net, net.conv).attribute(x, target=0, n_steps=4))
    with pytest.raises(ours.NotComputedError, match="grad_kwargs"):
        ours.LayerGradientXActivation(net, net.conv).attribute(x, target=0, grad_kwargs={"retain_graph": True})


def test_captum_private_helpers_its_tests_import():
    sizes, alphas = approximation_parameters("gausslegendre")
    assert alphas(2) == pytest.approx([0.5 - 0.5 / 3**0.5, 0.5 + 0.5 / 3**0.5]) and sizes(2) == pytest.approx([0.5, 0.5])
    sizes, alphas = approximation_parameters("riemann_trapezoid")
    assert alphas(3) == pytest.approx([0.0, 0.5, 1.0]) and sizes(3) == pytest.approx([0.25, 0.5, 0.25])
    with pytest.raises(ValueError, match="simpson"):
        approximation_parameters("simpson")
    rows = torch.arange(12.0).reshape(6, 2)  # 3 steps of 2 examples
    assert _reshape_and_sum(rows, 3, 2, (2,)).tolist() == [[12.0, 15.0], [18.0, 21.0]]
    a, b = torch.zeros(2), torch.zeros(2, requires_grad=True)
    flags = apply_gradient_requirements((a, b))
    assert a.requires_grad and flags == [False, True]
    undo_gradient_requirements((a, b), flags)
    assert not a.requires_grad and b.requires_grad


def test_deeplift_through_two_activations_in_a_row_sums_where_captums_does_not(x):
    # captum's hooks give a ReLU followed by a tanh the wrong multiplier: its attributions miss
    # f(x) - f(x0) by about 0.1 here; camkit's Rescale rule on each call keeps the sum exact
    torch.manual_seed(0)
    stacked = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Tanh(), nn.Flatten(), nn.Linear(48, 3))
    stacked = stacked.double().eval()
    base = torch.full_like(x, 0.3)
    _, mine = ours.DeepLift(stacked).attribute(x, base, target=2, return_convergence_delta=True)
    _, theirs = ca.DeepLift(stacked).attribute(x, base, target=2, return_convergence_delta=True)
    assert mine.abs().max() < 1e-6
    assert theirs.abs().min() > 1e-2


def test_slice_and_callable_neuron_selectors_equal_captum(net, x):
    for selector in ((slice(0, 2), 1, slice(None)), lambda out: out[:, 1, 2:, :2].sum(dim=(1, 2))):
        _close(ours.NeuronGradient(net, net.act).attribute(x, selector),
               ca.NeuronGradient(net, net.act).attribute(x, selector))
        _close(ours.NeuronIntegratedGradients(net, net.act).attribute(x, selector, n_steps=5),
               ca.NeuronIntegratedGradients(net, net.act).attribute(x, selector, n_steps=5))
    # a selector that returns one value for the batch: each example's own value, whose gradient is captum's
    _close(ours.NeuronGradient(net, net.act).attribute(x, lambda out: out[:, 0].sum()),
           ca.NeuronGradient(net, net.act).attribute(x, lambda out: out[:, 0].sum()))
    with pytest.raises(AssertionError, match="one value per example"):
        ours.NeuronGradient(net, net.act).attribute(x, lambda out: out[:1, 0].sum(dim=(1, 2)))


def test_neuron_of_a_layer_whose_output_is_changed_in_place_later():
    # the ReLU(inplace=True) after the linear layer overwrites its output; the neuron is the value before
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 2)).double()
    x = torch.tensor([[-2.0, 0.5, 1.0]], dtype=torch.float64)
    weight = seq[0].weight.detach()
    for unit in range(4):
        _close(ours.NeuronGradient(seq, seq[0]).attribute(x, (unit,)), weight[unit : unit + 1])
        flat = nn.Sequential(nn.Flatten(), *seq)  # camkit's explainers take [B, C, *S]: x as [1, 3, 1]
        e = camkit.Saliency(flat).explain(x[:, :, None], target=camkit.NeuronTarget(seq[0], unit))
        _close(e.raw[:, :, 0], weight[unit : unit + 1])


def test_forward_layer_eval_reads_the_layer_with_its_graph(net, x):
    from camkit.compat.captum._support import _forward_layer_eval

    leaf = x.clone().requires_grad_(True)
    (out,) = _forward_layer_eval(net, leaf, net.conv, grad_enabled=True)
    torch.testing.assert_close(out.detach(), net.conv(x).detach())
    assert out.requires_grad
    (inp,) = _forward_layer_eval(net, x, net.act, attribute_to_layer_input=True)
    torch.testing.assert_close(inp, net.conv(x).detach())
    assert not inp.requires_grad


def test_gradient_shap_gap_of_each_draw_by_hand(net, x):
    torch.manual_seed(3)
    dist = torch.randn(4, 2, 4, 4, dtype=torch.float64)
    e = camkit.GradientShap(net, dist, samples=3, stdev=0.1, seed=5, draw_gaps=True).explain(x, 1)
    gaps = e.extras["draw_gaps"]
    assert gaps.shape == (2, 3)
    index, alphas, noise = camkit.GradientShap(net, dist, samples=3, stdev=0.1).draws(x, 5)
    for i in range(2):
        for d in range(3):
            noisy, base = x[i] + noise[d], dist[index[d]]
            point = (base + alphas[d] * (noisy - base)).unsqueeze(0).requires_grad_(True)
            (grad,) = torch.autograd.grad(net(point)[0, 1], point)
            with torch.no_grad():
                want = ((noisy - base) * grad[0]).sum() - (net(noisy[None])[0, 1] - net(base[None])[0, 1])
            assert gaps[i, d].item() == pytest.approx(want.item(), abs=1e-5)


def test_gradient_shap_delta_per_draw_in_captums_layout():
    # a linear model: every draw is exact, so each of the B * n_samples deltas is zero, as captum's
    torch.manual_seed(0)
    lin = nn.Linear(5, 2).double()
    x, dist = torch.rand(3, 5, dtype=torch.float64), torch.rand(4, 5, dtype=torch.float64)
    attr, delta = ours.GradientShap(lin).attribute(x, dist, n_samples=7, stdevs=0.2, target=0, return_convergence_delta=True)
    _, theirs = ca.GradientShap(lin).attribute(x, dist, n_samples=7, stdevs=0.2, target=0, return_convergence_delta=True)
    assert attr.shape == x.shape and delta.shape == theirs.shape == (21,) and delta.dtype == theirs.dtype
    assert delta.abs().max() < 1e-5 and theirs.abs().max() < 1e-5
    with pytest.raises(ours.NotComputedError, match="multiply_by_inputs=False"):
        ours.GradientShap(lin, multiply_by_inputs=False).attribute(x, dist, target=0, return_convergence_delta=True)


def test_lrp_passes_relevance_through_tanh_as_captum():
    torch.manual_seed(0)
    tanh_net = nn.Sequential(nn.Linear(4, 5, bias=False), nn.Tanh(), nn.Linear(5, 2, bias=False)).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    mine = ours.LRP(tanh_net).attribute(x, target=1)
    _close(mine, ca.LRP(tanh_net).attribute(x, target=1))
    # bias-free: the pass rule conserves relevance, so each row sums to the score
    torch.testing.assert_close(mine.sum(dim=1), tanh_net(x)[:, 1].detach(), atol=1e-6, rtol=0)
    plain = camkit.LRP(nn.Sequential(nn.Flatten(), tanh_net), "epsilon", epsilon=1e-9)
    with pytest.warns(camkit.NoRuleWarning, match="tanh"):
        gradient = plain.explain(x[:, :, None], target=1).raw[:, :, 0]  # the default keeps tanh's gradient
    assert not torch.allclose(gradient.double(), mine, atol=1e-3)
    with pytest.raises(camkit.InvalidInputError, match="activations"):
        camkit.LRP(tanh_net, activations="identity")  # type: ignore[arg-type]


def test_lrp_convergence_delta_is_captums_score_minus_relevance():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2)).double()  # biases absorb relevance
    x = torch.randn(3, 4, dtype=torch.float64)
    mine, delta = ours.LRP(net).attribute(x, target=1, return_convergence_delta=True)
    theirs, their_delta = ca.LRP(net).attribute(x, target=1, return_convergence_delta=True)
    _close(mine, theirs)
    assert float(their_delta.abs().max()) > 1e-3  # a case where the sign shows
    torch.testing.assert_close(delta, their_delta, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(delta, net(x)[:, 1].detach() - mine.sum(dim=1), atol=1e-6, rtol=1e-5)


def test_lrp_of_two_summed_inputs_shares_relevance_where_captum_duplicates_it():
    # the model adds its two inputs first; captum gives each summand the whole relevance of the sum,
    # camkit shares it in proportion to the summands (here 1 : 3), so the two together carry it once
    torch.manual_seed(0)
    lin = nn.Linear(3, 2, bias=False).double()

    class Summed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return self.lin(a + b)

    a = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    inputs = (a, 3 * a)
    mine = ours.LRP(Summed()).attribute(inputs, target=0)
    theirs = ca.LRP(Summed()).attribute(inputs, target=0)
    score = Summed()(*inputs)[0, 0].item()
    _close(3 * mine[0], mine[1])
    assert (mine[0] + mine[1]).sum().item() == pytest.approx(score, abs=1e-6)
    _close(theirs[0], theirs[1])
    assert (theirs[0] + theirs[1]).sum().item() == pytest.approx(2 * score, abs=1e-6)


def test_lrp_identity_rule_on_a_weighted_layer_equals_captum():
    # IdentityRule on a square linear layer hands the relevance of its outputs to its inputs value by value
    torch.manual_seed(0)
    theirs_rules = pytest.importorskip("captum.attr._utils.lrp_rules")

    def model(identity: type, epsilon: type) -> nn.Module:
        torch.manual_seed(1)
        net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2, bias=False)).double()
        net[0].rule, net[2].rule = identity(), epsilon()
        return net

    x = torch.rand(4, 3, dtype=torch.float64) + 0.1
    mine, delta = ours.LRP(model(ours.IdentityRule, ours.EpsilonRule)).attribute(x, target=1, return_convergence_delta=True)
    theirs, their_delta = ca.LRP(model(theirs_rules.IdentityRule, theirs_rules.EpsilonRule)).attribute(
        x, target=1, return_convergence_delta=True)
    _close(mine, theirs.detach())
    _close(delta, their_delta.detach())
    # by hand: the relevance of the hidden units (epsilon on the last layer, no bias: h * w) passes unchanged
    net = model(ours.IdentityRule, ours.EpsilonRule)
    hidden = net[1](net[0](x)).detach()
    torch.testing.assert_close(mine, hidden * net[2].weight[1].detach(), atol=1e-9, rtol=1e-6)
    assert not any(hasattr(m, "activations") or m._forward_hooks for m in net.modules())
    wide = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    wide[0].rule = ours.IdentityRule()
    with pytest.raises(camkit.InvalidInputError, match="input's shape"):
        ours.LRP(wide).attribute(x.float())


class _RowZero(nn.Module):
    """One output row for the whole batch: the first example's."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.lin, self.relu = nn.Linear(3, 3), nn.ReLU()
        nn.init.constant_(self.lin.bias, 1.0)  # every unit active on inputs in [0, 1]

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.relu(self.lin(t))[0].unsqueeze(0)


@pytest.mark.parametrize("name", ["LRP", "Saliency", "InputXGradient", "GuidedBackprop", "Deconvolution"])
def test_a_model_with_one_output_for_the_batch_equals_captum(name):
    # captum takes the gradient of the one output with respect to every example: the others get zeros here
    model = _RowZero().double()
    x = torch.rand(3, 3, dtype=torch.float64) + 0.1
    state = {k: v.clone() for k, v in model.state_dict().items()}
    mine = getattr(ours, name)(model).attribute(x, target=2)
    theirs = getattr(ca, name)(model).attribute(x, target=2)
    _close(mine, theirs.detach())
    assert mine[0].abs().sum() > 0 and not mine[1:].any()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert not x.requires_grad and all(p.grad is None for p in model.parameters())
    with pytest.raises(AssertionError, match="one target"):
        getattr(ours, name)(model).attribute(x, target=[0, 1, 2])
    with pytest.raises(camkit.InvalidTargetError, match="one row per example"):  # methods with a path refuse
        ours.IntegratedGradients(model).attribute(x, target=2)


class _ReluCNN(nn.Module):
    """conv-relu-conv-relu-linear: captum's LRP wants leaf modules, so the flattening is a call."""

    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.c1, self.r1 = nn.Conv2d(2, 3, 3, bias=bias), nn.ReLU()
        self.c2, self.r2 = nn.Conv2d(3, 4, 3, bias=bias), nn.ReLU()
        self.fc = nn.Linear(16, 3, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.r2(self.c2(self.r1(self.c1(x)))).flatten(1))


def _cnn_with_rules(bias: bool, rule: type, layers: tuple[str, ...], **settings: float) -> nn.Module:
    torch.manual_seed(0)
    model = _ReluCNN(bias).double().eval()
    for name in layers:
        getattr(model, name).rule = rule(**settings)
    return model


@pytest.mark.parametrize(("rule", "settings"), [("GammaRule", {"gamma": 0.25}), ("Alpha1_Beta0_Rule", {})])
def test_lrp_gamma_and_alpha1beta0_equal_captum_to_rounding_where_the_rules_agree(rule, settings):
    # bias-free, non-negative inputs, the rules on the two convolutions (their outputs that carry
    # relevance are positive): captum's weight-only rules are the published ones there, and the
    # stabiliser is captum's 1e-9 on both sides (camkit's default 1e-6 shows at about 1e-7 here)
    rules = pytest.importorskip("captum.attr._utils.lrp_rules")
    x = torch.rand(3, 2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    target = torch.tensor([0, 1, 2])
    mine = ours.LRP(_cnn_with_rules(False, getattr(ours, rule), ("c1", "c2"), **settings)).attribute(x, target=target)
    theirs = ca.LRP(_cnn_with_rules(False, getattr(rules, rule), ("c1", "c2"), **settings)).attribute(x, target=target)
    assert float(theirs.abs().max()) > 1e-3
    _close(mine, theirs.detach(), atol=1e-12)


# one linear layer, score z = w.x + b; each case: (rule, w, b, x, the published rule's relevance by
# hand, captum's by hand). gamma 0.25: w' = w + 0.25 w+.
_HAND_CASES = {
    # Montavon et al. 2019: the bias is the weight of a constant input, b' = b + 0.25 b+ = 0.625;
    # z = 1.5, R = x w' z / (x.w' + b') = (2.5, -1) * 1.5 / 2.125; captum keeps b (/ 2.0)
    "gamma, positive bias": ("GammaRule", (2.0, -1.0), 0.5, (1.0, 1.0), (30 / 17, -12 / 17), (1.875, -0.75)),
    # a negative input: the contributions (2, 1) are both positive, the rule scales both by 1.25
    # (the generalised rule, as zennit's); captum scales the positive weight only, (2, 1.25) / 3.25 * 3
    "gamma, negative input": ("GammaRule", (-2.0, 1.0), 0.0, (-1.0, 1.0), (2.0, 1.0), (24 / 13, 15 / 13)),
    # a negative score z = -1: the rule favours the negative contributions, (1, -2.5) / -1.5 * -1;
    # captum favours the positive weights against the score's sign, (1.25, -2) / -0.75 * -1
    "gamma, negative score": ("GammaRule", (1.0, -2.0), 0.0, (1.0, 1.0), (2 / 3, -5 / 3), (5 / 3, -8 / 3)),
    # Bach et al. 2015: R = z * x w+ / (x.w+ + b+) with z = 0.5: (2, 0) / 2 * 0.5; captum keeps the
    # negative bias in the denominator, (2, 0) / 1.5 * 0.5, which is more than the score
    "alpha1beta0, negative bias": ("Alpha1_Beta0_Rule", (2.0, -1.0), -0.5, (1.0, 1.0), (0.5, 0.0), (2 / 3, 0.0)),
    # contributions split by sign: (-1)(-2) = 2 is positive; captum drops it with the negative weight
    "alpha1beta0, negative input": ("Alpha1_Beta0_Rule", (-2.0, 1.0), 0.0, (-1.0, 1.0), (2.0, 1.0), (0.0, 3.0)),
}


@pytest.mark.parametrize("case", list(_HAND_CASES))
def test_lrp_gamma_and_alpha1beta0_keep_the_published_rules_where_captum_departs(case):
    rules = pytest.importorskip("captum.attr._utils.lrp_rules")
    rule, weight, bias, inputs, published, captums = _HAND_CASES[case]

    def layer(rule_type: type) -> nn.Module:
        model = nn.Sequential(nn.Linear(2, 1)).double()
        with torch.no_grad():
            model[0].weight.copy_(torch.tensor([weight]))
            model[0].bias.fill_(bias)
        model[0].rule = rule_type()
        return model

    x = torch.tensor([inputs], dtype=torch.float64)
    mine = ours.LRP(layer(getattr(ours, rule))).attribute(x.clone(), target=0)
    theirs = ca.LRP(layer(getattr(rules, rule))).attribute(x.clone(), target=0).detach()
    _close(mine, torch.tensor([published], dtype=torch.float64), atol=1e-8)
    _close(theirs, torch.tensor([captums], dtype=torch.float64), atol=1e-8)
    assert float((mine - theirs).abs().max()) > 0.1


@pytest.mark.parametrize("rule", ["GammaRule", "Alpha1_Beta0_Rule"])
def test_lrp_gamma_and_alpha1beta0_on_a_cnn_equal_zennit(rule):
    # the case where captum differs most: biases, inputs of both signs, the rule on every layer
    # (the last one's scores of both signs); camkit's rules are zennit's Gamma and AlphaBeta
    zennit = pytest.importorskip("zennit")
    from zennit.attribution import Gradient
    from zennit.composites import NameMapComposite

    x = torch.randn(3, 2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    target = torch.tensor([0, 1, 2])
    model = _cnn_with_rules(True, getattr(ours, rule), ("c1", "c2", "fc"))
    mine = ours.LRP(model).attribute(x, target=target)
    zrule = zennit.rules.Gamma(gamma=0.25, stabilizer=1e-9) if rule == "GammaRule" else zennit.rules.AlphaBeta(
        alpha=1.0, beta=0.0, stabilizer=1e-9)
    twin = _ReluCNN(True).double().eval()
    twin.load_state_dict(model.state_dict())
    with Gradient(twin, NameMapComposite([(["c1", "c2", "fc"], zrule)])) as attributor:
        _, theirs = attributor(x, lambda out: out * torch.nn.functional.one_hot(target, 3).to(out))
    _close(mine, theirs, atol=1e-10)
    assert not any(hasattr(m, "activations") or m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("name", ["NeuronGradient", "NeuronFeatureAblation"])
def test_a_neuron_index_longer_than_the_layer_raises_captums_assertion_error_and_leaves_no_hook(net, x, name):
    wrong = (9999,) * 20  # more indices than the layer has axes: captum asserts
    with pytest.raises(AssertionError):
        getattr(ca, name)(net, net.conv).attribute(x, neuron_selector=wrong)
    with pytest.raises(AssertionError) as mine:
        getattr(ours, name)(net, net.conv).attribute(x, neuron_selector=wrong)
    assert isinstance(mine.value, camkit.InvalidTargetError)  # camkit's error family too
    for module in net.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks and not module._backward_hooks


def test_set_deep_layer_value_replaces_a_nested_module():
    from camkit.compat.captum._support import _get_deep_layer_name, _set_deep_layer_value

    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    replacement = nn.Tanh()
    _set_deep_layer_value(model, "0.1", replacement)
    assert _get_deep_layer_name(model, "0.1") is replacement and model[0][1] is replacement
