"""DeepLift, DeepLiftShap, GradientShap and LRP: hand-computed values, conservation, every spelling, captum parity."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from models import ResBlockNet, TinyNet, tiny_input
from torch import Tensor, nn

import camkit
from camkit import functional as CF
from camkit._internal import syncs as _syncs

# ---------------------------------------------------------------------------------------------
# A fixed-weight net small enough to propagate by hand (the one of test_pixel.py):
#   input [B, 1, 1, 2] -> flatten -> z = W1 x + b1 -> h = relu(z) -> scores = W2 h
#   W1 = [[1, 2], [3, -1]], b1 = [0, -2], W2 = [[1, -2], [-1, 1]]; class 1 uses W2[1] = [-1, 1].
# ---------------------------------------------------------------------------------------------


class HandNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, 2)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(2, 2, bias=False)
        with torch.no_grad():
            self.fc1.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, -1.0]]))
            self.fc1.bias.copy_(torch.tensor([0.0, -2.0]))
            self.fc2.weight.copy_(torch.tensor([[1.0, -2.0], [-1.0, 1.0]]))

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.relu(self.fc1(x.flatten(1))))


HAND_X = torch.tensor([[[[1.0, 4.0]]], [[[2.0, 1.0]]]])

# DeepLift, class 1, multipliers m = (h - h0) / (z - z0) per hidden unit, raw = (x - x0) * W1^T (W2[1] * m):
# baseline 0: z0 = b1 = [0, -2], h0 = [0, 0].
#   x1 = [1, 4]: z = [9, -3], h = [9, 0] -> m = [9/9, 0/(-1)] = [1, 0] -> W1^T [-1, 0] = [-1, -2] -> raw [-1, -8]
#   x2 = [2, 1]: z = [4, 3], h = [4, 3] -> m = [1, 3/5] -> W1^T [-1, 0.6] = [0.8, -2.6] -> raw [1.6, -2.6]
# baseline 1: z0 = [3, 0], h0 = [3, 0]; score(x0) = -3.
#   x1: dz = [6, -3], dh = [6, 0] -> m = [1, 0] -> [-1, -2] * (x1 - 1 = [0, 3]) = [0, -6]   (sum -6 = -9 - (-3))
#   x2: dz = [1, 3], dh = [1, 3] -> m = [1, 1] -> W1^T [-1, 1] = [2, -3] * [1, 0] = [2, 0]    (sum 2 = -1 - (-3))
DEEPLIFT_ZERO = [[-1.0, -8.0], [1.6, -2.6]]
DEEPLIFT_ONE = [[0.0, -6.0], [2.0, 0.0]]


def _raw(explanation: camkit.Explanation) -> Tensor:
    assert isinstance(explanation.raw, Tensor)
    return explanation.raw


@pytest.mark.parametrize(("baseline", "expected", "base_scores"), [(0.0, DEEPLIFT_ZERO, 0.0), (1.0, DEEPLIFT_ONE, -3.0)])
def test_deeplift_hand_computed(baseline, expected, base_scores):
    explanation = camkit.DeepLift(HandNet(), baseline=baseline).explain(HAND_X, 1)
    torch.testing.assert_close(_raw(explanation), torch.tensor(expected).view(2, 1, 1, 2))
    torch.testing.assert_close(explanation.scores, torch.tensor([-9.0, -1.0]))
    torch.testing.assert_close(explanation.extras["baseline_scores"], torch.full((2,), base_scores))
    torch.testing.assert_close(explanation.extras["delta"], torch.zeros(2), atol=1e-6, rtol=0)


def test_deepliftshap_is_the_mean_over_baselines_by_hand():
    baselines = torch.stack([torch.zeros(1, 1, 2), torch.ones(1, 1, 2)])
    explanation = camkit.DeepLiftShap(HandNet(), baselines).explain(HAND_X, 1)
    expected = (torch.tensor(DEEPLIFT_ZERO) + torch.tensor(DEEPLIFT_ONE)) / 2
    torch.testing.assert_close(_raw(explanation), expected.view(2, 1, 1, 2))
    torch.testing.assert_close(explanation.extras["baseline_scores"], torch.full((2,), -1.5))
    torch.testing.assert_close(explanation.extras["delta"], torch.zeros(2), atol=1e-6, rtol=0)
    assert explanation.extras["baselines"] == 2


def test_rescale_multiplier_falls_back_to_the_slope():
    x, x0 = torch.tensor([1.0, 2.0, -1.0]), torch.tensor([1.0, -2.0, -1.0 + 1e-12])
    m = CF.rescale_multiplier(x - x0, x.relu() - x0.relu(), (x > 0).float())
    assert m.tolist() == [1.0, 0.5, 0.0]  # unchanged input: the slope; else (2 - 0) / 4


ACTIVATIONS = {
    "relu": (lambda t, inplace: F.relu(t, inplace=inplace), lambda t: (t > 0).float()),
    "relu6": (lambda t, inplace: F.relu6(t, inplace=inplace), lambda t: ((t > 0) & (t < 6)).float()),
    "leaky_relu": (lambda t, inplace: F.leaky_relu(t, 0.1, inplace=inplace), lambda t: torch.where(t > 0, 1.0, 0.1)),
    "elu": (lambda t, inplace: F.elu(t, inplace=inplace), lambda t: torch.where(t > 0, 1.0, t.exp())),
    "silu": (lambda t, inplace: F.silu(t, inplace=inplace), None),
}


class WeightedActivation(nn.Module):
    """``score_k = sum(w_k * act(x))``: its DeepLift multipliers at the input are ``w_k * m``, m the activation's."""

    def __init__(self, name: str, inplace: bool) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.act, self.inplace = ACTIVATIONS[name][0], inplace
        self.weight = nn.Parameter(torch.randn(2, 3 * 4 * 4))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(self.act(x * 4.0, self.inplace).flatten(1), self.weight)


@pytest.mark.parametrize("reads", ["free", "syncing"])
@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_deeplift_multipliers_are_the_quotient_or_the_slope_where_the_input_did_not_move(name, inplace, reads, monkeypatch):
    if reads == "syncing":  # the device path: no early read of the smallest input change, the mask always built
        monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: False)
    torch.manual_seed(6)
    x = torch.randn(2, 3, 4, 4)
    x0 = torch.randn(1, 3, 4, 4)
    x[0, :, :2] = x0[0, :, :2]  # the top half of image 0 equals the baseline: there x - x0 = 0 exactly
    explainer = camkit.DeepLift(WeightedActivation(name, inplace), baseline=x0)
    _, _, _, multipliers = explainer._multipliers(x, x0, torch.tensor([1, 0]))
    z, z0 = x * 4.0, x0 * 4.0
    fn = lambda t: ACTIVATIONS[name][0](t.clone(), False)  # noqa: E731
    slope_fn = ACTIVATIONS[name][1]
    if slope_fn is None:
        leaf = z.clone().requires_grad_(True)
        (slope,) = torch.autograd.grad(fn(leaf).sum(), leaf)
    else:
        slope = slope_fn(z)
    m = CF.rescale_multiplier(z - z0, fn(z) - fn(z0), slope)
    weights = explainer.model.weight.detach()[torch.tensor([1, 0])].view(2, 3, 4, 4)
    torch.testing.assert_close(multipliers, 4.0 * weights * m, atol=1e-5, rtol=1e-5)
    # where the input did not move, the multiplier is the activation's slope, not 0/0
    torch.testing.assert_close(multipliers[0, :, :2], 4.0 * weights[0, :, :2] * slope[0, :, :2], atol=1e-6, rtol=1e-6)
    assert torch.isfinite(multipliers).all()


@pytest.mark.parametrize("reads", ["free", "syncing"])
def test_deeplift_max_pool_multipliers_route_the_plain_gradient_where_the_input_did_not_move(reads, monkeypatch):
    if reads == "syncing":
        monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: False)
    torch.manual_seed(7)
    x = torch.randn(1, 2, 4, 4)
    x0 = x.clone()
    x0[..., 2:] = torch.randn(1, 2, 4, 2)  # the left half did not move
    net = nn.Sequential(nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8, 1))
    explainer = camkit.DeepLift(net, baseline=x0)
    _, _, _, multipliers = explainer._multipliers(x, x0, 0)
    weights = net[2].weight.detach().view(1, 2, 2, 2)
    leaf = x.clone().requires_grad_(True)
    (plain,) = torch.autograd.grad(net(leaf).sum(), leaf)
    # left half: the plain gradient (the weight at each window's maximum); right half: change / input change
    torch.testing.assert_close(multipliers[..., :2], plain[..., :2])
    y, y0 = F.max_pool2d(x, 2), F.max_pool2d(x0, 2)
    per_window = ((x - x0) * multipliers)[..., 2:].reshape(1, 2, 2, 2, 2).sum(dim=(-2, -1))  # [1, C, window row]
    torch.testing.assert_close(per_window, (weights * (y - y0))[..., 1])  # each window passes w * (y - y0)
    assert (per_window.abs() > 1e-3).all()


# ---------------------------------------------------------------------------------------------
# DeepLift: summation-to-delta and every activation spelling
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [TinyNet(), ResBlockNet(), ResBlockNet(inplace=False)], ids=["tiny", "res-inplace", "res"])
def test_deeplift_sums_to_the_score_difference(model):
    model.eval()
    x = tiny_input()
    targets = torch.tensor([[0, 2], [3, 1], [1, 1]])
    explanation = camkit.DeepLift(model, baseline=torch.full((3, 1, 1), 0.3)).explain(x, targets)
    raw = _raw(explanation)
    difference = explanation.scores - explanation.extras["baseline_scores"]
    assert difference.abs().min() > 1e-2, "a degenerate case: the score barely moves"
    torch.testing.assert_close(raw.sum(dim=(2, 3, 4)), difference, atol=1e-5, rtol=1e-5)
    # ... which the plain input x gradient does not do
    plain = camkit.InputXGradient(model).explain(x - 0.3, targets)
    assert (_raw(plain).sum(dim=(2, 3, 4)) - difference).abs().max() > 1e-3


SPELLINGS = {
    "nn.ReLU": lambda m, t: m.act(t),
    "nn.ReLU(inplace)": lambda m, t: m.act_inplace(t),
    "F.relu": F.relu,
    "F.relu(inplace)": lambda m, t: F.relu(t, inplace=True),
    "F.relu_": lambda m, t: F.relu_(t),
    "torch.relu": lambda m, t: torch.relu(t),
    "torch.relu_": lambda m, t: torch.relu_(t),
    "Tensor.relu": lambda m, t: t.relu(),
    "Tensor.relu_": lambda m, t: t.relu_(),
}


class SpellingNet(nn.Module):
    def __init__(self, spelling: str) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.spelling = spelling
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 5, 3, padding=1)
        self.fc = nn.Linear(5, 4)
        self.act, self.act_inplace = nn.ReLU(), nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        relu = SPELLINGS[self.spelling]
        x = relu(self, self.conv1(x)) if self.spelling != "F.relu" else relu(self.conv1(x))
        x = relu(self, self.conv2(x)) if self.spelling != "F.relu" else relu(self.conv2(x))
        return self.fc(x.mean(dim=(2, 3)))


def test_deeplift_every_relu_spelling_gives_the_same_result():
    x, target = tiny_input(batch=2), torch.tensor([1, 3])
    reference = camkit.DeepLift(SpellingNet("nn.ReLU"), baseline=0.2).explain(x, target)
    torch.testing.assert_close(reference.extras["delta"], torch.zeros(2), atol=1e-5, rtol=0)
    plain = _raw(camkit.InputXGradient(SpellingNet("nn.ReLU")).explain(x - 0.2, target))
    assert (_raw(reference) - plain).abs().max() > 0.05 * plain.abs().max(), "the rule changed nothing"
    for spelling in SPELLINGS:
        raw = _raw(camkit.DeepLift(SpellingNet(spelling), baseline=0.2).explain(x, target))
        torch.testing.assert_close(raw, _raw(reference), atol=1e-6, rtol=0, msg=f"spelling {spelling} differs")


class SmoothNet(nn.Module):
    """Sigmoid, tanh, GELU and SiLU (as modules and functionals): all have a Rescale rule."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 3)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x: Tensor) -> Tensor:
        x = F.gelu(self.conv(x)).mean(dim=(2, 3))
        x = torch.tanh(self.fc1(x)) + F.silu(self.fc1(x)) + self.sigmoid(self.fc1(x))
        return self.fc2(x)


def test_deeplift_rescale_on_smooth_activations_sums_to_delta_without_warning():
    x = tiny_input()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        explanation = camkit.DeepLift(SmoothNet().eval(), baseline=0.5).explain(x, 1)
    torch.testing.assert_close(explanation.extras["delta"], torch.zeros(3), atol=1e-5, rtol=0)


class MaxPoolSoftmaxNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(16 * 4, 3)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return F.log_softmax(self.fc(x.flatten(1)), dim=1)  # softmax has a rule; log_softmax has none


def test_deeplift_warns_once_for_unruled_nonlinearities():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        camkit.DeepLift(MaxPoolSoftmaxNet().eval()).explain(tiny_input(), 0)
    rule_warnings = [w for w in caught if issubclass(w.category, camkit.NoRuleWarning)]
    assert len(rule_warnings) == 1
    message = str(rule_warnings[0].message)
    assert "log_softmax" in message and "plain gradient" in message and "max_pool2d" not in message
    assert issubclass(camkit.NoRuleWarning, camkit.CamkitWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        camkit.DeepLift(TinyNet().eval()).explain(tiny_input(), 0)


class MaxPoolNet(nn.Module):
    """Overlapping (3x3, stride 2, as in ResNet stems) and disjoint max-pooling, module and functional."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(8)
        self.conv1, self.conv2 = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.fc = nn.Linear(6 * 2 * 2, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def test_deeplift_max_pool_rule_sums_to_delta_where_captums_does_not():
    model, x = MaxPoolNet().eval(), tiny_input()
    explanation = camkit.DeepLift(model, baseline=torch.full((3, 8, 8), -0.2)).explain(x, 1)
    torch.testing.assert_close(explanation.extras["delta"], torch.zeros(3), atol=1e-5, rtol=0)
    captum_attr = pytest.importorskip("captum.attr")
    # captum has a max-pooling rule too, but even with disjoint 2x2 windows its attributions do
    # not sum to f(x) - f(x0) (its convergence delta is far from zero); camkit's do.
    disjoint = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(80, 3))
    disjoint.eval()
    ours = camkit.DeepLift(disjoint, baseline=-0.2).explain(x, 2)
    _, delta = captum_attr.DeepLift(copy.deepcopy(disjoint)).attribute(
        x.clone(), torch.full_like(x, -0.2), target=2, return_convergence_delta=True
    )
    torch.testing.assert_close(ours.extras["delta"], torch.zeros(3), atol=1e-5, rtol=0)
    assert delta.abs().max() > 1e-3


def test_deeplift_refuses_data_dependent_control_flow():
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x: Tensor) -> Tensor:
            h = x.mean(dim=(2, 3))
            if h.sum() > 0:  # the baseline (all zero) takes the other branch
                h = torch.relu(h)
            return self.fc(h)

    with pytest.raises(camkit.InvalidInputError, match="same activations in the same order"):
        camkit.DeepLift(Branchy().eval()).explain(torch.ones(1, 3, 4, 4), 0)


# ---------------------------------------------------------------------------------------------
# GradientShap
# ---------------------------------------------------------------------------------------------


def _mean_integrated_gradients(model: nn.Module, x: Tensor, baselines: Tensor, target: int) -> Tensor:
    """E_b[IG(x, b)]: GradientShap's expectation for stdev=0, by quadrature (24 Gauss-Legendre nodes)."""
    parts = [camkit.IntegratedGradients(model, steps=24, baseline=b).explain(x, target).raw for b in baselines]
    return torch.stack([_r for _r in parts if isinstance(_r, Tensor)]).mean(dim=0)


def _small_net() -> nn.Module:
    torch.manual_seed(4)
    return nn.Sequential(nn.Conv2d(2, 4, 2), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 2 * 2, 3), nn.Tanh(), nn.Linear(3, 2)).eval()


def test_gradientshap_seeded_converges_to_its_expectation():
    model = _small_net()
    g = torch.Generator().manual_seed(0)
    x, baselines = torch.randn(2, 2, 3, 3, generator=g), torch.randn(3, 2, 3, 3, generator=g)
    expected = _mean_integrated_gradients(model, x, baselines, 1)
    scale = expected.abs().max()
    explainer = camkit.GradientShap(model, baselines, samples=2000, seed=7, max_batch=4000)
    first = _raw(explainer.explain(x, 1))
    assert torch.equal(first, _raw(explainer.explain(x, 1))), "a seeded call is not reproducible"
    # Monte Carlo error: about 0.3 to 1.3 x scale at 4 samples (measured over seeds), so about
    # 1/sqrt(500) of that at 2000 samples; 0.1 x scale leaves room for the seed and fails at 4 samples.
    assert (first - expected).abs().max() < 0.1 * scale
    few = _raw(camkit.GradientShap(model, baselines, samples=4, seed=7).explain(x, 1))
    assert (few - expected).abs().max() > 0.1 * scale, "4 samples should not already be exact: the check is too loose"
    other_seed = _raw(camkit.GradientShap(model, baselines, samples=4, seed=8).explain(x, 1))
    assert not torch.equal(few, other_seed)


def test_gradientshap_without_noise_draws_none_and_keeps_the_other_draws():
    x = tiny_input(batch=2)
    bases = tiny_input(batch=3, seed=2)
    quiet, noisy = camkit.GradientShap(TinyNet(), bases, samples=5), camkit.GradientShap(TinyNet(), bases, samples=5, stdev=0.3)
    index0, alpha0, noise0 = quiet.draws(x, 7)
    index1, alpha1, noise1 = noisy.draws(x, 7)
    assert torch.equal(index0, index1) and torch.equal(alpha0, alpha1)  # the noise comes last from the generator
    assert noise0.shape == noise1.shape == (5, *x.shape[1:])
    assert noise0.stride() == (0, 0, 0, 0) and not noise0.any()  # a zero expanded: nothing drawn, nothing stored
    assert noise1.abs().max() > 0


def test_gradientshap_on_a_linear_model_is_exact_per_draw():
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 1, bias=False))
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[1.0, -3.0]]))
    # one baseline, no noise: every draw gives (x - b) * w whatever the path point
    explanation = camkit.GradientShap(net, torch.tensor([[[[1.0, -1.0]]]]), samples=5, seed=0).explain(
        torch.tensor([[[[2.0, 1.0]]]]), 0
    )
    torch.testing.assert_close(_raw(explanation), torch.tensor([[[[1.0, -6.0]]]]))


# ---------------------------------------------------------------------------------------------
# LRP: hand-computed rules on a two-layer net
#   x = [3, 1] -> z1 = W1 x, W1 = [[1, 1], [1, -1]] -> h = relu(z1) = [4, 2] -> score = W2 h = 8, W2 = [[1, 2]]
# ---------------------------------------------------------------------------------------------


def _lrp_net() -> nn.Module:
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False), nn.ReLU(), nn.Linear(2, 1, bias=False))
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[1.0, 1.0], [1.0, -1.0]]))
        net[3].weight.copy_(torch.tensor([[1.0, 2.0]]))
    return net


LRP_X = torch.tensor([[[[3.0, 1.0]]]])

LRP_CASES = {
    # epsilon = 1: s(z) = z + 1. Layer 2: R_h = h * W2 * 8 / 9 = [32/9, 32/9].
    # Layer 1: s(z1) = [5, 3]: R_x1 = 3 * (32/9) * (1/5 + 1/3) = 256/45; R_x2 = 1 * (32/9) * (1/5 - 1/3) = -64/135.
    "epsilon": (dict(rule="epsilon", epsilon=1.0), [256 / 45, -64 / 135]),
    # gamma = 0.5: W2g = [1.5, 3], zg2 = 12 -> R_h = [6, 6] * 8/12 = [4, 4]. W1g = [[1.5, 1.5], [1.5, -1]],
    # zg1 = [6, 3.5]: R_x1 = 3 * (1.5*4/6 + 1.5*4/3.5) = 57/7; R_x2 = 1 * (1.5*4/6 - 1*4/3.5) = -1/7. Sum 8.
    "gamma": (dict(rule="gamma", gamma=0.5, epsilon=0.0), [57 / 7, -1 / 7]),
    # z+: layer 2 all positive: R_h = [4, 4]. Layer 1 positive contributions: unit 1 (3, 1), z+ = 4;
    # unit 2 (3, -): z+ = 3 -> R_x1 = 3*4/4 + 3*4/3 = 7; R_x2 = 1*4/4 = 1. Sum 8.
    "zplus": (dict(rule="zplus", epsilon=0.0), [7.0, 1.0]),
    # alpha 2, beta 1: layer 2 has no negative contribution: R_h = 2 * [4, 4] = [8, 8]. Layer 1:
    # unit 1 all positive -> 2 * (3, 1)/4 * 8 = (12, 4); unit 2: 2 * (3, 0)/3 * 8 - 1 * (0, -1)/(-1) * 8 = (16, -8).
    "alphabeta": (dict(rule="alphabeta", alpha=2.0, beta=1.0, epsilon=0.0), [28.0, -4.0]),
    # epsilon-gamma-box: z-box on layer 1 (low -1, high 4), epsilon on layer 2 (a linear layer): R_h = [4, 4].
    # W+ = [[1, 1], [1, 0]], W- = [[0, 0], [0, -1]]; z_j = sum_i x_i w_ji - low w+_ji - high w-_ji:
    # unit 1: (3 + 1) + (1 + 1) = 6; unit 2: (3 + 1) + (-1 + 0 + 4) = 7.
    # R_x1 = 4 * 4/6 + 4 * 4/7 = 104/21; R_x2 = 2 * 4/6 + 3 * 4/7 = 64/21. Sum 8.
    "epsilongammabox": (dict(rule="epsilongammabox", low=-1.0, high=4.0, epsilon=0.0), [104 / 21, 64 / 21]),
}


@pytest.mark.parametrize("case", list(LRP_CASES))
def test_lrp_hand_computed(case):
    kwargs, expected = LRP_CASES[case]
    explanation = camkit.LRP(_lrp_net(), **kwargs).explain(LRP_X, 0)
    torch.testing.assert_close(_raw(explanation), torch.tensor(expected).view(1, 1, 1, 2))
    assert explanation.scores.tolist() == [8.0]
    torch.testing.assert_close(explanation.extras["delta"], _raw(explanation).sum(dim=(1, 2, 3)) - 8.0)


def test_lrp_epsilon_plus_uses_zplus_on_convs_and_epsilon_on_linear_layers():
    conv = nn.Sequential(nn.Conv2d(1, 2, (1, 2), bias=False), nn.ReLU(), nn.Flatten(), nn.Linear(2, 1, bias=False))
    with torch.no_grad():
        conv[0].weight.copy_(torch.tensor([[1.0, 1.0], [1.0, -1.0]]).view(2, 1, 1, 2))
        conv[3].weight.copy_(torch.tensor([[1.0, 2.0]]))
    # the same net as _lrp_net with its first layer a convolution: z+ there, epsilon (0) on the linear layer
    explanation = camkit.LRP(conv, "epsilonplus", epsilon=1e-9).explain(LRP_X, 0)
    torch.testing.assert_close(_raw(explanation), torch.tensor([[[[7.0, 1.0]]]]))


@pytest.mark.parametrize("rule", ["zplus", "alphabeta", "epsilonplus", "epsilonalpha2beta1"])
def test_lrp_sign_split_rules_skip_nothing_that_matters_after_relus(rule, monkeypatch):
    import camkit.methods.attribution._lrp_mode as lrp_module  # the rule mode, where the layers are read

    model, x = ResBlockNet().eval(), tiny_input(batch=2)
    calls: list[bool] = []
    real = lrp_module._known_non_negative

    def spy(a: Tensor) -> bool:
        calls.append(real(a))
        return calls[-1]

    monkeypatch.setattr(lrp_module, "_known_non_negative", spy)
    fast = _raw(camkit.LRP(model, rule).explain(x, 1))
    assert calls[0] is False and any(calls[1:]), "the image has negative values; later layers read ReLU outputs"
    monkeypatch.setattr(lrp_module, "_known_non_negative", lambda a: False)  # every convolution split by sign
    torch.testing.assert_close(fast, _raw(camkit.LRP(model, rule).explain(x, 1)), atol=1e-6, rtol=1e-5)


class BiasFreeResNet(nn.Module):
    """Bias-free residual CNN: conv, in-place ReLU, max-pool, residual add, functional ReLU, avg-pool, linear."""

    def __init__(self, positive: bool = False) -> None:
        super().__init__()
        torch.manual_seed(6)
        self.conv0 = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.relu = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(6, 6, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(6, 6, 3, padding=1, bias=False)
        self.fc = nn.Linear(6, 4, bias=False)
        if positive:
            with torch.no_grad():
                for p in self.parameters():
                    p.abs_()

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(self.relu(self.conv0(x)), 2)
        out = F.relu(self.conv1(x))
        out = self.conv2(out)
        out += x
        out = torch.relu(out)
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


def test_lrp_epsilon_conserves_relevance_as_epsilon_goes_to_zero():
    model, x = BiasFreeResNet().eval(), tiny_input()
    targets = torch.tensor([[0, 1], [2, 3], [1, 0]])
    tight = camkit.LRP(model, "epsilon", epsilon=1e-9).explain(x, targets)
    torch.testing.assert_close(_raw(tight).sum(dim=(2, 3, 4)), tight.scores, atol=1e-5, rtol=1e-4)
    loose = camkit.LRP(model, "epsilon", epsilon=0.5).explain(x, targets)
    assert (loose.extras["delta"].abs() > 1e-3).all(), "a large epsilon absorbs relevance"


def test_lrp_zplus_conserves_relevance_on_a_positive_net():
    model, x = BiasFreeResNet(positive=True).eval(), tiny_input().abs()
    explanation = camkit.LRP(model, "zplus", epsilon=1e-9).explain(x, 2)
    torch.testing.assert_close(_raw(explanation).sum(dim=(1, 2, 3)), explanation.scores, atol=1e-5, rtol=1e-4)
    assert (_raw(explanation) >= 0).all()


class FunctionalConvNet(nn.Module):
    """The layers of SpellingNet called through F.conv2d / F.linear with its parameters."""

    def __init__(self, inner: SpellingNet) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        m = self.inner
        x = torch.relu(F.conv2d(x, m.conv1.weight, m.conv1.bias, padding=1))
        x = F.relu(F.conv2d(x, m.conv2.weight, m.conv2.bias, padding=1), inplace=True)
        return F.linear(x.mean(dim=(2, 3)), m.fc.weight, m.fc.bias)


@pytest.mark.parametrize("rule", ["epsilon", "gamma", "epsilonplus", "epsilongammabox", "epsilonalpha2beta1"])
def test_lrp_rules_see_functional_layers_and_every_relu_spelling(rule):
    x, target = tiny_input(batch=2), torch.tensor([1, 3])
    modules = camkit.LRP(SpellingNet("nn.ReLU"), rule, epsilon=0.1).explain(x, target)
    functional = camkit.LRP(FunctionalConvNet(SpellingNet("Tensor.relu_")), rule, epsilon=0.1).explain(x, target)
    torch.testing.assert_close(_raw(functional), _raw(modules), atol=1e-6, rtol=1e-5)
    plain = _raw(camkit.InputXGradient(SpellingNet("nn.ReLU")).explain(x, target))
    assert (_raw(modules) - plain).abs().max() > 0.05 * plain.abs().max(), "the rule changed nothing"


def test_lrp_warns_for_unruled_nonlinearities_and_refuses_transposed_convs():
    with pytest.warns(camkit.NoRuleWarning, match=r"sigmoid.*silu.*tanh|gelu.*plain gradient"):
        camkit.LRP(SmoothNet().eval()).explain(tiny_input(), 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        camkit.LRP(TinyNet().eval(), "epsilonplus").explain(tiny_input(), 0)
        camkit.LRP(ResBlockNet().eval(), "epsilongammabox").explain(tiny_input(), 0)
    decoder = nn.Sequential(nn.ConvTranspose2d(3, 2, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    with pytest.raises(camkit.InvalidInputError, match="conv_transpose2d"):
        camkit.LRP(decoder).explain(tiny_input(), 0)
    with pytest.raises(camkit.InvalidInputError, match="alpha - beta = 1"):
        camkit.LRP(TinyNet(), "alphabeta", alpha=1.0, beta=1.0)
    with pytest.raises(camkit.InvalidInputError, match="rule must be one of"):
        camkit.LRP(TinyNet(), "zbox")  # type: ignore[arg-type]


def test_lrp_leaves_no_torch_function_mode_behind():
    model = TinyNet().eval()
    model.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        camkit.LRP(model, "epsilongammabox").explain(tiny_input(), 0)
    with pytest.raises(RuntimeError, match="boom"):
        camkit.DeepLift(model).explain(tiny_input(), 0)
    assert torch._C._len_torch_function_stack() == 0


def test_propagation_methods_on_device(device):
    model, x = TinyNet().eval().to(device), tiny_input().to(device)
    for explainer in (
        camkit.DeepLift(model),
        camkit.DeepLiftShap(model, torch.zeros(2, 3, 8, 8, device=device)),
        camkit.GradientShap(model, samples=2, seed=0),
        camkit.LRP(model, "epsilongammabox"),
    ):
        explanation = explainer.explain(x, 2)
        assert explanation.raw.device.type == device.type and explanation.maps.device.type == device.type


# ---------------------------------------------------------------------------------------------
# Parity with captum (skipped when captum is not installed)
# ---------------------------------------------------------------------------------------------


class ParityCNN(nn.Module):
    """conv-bn-relu-conv-relu-avgpool-linear in captum's favourite form (leaf modules only, no nn.Flatten)."""

    def __init__(self, relu: str = "module", bias: bool = True, bias_sign: float = 0.0, norm: bool = True) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.relu_kind = relu
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1, bias=bias)
        self.norm = norm
        self.bn = nn.BatchNorm2d(6)
        self.relu1 = nn.ReLU(inplace=relu == "inplace")
        self.conv2 = nn.Conv2d(6, 8, 3, padding=1, bias=bias)
        self.relu2 = nn.ReLU(inplace=relu == "inplace")
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5, bias=bias)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.2, 0.2)
            self.bn.running_var.uniform_(0.5, 1.5)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.2, 0.2)
            if bias_sign and bias:
                for layer in (self.conv1, self.conv2, self.fc):
                    layer.bias.copy_(bias_sign * (layer.bias.abs() + 0.05))

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(x)
        x = self.bn(x) if self.norm else x
        if self.relu_kind == "functional":
            x = F.relu(x)
            x = F.relu(self.conv2(x))
        else:
            x = self.relu1(x)
            x = self.relu2(self.conv2(x))
        return self.fc(torch.flatten(self.pool(x), 1))


PARITY_X = tiny_input(batch=3, seed=9)
PARITY_T = torch.tensor([1, 3, 0])


def _close(ours: Tensor, theirs: Tensor, tol: float = 1e-4) -> bool:
    return bool((ours - theirs).abs().max() <= tol * theirs.abs().max())


@pytest.mark.parametrize("relu", ["module", "inplace"])
def test_deeplift_matches_captum_on_relu_modules(relu):
    captum_attr = pytest.importorskip("captum.attr")
    model = ParityCNN(relu).eval()
    base = torch.full_like(PARITY_X, 0.2)
    ours = _raw(camkit.DeepLift(model, baseline=0.2).explain(PARITY_X, PARITY_T))
    theirs = captum_attr.DeepLift(copy.deepcopy(model)).attribute(PARITY_X.clone(), base, target=PARITY_T)
    assert _close(ours, theirs.detach())


def test_captum_deeplift_misses_functional_relus_and_breaks_summation_to_delta():
    captum_attr = pytest.importorskip("captum.attr")
    model = ParityCNN("functional").eval()
    ours = camkit.DeepLift(model).explain(PARITY_X, PARITY_T)
    theirs, delta = captum_attr.DeepLift(copy.deepcopy(model)).attribute(
        PARITY_X.clone(), torch.zeros_like(PARITY_X), target=PARITY_T, return_convergence_delta=True
    )
    # captum hooks nn.ReLU modules only: through F.relu it back-propagates the plain gradient,
    # so its attributions no longer sum to f(x) - f(0) ...
    assert delta.abs().max() > 1e-3
    torch.testing.assert_close(ours.extras["delta"], torch.zeros(3), atol=1e-5, rtol=0)
    # ... while the same weights with nn.ReLU modules give captum camkit's answer.
    module_net = ParityCNN("module").eval()
    fixed = captum_attr.DeepLift(module_net).attribute(PARITY_X.clone(), torch.zeros_like(PARITY_X), target=PARITY_T)
    assert _close(_raw(ours), fixed.detach())
    assert not _close(_raw(ours), theirs.detach(), tol=1e-2)


def test_captum_deeplift_refuses_a_relu_module_used_twice():
    captum_attr = pytest.importorskip("captum.attr")

    class Reused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(1)
            self.conv1, self.conv2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
            self.relu, self.fc = nn.ReLU(), nn.Linear(4, 3)

        def forward(self, x: Tensor) -> Tensor:
            return self.fc(self.relu(self.conv2(self.relu(self.conv1(x)))).mean(dim=(2, 3)))

    model = Reused().eval()
    ours = camkit.DeepLift(model).explain(PARITY_X, 2)
    torch.testing.assert_close(ours.extras["delta"], torch.zeros(3), atol=1e-5, rtol=0)
    with pytest.raises(RuntimeError, match="used more than once"):
        captum_attr.DeepLift(copy.deepcopy(model)).attribute(PARITY_X.clone(), target=2)


class ShapNet(nn.Module):
    """Every rule DeepLiftShap's shared passes must pair row by row: in-place and functional ReLU, GELU, max-pooling."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.conv1, self.bn = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6)
        self.conv2, self.conv3 = nn.Conv2d(6, 6, 3, padding=1), nn.Conv2d(6, 5, 3, padding=1)
        self.relu, self.pool, self.fc = nn.ReLU(inplace=True), nn.MaxPool2d(2), nn.Linear(5, 4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.2, 0.2)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(self.relu(self.bn(self.conv1(x))))
        x = F.relu(self.conv3(F.gelu(self.conv2(x))))
        return self.fc(x.mean(dim=(2, 3)))


def _passes(monkeypatch) -> list[tuple[int, int]]:
    """Record (image rows, baseline rows) of every DeepLift pass that follows."""
    seen: list[tuple[int, int]] = []
    run = camkit.DeepLift._multipliers

    def spy(self, x, base, target, images=None):
        seen.append((x.shape[0], base.shape[0]))
        return run(self, x, base, target, images)

    monkeypatch.setattr(camkit.DeepLift, "_multipliers", spy)
    return seen


def _same_explanation(ours: camkit.Explanation, reference: camkit.Explanation) -> None:
    torch.testing.assert_close(_raw(ours), _raw(reference), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours.scores, reference.scores, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours.extras["baseline_scores"], reference.extras["baseline_scores"], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours.extras["delta"], reference.extras["delta"], atol=1e-5, rtol=0)
    assert (ours.target is None) == (reference.target is None)
    if ours.target is not None:
        assert torch.equal(ours.target, reference.target)


SHAP_X, SHAP_BASES = tiny_input(batch=3, seed=5), tiny_input(batch=5, seed=6) * 0.5


@pytest.mark.parametrize(
    "target", [None, 2, [1, 0, 3], torch.tensor([3, 3, 1]), torch.tensor([[0, 2], [1, 3], [2, 2]])],
    ids=["top1", "int", "list", "tensor", "k-columns"],
)
def test_deepliftshap_shared_passes_equal_one_baseline_per_pass(target, monkeypatch):
    model = ShapNet().eval()
    reference = camkit.DeepLiftShap(model, SHAP_BASES, max_batch=1).explain(SHAP_X, target)
    passes = _passes(monkeypatch)
    shared = camkit.DeepLiftShap(model, SHAP_BASES, max_batch=7).explain(SHAP_X, target)
    assert passes == [(6, 2), (6, 2), (3, 1)]  # 7 // 3 = 2 baselines per pass: 2 + 2 + 1
    _same_explanation(shared, reference)
    # the shared passes keep DeepLiftShap's defining property: summation to score(x) - mean score(b)
    torch.testing.assert_close(shared.extras["delta"], torch.zeros_like(shared.extras["delta"]), atol=1e-5, rtol=0)


def test_deepliftshap_passes_one_baseline_at_a_time_where_sharing_is_unsafe(monkeypatch):
    bases = SHAP_BASES[:3]

    class Gated(ShapNet):
        def forward(self, x: Tensor, gate: Tensor | None = None) -> Tensor:
            out = super().forward(x)
            return out if gate is None else out * gate

    def callable_target(out: Tensor) -> Tensor:
        return out[:, 1] - out[:, 2]

    cases = {
        "callable target": (ShapNet().eval(), {"target": callable_target}, {}),
        "keyword inputs": (Gated().eval(), {"target": 1, "kwargs": {"gate": torch.tensor([1.0, 2.0, 3.0, 4.0])}}, {}),
        "training module": (ShapNet().train(), {"target": 1}, {"keep_mode": True}),
        "target rows": (ShapNet().eval(), {"target": torch.tensor([1, 2, 3, 0])}, {}),
    }
    for name, (model, call, options) in cases.items():
        passes = _passes(monkeypatch)
        explainer = camkit.DeepLiftShap(model, bases, max_batch=32, **options)
        if name == "target rows":  # four targets for three images: the usual error, from the plain path
            with pytest.raises(camkit.errors.InvalidTargetError):
                explainer.explain(SHAP_X, **call)
            assert passes == [(3, 1)], name
            continue
        shared = explainer.explain(SHAP_X, **call)
        assert passes == [(3, 1)] * 3, name
        monkeypatch.undo()
        one_by_one = camkit.DeepLiftShap(model, bases, max_batch=1, **options).explain(SHAP_X, **call)
        _same_explanation(shared, one_by_one)


def test_deepliftshap_shared_passes_on_a_model_that_moves_the_batch_dimension(monkeypatch):
    class Tokens(ShapNet):
        """Channels-first tokens [HW, B, C] through a ReLU: the reference's rows are no longer its first dim."""

        def forward(self, x: Tensor) -> Tensor:
            x = self.pool(self.relu(self.bn(self.conv1(x))))
            tokens = F.relu(x.flatten(2).permute(2, 0, 1) - 0.1)  # [HW, B, C]
            return self.fc(self.conv3(tokens.permute(1, 2, 0).unflatten(2, x.shape[2:])).mean(dim=(2, 3)))

    model = Tokens().eval()
    reference = camkit.DeepLiftShap(model, SHAP_BASES, max_batch=1).explain(SHAP_X, 1)
    passes = _passes(monkeypatch)
    shared = camkit.DeepLiftShap(model, SHAP_BASES, max_batch=9).explain(SHAP_X, 1)
    # 3 baselines per pass; the first try's reference [HW, 3, C] does not pair with [HW, 9, C], so each
    # pass runs again with each image's baseline in its own row
    assert passes == [(9, 3), (9, 9), (6, 2), (6, 6)]
    _same_explanation(shared, reference)


def test_deeplift_keeps_only_the_references_inputs_and_drops_each_after_use(monkeypatch):
    """With a baseline per image the reference pass is batch-sized: it keeps each activation's input, not its output
    too, and the main pass lets each record go once it has used it."""
    import camkit.methods.attribution.deeplift as deeplift

    handed: list[list] = []  # the records as the main pass received them
    modes: list[deeplift._RescaleMode] = []

    class Spy(deeplift._RescaleMode):
        def __init__(self, refs=None, *args, **kwargs) -> None:
            super().__init__(refs, *args, **kwargs)
            if refs is not None:
                handed.append(list(refs))
                modes.append(self)

    monkeypatch.setattr(deeplift, "_RescaleMode", Spy)
    model = ShapNet().eval()  # ReLU module, max-pooling, GELU and F.relu
    per_image = SHAP_BASES[:3]
    batch = camkit.DeepLift(model, baseline=per_image).explain(SHAP_X, 1)
    ((records,), (mode,)) = handed, modes
    assert [name for name, _, _ in records] == ["relu", "max_pool2d", "gelu", "relu"]
    for name, x0, pooled in records:
        assert x0.shape[0] == 3
        assert (pooled is None) == (name != "max_pool2d")  # pooling keeps its maxima and their positions
    assert mode.refs == [None] * 4  # nothing of the reference is held once the pass is over
    # the outputs at x0, now recomputed in the main pass, still give each image its own exact answer
    for i in range(3):
        one = camkit.DeepLift(model, baseline=per_image[i]).explain(SHAP_X[i : i + 1], 1)
        torch.testing.assert_close(_raw(batch)[i : i + 1], _raw(one), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(batch.extras["delta"], torch.zeros(3), atol=1e-5, rtol=0)


def test_deepliftshap_refuses_a_bad_max_batch():
    for bad in (0, -1, 2.0, True):
        with pytest.raises(camkit.errors.InvalidInputError, match="max_batch"):
            camkit.DeepLiftShap(ShapNet(), SHAP_BASES, max_batch=bad)


def test_deepliftshap_matches_captum():
    captum_attr = pytest.importorskip("captum.attr")
    model = ParityCNN().eval()
    baselines = tiny_input(batch=4, seed=3) * 0.5
    ours = _raw(camkit.DeepLiftShap(model, baselines).explain(PARITY_X, PARITY_T))
    theirs = captum_attr.DeepLiftShap(copy.deepcopy(model)).attribute(PARITY_X.clone(), baselines, target=PARITY_T)
    assert _close(ours, theirs.detach())


def test_gradientshap_agrees_with_captums_expectation():
    captum_attr = pytest.importorskip("captum.attr")
    import numpy as np

    model = _small_net()
    g = torch.Generator().manual_seed(1)
    x, baselines = torch.randn(2, 2, 3, 3, generator=g), torch.randn(3, 2, 3, 3, generator=g)
    expected = _mean_integrated_gradients(model, x, baselines, 0)
    scale = expected.abs().max()
    ours = _raw(camkit.GradientShap(model, baselines, samples=2000, seed=1, max_batch=4000).explain(x, 0))
    np.random.seed(0)
    torch.manual_seed(0)
    theirs = captum_attr.GradientShap(model).attribute(x, baselines, n_samples=2000, target=0).detach()
    assert (ours - expected).abs().max() < 0.1 * scale  # tolerance: see the test above
    assert (theirs - expected).abs().max() < 0.1 * scale
    # with noise both estimate the same (noisier) expectation: compare them with each other
    ours_noisy = _raw(camkit.GradientShap(model, baselines, samples=2000, stdev=0.3, seed=2, max_batch=4000).explain(x, 0))
    theirs_noisy = captum_attr.GradientShap(model).attribute(x, baselines, n_samples=2000, stdevs=0.3, target=0).detach()
    assert (ours_noisy - theirs_noisy).abs().max() < 0.15 * scale


@pytest.mark.parametrize("relu", ["module", "inplace", "functional"])
def test_lrp_epsilon_matches_captum(relu):
    captum_attr = pytest.importorskip("captum.attr")
    model = ParityCNN(relu).eval()
    ours = _raw(camkit.LRP(model, "epsilon", epsilon=1e-9).explain(PARITY_X, PARITY_T))
    theirs = captum_attr.LRP(copy.deepcopy(model)).attribute(PARITY_X.clone(), target=PARITY_T)
    # captum passes relevance through every ReLU unchanged, so it is right on F.relu too
    assert _close(ours, theirs.detach())


def _captum_lrp(model: nn.Module, rule_factory, x: Tensor, target: Tensor = PARITY_T) -> Tensor:
    captum_attr = pytest.importorskip("captum.attr")
    twin = copy.deepcopy(model)
    for layer in (twin.conv1, twin.conv2, twin.fc):
        layer.rule = rule_factory()
    return captum_attr.LRP(twin).attribute(x.clone(), target=target).detach()


def test_lrp_gamma_matches_captum_except_for_positive_biases_and_batch_norm():
    pytest.importorskip("captum.attr")
    from captum.attr._utils.lrp_rules import GammaRule

    # On non-negative inputs and positive scores: elsewhere camkit's gamma is the generalised rule
    # (as zennit's), which favours the contributions of the output's sign; captum's favours a w+.
    x = PARITY_X.abs()

    def both(model: nn.Module) -> tuple[Tensor, Tensor]:
        with torch.no_grad():  # positive scores: the last layer without bias, its sign turned where needed
            if model.fc.bias is not None:
                model.fc.bias.zero_()
            model.fc.weight.mul_(torch.where(model(x).max(dim=0).values > 0, 1.0, -1.0).unsqueeze(1))
        target = model(x).argmax(dim=1)
        assert (model(x).max(dim=1).values > 0).all()
        ours = _raw(camkit.LRP(model, "gamma", gamma=0.25, stabilizer=1e-9).explain(x, target))
        return ours, _captum_lrp(model, lambda: GammaRule(gamma=0.25), x, target)

    for bias, sign in ((False, 0.0), (True, -1.0)):
        assert _close(*both(ParityCNN(bias=bias, bias_sign=sign, norm=False).eval()))
    # captum scales the weights only; the gamma rule (Montavon et al. 2019, zennit) treats the
    # bias as the weight of a constant input and scales its positive part too: with positive
    # biases the two differ.
    assert not _close(*both(ParityCNN(bias=True, bias_sign=1.0, norm=False).eval()), tol=1e-2)
    # camkit merges the batch norm into the convolution before it and applies the rule to the
    # merged layer (as zennit does); captum applies the epsilon rule to the batch norm on its own.
    assert not _close(*both(ParityCNN(bias=False).eval()), tol=1e-2)


def test_lrp_alpha1beta0_matches_captum_except_for_negative_inputs_and_biases():
    pytest.importorskip("captum.attr")
    from captum.attr._utils.lrp_rules import Alpha1_Beta0_Rule

    x = PARITY_X.abs()
    for bias, sign in ((False, 0.0), (True, 1.0)):
        model = ParityCNN(bias=bias, bias_sign=sign, norm=False).eval()
        ours = _raw(camkit.LRP(model, "alphabeta", alpha=1.0, beta=0.0, stabilizer=1e-9).explain(x, PARITY_T))
        assert _close(ours, _captum_lrp(model, Alpha1_Beta0_Rule, x))
    # captum clamps the weights and keeps the whole bias in the denominator, so a negative bias
    # (a negative contribution) enters the positive part's normaliser, and a negative input times
    # a negative weight (a positive contribution) is dropped; camkit splits contributions by sign.
    model = ParityCNN(bias=True, bias_sign=-1.0, norm=False).eval()
    ours = _raw(camkit.LRP(model, "alphabeta", alpha=1.0, beta=0.0, stabilizer=1e-9).explain(x, PARITY_T))
    assert not _close(ours, _captum_lrp(model, Alpha1_Beta0_Rule, x), tol=1e-2)


def test_captum_lrp_duplicates_relevance_at_residual_additions():
    captum_attr = pytest.importorskip("captum.attr")
    model, x, target = BiasFreeResNet().eval(), tiny_input(), torch.tensor([0, 2, 3])
    ours = camkit.LRP(model, "epsilon", epsilon=1e-9).explain(x, target)
    theirs = captum_attr.LRP(copy.deepcopy(model)).attribute(x.clone(), target=target).detach()
    # A bias-free ReLU net conserves relevance under the epsilon rule as epsilon -> 0: the
    # input relevances sum to the score. camkit's do; captum has no rule for `out += x` and
    # its gradient hands both summands the whole relevance, so its sums overshoot.
    torch.testing.assert_close(_raw(ours).sum(dim=(1, 2, 3)), ours.scores, atol=1e-6, rtol=1e-4)
    assert ((theirs.sum(dim=(1, 2, 3)) - ours.scores).abs() > 0.2 * ours.scores.abs()).all()


def test_deeplift_and_lrp_callable_target_is_linear_in_the_classes():
    model, x = TinyNet().eval(), tiny_input()
    contrast = camkit.DeepLift(model, baseline=0.1).explain(x, lambda out: out[:, 2] - out[:, 0])
    by_class = [_raw(camkit.DeepLift(model, baseline=0.1).explain(x, c)) for c in (2, 0)]
    torch.testing.assert_close(_raw(contrast), by_class[0] - by_class[1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(contrast.extras["delta"], torch.zeros(3), atol=1e-5, rtol=0)
    assert contrast.target is None
    lrp = camkit.LRP(model, "epsilon").explain(x, lambda out: out[:, 2] - out[:, 0])
    lrp_by_class = [_raw(camkit.LRP(model, "epsilon").explain(x, c)) for c in (2, 0)]
    torch.testing.assert_close(_raw(lrp), lrp_by_class[0] - lrp_by_class[1], atol=1e-6, rtol=1e-5)
