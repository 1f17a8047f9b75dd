"""camkit.compat.captum's perturbation methods against captum 0.9.0 on float64 models: equal values, shapes, dtypes.

Where captum draws at random (Shapley orders, Lime and KernelShap samples), both sides draw from
torch's global generator in the same order, so the same seed gives the same estimate.
"""

from __future__ import annotations

import io
import itertools
import math
from contextlib import redirect_stderr

import pytest
import torch
from torch import nn

from camkit.compat.captum import _models as our_models
from camkit.compat.captum import attr as ours
from camkit.compat.captum import metrics as our_metrics
from camkit.compat.captum.attr import NotComputedError

ca = pytest.importorskip("captum.attr")
cm = pytest.importorskip("captum.metrics")


class _TwoInputs(nn.Module):
    """[B, 2, 4, 4] and [B, 5] to [B, 3], float64."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.fc = nn.Linear(2 * 16 + 5, 3)

    def forward(self, image: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([torch.tanh(self.conv(image)).flatten(1), vector], dim=1))


@pytest.fixture
def net() -> nn.Module:
    torch.manual_seed(0)
    return _TwoInputs().double().eval()


@pytest.fixture
def pair() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(2, 2, 4, 4, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)


def _close(mine, theirs, atol: float = 1e-6) -> None:
    for m, t in zip(mine if isinstance(mine, tuple) else (mine,), theirs if isinstance(theirs, tuple) else (theirs,)):
        assert m.shape == t.shape
        torch.testing.assert_close(m.double(), t.double(), atol=atol, rtol=1e-5)


def test_occlusion_windows_inside_channels_across_inputs_with_tensor_baselines(net, pair):
    base = (torch.full((1, 2, 4, 4), 0.5, dtype=torch.float64), torch.zeros(2, 5, dtype=torch.float64))
    kwargs = dict(sliding_window_shapes=((1, 2, 3), (2,)), strides=((1, 1, 2), 2), baselines=base, target=[0, 2],
                  perturbations_per_eval=3)
    before = tuple(t.clone() for t in pair)
    mine = ours.Occlusion(net).attribute(pair, **kwargs)
    theirs = ca.Occlusion(net).attribute(pair, **kwargs)
    assert mine[0].dtype == torch.float64 and theirs[0].dtype == torch.float32  # captum's weights are float32
    _close(mine, theirs, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(pair, before))


def test_occlusion_last_window_reaches_past_the_edge_as_captum_places_it():
    line = nn.Linear(5, 1).double()
    x = torch.arange(5.0, dtype=torch.float64)[None]
    mine = ours.Occlusion(line).attribute(x, sliding_window_shapes=(2,), strides=(2,), target=0)
    # windows at 0, 2 and 4 (the last covers position 4 only): each position's drop is w_i x_i times the
    # window's own other position; dividing by one window per position gives w_i x_i + w_j x_j per window
    w = line.weight.detach()[0]
    drops = torch.stack([(w * x[0])[0:2].sum(), (w * x[0])[2:4].sum(), (w * x[0])[4]])
    torch.testing.assert_close(mine[0], drops[torch.tensor([0, 0, 1, 1, 2])])


def test_feature_ablation_mask_grouped_across_inputs_equals_captum(net, pair):
    masks = (torch.arange(32).reshape(1, 2, 4, 4) % 5, torch.tensor([[0, 1, 7, 7, 3]]))
    for per_eval in (1, 4):
        mine = ours.FeatureAblation(net).attribute(pair, target=1, feature_mask=masks, perturbations_per_eval=per_eval)
        _close(mine, ca.FeatureAblation(net).attribute(pair, target=1, feature_mask=masks))


def test_feature_ablation_of_one_value_for_the_whole_batch(net, pair):
    total = lambda image, vector: net(image, vector).sum()  # noqa: E731
    mask = (torch.zeros(1, 2, 4, 4, dtype=torch.long), torch.tensor([[1, 1, 2, 2, 2]]))
    mine = ours.FeatureAblation(total).attribute(pair, feature_mask=mask)
    assert mine[0].shape == (1, 2, 4, 4)  # one attribution row: the output is one value
    _close(mine, ca.FeatureAblation(total).attribute(pair, feature_mask=mask))
    with pytest.raises(AssertionError):  # several perturbations per call need an output that grows with the batch
        ours.FeatureAblation(total).attribute(pair, feature_mask=mask, perturbations_per_eval=2)


def test_feature_ablation_keeps_integer_outputs_and_shows_progress():
    counts = lambda x: x.sum(dim=1, keepdim=True)  # noqa: E731
    x = torch.tensor([[1, 2, 3]])
    stream = io.StringIO()
    with redirect_stderr(stream):
        mine = ours.FeatureAblation(counts).attribute(x, target=0, show_progress=True)
    assert mine.dtype == torch.int64 and mine.tolist() == [[1, 2, 3]]
    assert "Feature Ablation attribution: 100%" in stream.getvalue()


def test_shapley_sampling_draws_captums_orders(net, pair):
    mask = (torch.arange(32).reshape(1, 2, 4, 4) // 8, torch.tensor([[4, 4, 5, 5, 5]]))
    torch.manual_seed(7)
    mine = ours.ShapleyValueSampling(net).attribute(pair, target=2, feature_mask=mask, n_samples=6,
                                                    perturbations_per_eval=2)
    torch.manual_seed(7)
    theirs = ca.ShapleyValueSampling(net).attribute(pair, target=2, feature_mask=mask, n_samples=6)
    assert mine[0].dtype == torch.float64
    _close(mine, theirs)


def test_exact_shapley_values_by_hand():
    game = lambda x: (x[:, 0] * x[:, 1] + x[:, 2])[:, None]  # noqa: E731
    x = torch.tensor([[2.0, 3.0, 5.0]], dtype=torch.float64)
    # v(S) on {a, b, c}: a and b share their product 6 (3 each), c adds 5 alone
    torch.testing.assert_close(ours.ShapleyValues(game).attribute(x, target=0),
                               torch.tensor([[3.0, 3.0, 5.0]], dtype=torch.float64))
    orders = list(itertools.permutations(range(3)))
    assert len(orders) == math.factorial(3)
    _close(ours.ShapleyValues(game).attribute(x, target=0), ca.ShapleyValues(game).attribute(x, target=0))


def test_kernel_shap_draws_captums_coalitions():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)).double()
    x = torch.randn(1, 4, dtype=torch.float64)
    torch.manual_seed(3)
    mine = ours.KernelShap(net).attribute(x, target=1, n_samples=40)
    torch.manual_seed(3)
    theirs = ca.KernelShap(net).attribute(x, target=1, n_samples=40)
    _close(mine, theirs, atol=1e-4)  # captum fits in float32
    coefs = ours.KernelShap(net).attribute(x, target=1, n_samples=40, return_input_shape=False)
    assert coefs.shape == (1, 4)


def test_lime_with_a_custom_model_and_kernel_draws_captums_samples():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    x = torch.randn(2, 5, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 2, 2]])
    ck = pytest.importorskip("captum._utils.models.linear_model")
    for mine_model, their_model in ((our_models.SkLearnLasso(alpha=0.002), ck.SkLearnLasso(alpha=0.002)),
                                    (our_models.SkLearnRidge(alpha=0.5), ck.SkLearnRidge(alpha=0.5))):
        torch.manual_seed(5)
        mine = ours.Lime(net, mine_model, ours._lime.get_exp_kernel_similarity_function("euclidean", 2.0)).attribute(
            x, target=0, feature_mask=mask, n_samples=30)
        torch.manual_seed(5)
        from captum.attr._core.lime import get_exp_kernel_similarity_function

        theirs = ca.Lime(net, their_model, get_exp_kernel_similarity_function("euclidean", 2.0)).attribute(
            x, target=0, feature_mask=mask, n_samples=30)
        _close(mine, theirs, atol=1e-4)


def test_lime_base_sampling_in_the_input_space():
    net = nn.Linear(3, 1).double()
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)

    def perturb(inputs, **kwargs):
        keep = torch.bernoulli(torch.full((1, 3), 0.5, dtype=torch.float64))
        return inputs * keep

    def to_interp(sample, inputs, **kwargs):
        return (sample != 0).double()

    model = our_models.SkLearnLinearRegression()
    torch.manual_seed(2)
    lime = ours.LimeBase(net, model, lambda *a, **k: 1.0, perturb, False, None, to_interp)
    coefs = lime.attribute(x, target=0, n_samples=40)
    torch.testing.assert_close(coefs[0], net.weight.detach()[0] * x[0])  # a linear model is fitted exactly


def test_weighted_lasso_equals_scikit_learn():
    linear_model = pytest.importorskip("sklearn.linear_model")
    g = torch.Generator().manual_seed(0)
    z = torch.randint(0, 2, (40, 6), generator=g).double()
    y = z @ torch.tensor([3.0, -2.0, 0.0, 0.5, 0.0, 1.0], dtype=torch.float64) + 0.1 * torch.randn(40, generator=g)
    w = torch.rand(40, generator=g, dtype=torch.float64)
    coef, intercept = our_models.weighted_lasso_fit(z, y, w, 0.05)
    fitted = linear_model.Lasso(alpha=0.05, tol=1e-12, max_iter=100000).fit(z.numpy(), y.numpy(), sample_weight=w.numpy())
    torch.testing.assert_close(coef, torch.as_tensor(fitted.coef_), atol=1e-7, rtol=0)
    assert abs(intercept.item() - fitted.intercept_) < 1e-7
    named = our_models.SkLearnLinearModel("linear_model.Lasso", alpha=0.05, tol=1e-12, max_iter=100000)
    named.fit([(z, y, w)])
    torch.testing.assert_close(named.representation()[0].double(), coef, atol=1e-7, rtol=0)


def test_infidelity_with_baselines_and_any_perturbation_equals_captum(net, pair):
    attributions = ca.IntegratedGradients(net).attribute(pair, target=0, baselines=(pair[0] * 0 + 0.1, pair[1] * 0))

    def to_baseline(inputs, baselines):  # I = 1 everywhere, x' = the baseline: not a multiple of x - x'
        return tuple(torch.ones_like(t) for t in inputs), baselines

    base = (torch.full((1, 2, 4, 4), 0.1, dtype=torch.float64), torch.zeros(1, 5, dtype=torch.float64))
    mine = our_metrics.infidelity(net, to_baseline, pair, attributions, baselines=base, target=0, n_perturb_samples=3)
    theirs = cm.infidelity(net, to_baseline, pair, attributions, baselines=base, target=0, n_perturb_samples=3)
    torch.testing.assert_close(mine.double(), theirs.double(), rtol=1e-5, atol=1e-8)


def test_sensitivity_of_an_all_zero_attribution_is_zero_as_in_captum():
    x = torch.rand(3, 4, dtype=torch.float64)

    def zero(inputs):  # captum hands its default perturbation over as a 1-tuple
        return tuple(torch.zeros_like(t) for t in inputs) if isinstance(inputs, tuple) else torch.zeros_like(inputs)

    mine = our_metrics.sensitivity_max(zero, x, n_perturb_samples=2)
    assert mine.tolist() == [0.0, 0.0, 0.0] == cm.sensitivity_max(zero, x, n_perturb_samples=2).tolist()


def test_sensitivity_draws_captums_perturbations():
    x = torch.rand(3, 4, dtype=torch.float64)

    def squared(inputs):
        return tuple(t**2 for t in inputs) if isinstance(inputs, tuple) else inputs**2

    for chunk in (None, 6):
        torch.manual_seed(4)
        mine = our_metrics.sensitivity_max(squared, x, n_perturb_samples=4, max_examples_per_batch=chunk)
        torch.manual_seed(4)
        theirs = cm.sensitivity_max(squared, x, n_perturb_samples=4, max_examples_per_batch=chunk)
        torch.testing.assert_close(mine.double(), theirs.double(), rtol=1e-5, atol=1e-7)


def test_perturbation_methods_leave_model_and_inputs_as_they_were():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0), nn.Linear(4, 2)).double().train()
    x = torch.rand(2, 4, dtype=torch.float64, requires_grad=True)
    before = x.detach().clone()
    for method, options in ((ours.FeatureAblation, {}), (ours.Occlusion, {"sliding_window_shapes": (2,)}),
                            (ours.ShapleyValueSampling, {"n_samples": 2}), (ours.KernelShap, {"n_samples": 8}),
                            (ours.Lime, {"n_samples": 8})):
        out = method(model).attribute(x, target=1, **options)
        assert out.shape == x.shape and not out.requires_grad
    assert model.training and all(p.grad is None for p in model.parameters())
    assert x.requires_grad and x.grad is None and torch.equal(x.detach(), before)


def test_refusals_name_what_is_missing():
    with pytest.raises(NotComputedError, match="11 features"):
        ours.ShapleyValues(nn.Linear(11, 1)).attribute(torch.rand(1, 11), target=0)
    with pytest.raises(NotImplementedError, match="Occlusion"):
        ours.Occlusion(nn.Linear(2, 1)).attribute_future(torch.rand(1, 2), sliding_window_shapes=(1,))
