"""camkit.compat.captum against captum 0.9.0 on the same small float64 CNN: equal attributions, shapes and dtypes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from camkit.compat.captum import attr as ours
from camkit.compat.captum import metrics as our_metrics

ca = pytest.importorskip("captum.attr")
cm = pytest.importorskip("captum.metrics")


class _CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.relu(self.conv(x))).flatten(1))


@pytest.fixture
def cnn() -> nn.Module:
    torch.manual_seed(0)
    return _CNN().double().eval()


@pytest.fixture
def x() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(3, 2, 6, 6, dtype=torch.float64)


def _same(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-6) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    torch.testing.assert_close(a, b, atol=atol, rtol=1e-5)


@pytest.mark.parametrize("name", ["Saliency", "InputXGradient", "GuidedBackprop", "Deconvolution"])
def test_gradient_methods_equal_captum(cnn, x, name):
    target = torch.tensor([0, 2, 3])
    _same(getattr(ours, name)(cnn).attribute(x, target=target), getattr(ca, name)(cnn).attribute(x, target=target))


def test_saliency_signed_when_abs_false(cnn, x):
    _same(ours.Saliency(cnn).attribute(x, target=1, abs=False), ca.Saliency(cnn).attribute(x, target=1, abs=False))


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_middle", "riemann_left", "riemann_right"])
def test_integrated_gradients_equal_captum_with_delta(cnn, x, method):
    mine, my_delta = ours.IntegratedGradients(cnn).attribute(x, target=2, n_steps=16, method=method, return_convergence_delta=True)
    theirs, delta = ca.IntegratedGradients(cnn).attribute(x, target=2, n_steps=16, method=method, return_convergence_delta=True)
    _same(mine, theirs, atol=1e-5)
    _same(my_delta, delta, atol=1e-5)


def test_trapezoid_weights_sum_to_one_where_captums_sum_to_one_less_one_over_n():
    # captum's riemann_trapezoid weighs n points 1/n each (halved at the ends): the weights sum to
    # (n - 1) / n, so on a linear model, whose IG is exactly (x - b) * w, captum falls short by 1/n
    torch.manual_seed(0)
    net = nn.Linear(3, 2).double()
    x = torch.randn(2, 3, dtype=torch.float64)
    exact = x * net.weight[0].detach()
    mine = ours.IntegratedGradients(net).attribute(x, target=0, n_steps=5, method="riemann_trapezoid")
    theirs = ca.IntegratedGradients(net).attribute(x, target=0, n_steps=5, method="riemann_trapezoid")
    torch.testing.assert_close(mine, exact)
    torch.testing.assert_close(theirs, exact * 4 / 5)


def test_integrated_gradients_internal_batch_size_does_not_change_the_result(cnn, x):
    ig = ours.IntegratedGradients(cnn)
    _same(ig.attribute(x, target=1, n_steps=10, internal_batch_size=4), ig.attribute(x, target=1, n_steps=10))


def test_deeplift_and_deepliftshap_equal_captum(cnn, x):
    base = torch.full_like(x, 0.1)
    mine, my_delta = ours.DeepLift(cnn).attribute(x, base, target=1, return_convergence_delta=True)
    theirs, delta = ca.DeepLift(cnn).attribute(x, base, target=1, return_convergence_delta=True)
    _same(mine, theirs, atol=1e-5)
    assert my_delta.abs().max() < 1e-5 and delta.abs().max() < 1e-5
    dist = torch.randn(4, 2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    mine, my_deltas = ours.DeepLiftShap(cnn).attribute(x, dist, target=0, return_convergence_delta=True)
    theirs, deltas = ca.DeepLiftShap(cnn).attribute(x, dist, target=0, return_convergence_delta=True)
    _same(mine, theirs, atol=1e-5)
    assert my_deltas.shape == deltas.shape == (12,)
    torch.testing.assert_close(my_deltas, deltas, atol=1e-5, rtol=1e-4)


def test_gradient_shap_equals_captum_on_a_linear_model():
    # on a linear model every draw gives (x' - b) * w, so the random draws of each library agree exactly
    torch.manual_seed(0)
    net = nn.Linear(5, 3).double()
    x, base = torch.randn(2, 5, dtype=torch.float64), torch.randn(1, 5, dtype=torch.float64)
    mine = ours.GradientShap(net).attribute(x, base, n_samples=7, target=1)
    expected = (x - base) * net.weight[1].detach()
    torch.testing.assert_close(mine, expected)
    torch.testing.assert_close(ca.GradientShap(net).attribute(x, base, n_samples=7, target=1), expected)


def test_noise_tunnel_without_noise_is_the_method(cnn, x):
    plain = ours.Saliency(cnn).attribute(x, target=0)
    for kind in ("smoothgrad", "smoothgrad_sq", "vargrad"):
        smoothed = ours.NoiseTunnel(ours.Saliency(cnn)).attribute(x, nt_type=kind, nt_samples=3, stdevs=0.0, target=0)
        expected = {"smoothgrad": plain, "smoothgrad_sq": plain**2, "vargrad": torch.zeros_like(plain)}[kind]
        _same(smoothed, expected)


def test_noise_tunnel_noise_is_absolute_as_in_captum():
    # f(x) = x^2 on one number: SmoothGrad of the gradient 2x under N(0, s^2) noise has mean 2x and
    # smoothgrad_sq 4x^2 + 4s^2, whatever the example's range (one number has none)
    torch.manual_seed(0)
    x = torch.tensor([[3.0]], dtype=torch.float64)
    nt = ours.NoiseTunnel(ours.Saliency(lambda t: (t * t).sum(dim=1)))
    squared = nt.attribute(x, nt_type="smoothgrad_sq", nt_samples=4000, stdevs=0.5, abs=False)
    assert abs(squared.item() - (36.0 + 1.0)) < 1.5


def test_lrp_epsilon_equals_captum(cnn, x):
    mine, my_delta = ours.LRP(cnn).attribute(x, target=3, return_convergence_delta=True)
    theirs, delta = ca.LRP(cnn).attribute(x, target=3, return_convergence_delta=True)
    _same(mine, theirs, atol=1e-5)
    assert my_delta.shape == delta.shape


def test_guided_grad_cam_equals_captum(cnn, x):
    _same(ours.GuidedGradCam(cnn, cnn.conv).attribute(x, target=1), ca.GuidedGradCam(cnn, cnn.conv).attribute(x, target=1))


@pytest.mark.parametrize("relu", [False, True])
def test_layer_grad_cam_equals_captum(cnn, x, relu):
    mine = ours.LayerGradCam(cnn, cnn.conv).attribute(x, target=2, relu_attributions=relu)
    _same(mine, ca.LayerGradCam(cnn, cnn.conv).attribute(x, target=2, relu_attributions=relu))
    up = ours.LayerAttribution.interpolate(mine, (12, 12))
    _same(up, ca.LayerAttribution.interpolate(mine, (12, 12)))


def test_layer_methods_equal_captum(cnn, x):
    _same(ours.LayerActivation(cnn, cnn.relu).attribute(x), ca.LayerActivation(cnn, cnn.relu).attribute(x))
    _same(ours.LayerGradientXActivation(cnn, cnn.conv).attribute(x, target=0),
          ca.LayerGradientXActivation(cnn, cnn.conv).attribute(x, target=0))
    mine, my_delta = ours.LayerIntegratedGradients(cnn, cnn.conv).attribute(x, target=0, n_steps=12, return_convergence_delta=True)
    theirs, delta = ca.LayerIntegratedGradients(cnn, cnn.conv).attribute(x, target=0, n_steps=12, return_convergence_delta=True)
    _same(mine, theirs, atol=1e-5)
    _same(my_delta, delta, atol=1e-5)
    mine = ours.LayerConductance(cnn, cnn.relu).attribute(x, target=0, n_steps=12, method="riemann_trapezoid")
    _same(mine, ca.LayerConductance(cnn, cnn.relu).attribute(x, target=0, n_steps=12, method="riemann_trapezoid"), atol=1e-5)


def test_neuron_methods_equal_captum(cnn, x):
    for name in ("NeuronGradient", "NeuronGuidedBackprop", "NeuronDeconvolution"):
        mine = getattr(ours, name)(cnn, cnn.conv).attribute(x, (1, 2, 3))
        _same(mine, getattr(ca, name)(cnn, cnn.conv).attribute(x, (1, 2, 3)))
    mine = ours.NeuronIntegratedGradients(cnn, cnn.fc).attribute(x, (2,), n_steps=10)
    _same(mine, ca.NeuronIntegratedGradients(cnn, cnn.fc).attribute(x, (2,), n_steps=10), atol=1e-5)


def test_occlusion_and_feature_ablation_equal_captum(cnn, x):
    mine = ours.Occlusion(cnn).attribute(x, sliding_window_shapes=(2, 2, 2), strides=(2, 2, 2), target=1)
    theirs = ca.Occlusion(cnn).attribute(x, sliding_window_shapes=(2, 2, 2), strides=(2, 2, 2), target=1)
    assert theirs.dtype == torch.float32  # captum's occlusion of a float64 input comes back float32; camkit's keeps float64
    _same(mine, theirs.double(), atol=1e-6)
    mask = torch.arange(36).reshape(1, 1, 6, 6).expand(1, 2, 6, 6) // 9
    _same(ours.FeatureAblation(cnn).attribute(x, target=2, feature_mask=mask),
          ca.FeatureAblation(cnn).attribute(x, target=2, feature_mask=mask))
    small = x[:1, :, :2, :2]
    _same(ours.FeatureAblation(cnn).attribute(small, target=0), ca.FeatureAblation(cnn).attribute(small, target=0))


def test_shapley_values_of_a_linear_model_are_exact():
    torch.manual_seed(0)
    net = nn.Linear(4, 2).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    expected = x * net.weight[1].detach()
    torch.testing.assert_close(ours.ShapleyValueSampling(net).attribute(x, target=1, n_samples=5), expected)
    torch.testing.assert_close(ca.ShapleyValueSampling(net).attribute(x, target=1, n_samples=5).double(), expected)
    torch.testing.assert_close(ours.KernelShap(net).attribute(x, target=1, n_samples=200), expected, atol=1e-6, rtol=0)
    assert ours.Lime(net).attribute(x, target=1, n_samples=50).shape == x.shape


def test_metrics_equal_captum(cnn, x):
    attributions = ca.Saliency(cnn).attribute(x, target=1)

    @cm.infidelity_perturb_func_decorator(True)
    def theirs_perturb(inputs):
        return inputs * 0.9

    @our_metrics.infidelity_perturb_func_decorator(True)
    def mine_perturb(inputs):
        return inputs * 0.9

    mine = our_metrics.infidelity(cnn, mine_perturb, x, attributions, target=1, n_perturb_samples=3)
    theirs = cm.infidelity(cnn, theirs_perturb, x, attributions, target=1, n_perturb_samples=3)
    torch.testing.assert_close(mine.double(), theirs.double(), rtol=1e-5, atol=1e-8)

    def shift(inputs, radius):
        return inputs + radius

    explain = ours.Saliency(cnn).attribute
    mine = our_metrics.sensitivity_max(explain, x, perturb_func=shift, n_perturb_samples=2, target=1)
    theirs = cm.sensitivity_max(ca.Saliency(cnn).attribute, x, perturb_func=shift, n_perturb_samples=2, target=1)
    torch.testing.assert_close(mine.double(), theirs.double(), rtol=1e-5, atol=1e-8)
