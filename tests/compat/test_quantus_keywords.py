"""camkit.compat.quantus takes every keyword Quantus 0.6.0 takes and calls passed functions as Quantus does.

Each case runs the same call on Quantus and on camkit's layer, after the same ``np.random.seed``,
on images that are not square (6 x 7), and compares the values.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat import quantus as cq
from camkit.compat.quantus.functions import loss_func, norm_func, normalise_func, perturb_func, similarity_func
from camkit.compat.quantus.functions.explanation_func import explain

quantus = pytest.importorskip("quantus")

BASELINES = ["uniform", "black", "white", "mean", 0.0, 0.3, np.float64(0.5)]


def net(classes: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 7, classes)).eval()


def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rs = np.random.RandomState(0)
    return rs.rand(3, 1, 6, 7).astype(np.float32), np.array([0, 2, 1]), rs.randn(3, 1, 6, 7).astype(np.float32)


def both(name: str, init: dict, call: dict | None = None, seed: int = 1) -> list:
    """The metric's result on Quantus and on camkit, after the same seed."""
    x, y, a = data()
    out = []
    for lib in (quantus, cq):
        np.random.seed(seed)
        extra = {"disable_warnings": True} if lib is quantus else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            metric = getattr(lib, name)(**init, **extra)
            kwargs = {"a_batch": a.copy(), **(call or {})}
            out.append(np.asarray(metric(model=net(5), x_batch=x, y_batch=y, device="cpu", **kwargs), dtype=float))
    return out


@pytest.mark.parametrize("baseline", BASELINES, ids=str)
def test_monotonicity_correlation_takes_every_baseline_quantus_takes(baseline) -> None:
    theirs, ours = both("MonotonicityCorrelation", {"nr_samples": 2, "features_in_step": 7, "perturb_baseline": baseline})
    np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_monotonicity_correlation_uniform_bounds_and_similarity_func() -> None:
    init = {"nr_samples": 2, "features_in_step": 7, "perturb_func_kwargs": {"uniform_low": -1.0, "uniform_high": 0.5},
            "similarity_func": quantus.similarity_func.correlation_kendall_tau}  # fmt: skip
    theirs, ours = both("MonotonicityCorrelation", init)
    np.testing.assert_allclose(ours, theirs, atol=1e-6)


@pytest.mark.parametrize("baseline", BASELINES, ids=str)
@pytest.mark.parametrize("name", ["PixelFlipping", "FaithfulnessEstimate"])
def test_stepwise_metrics_take_every_baseline_quantus_takes(name: str, baseline) -> None:
    theirs, ours = both(name, {"features_in_step": 7, "perturb_baseline": baseline})
    if name == "PixelFlipping" and baseline == "mean":  # Quantus's mean drifts with the replaced features
        np.testing.assert_allclose(ours[:, 0], theirs[:, 0], atol=1e-6)  # the first step's mean is the clean one
        assert np.abs(ours - theirs).max() > 1e-6
        return
    np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_pixel_flipping_uniform_bounds_follow_perturb_func_kwargs() -> None:
    init = {"features_in_step": 7, "perturb_baseline": "uniform", "perturb_func_kwargs": {"uniform_low": -2.0,
                                                                                          "uniform_high": -1.0}}
    theirs, ours = both("PixelFlipping", init)
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    # keywords with another baseline go to Quantus's function, which draws (and ignores) the uniform values
    theirs, ours = both("PixelFlipping", {**init, "perturb_baseline": "black"})
    np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_faithfulness_correlation_uniform_draws_one_value_per_run_as_quantus() -> None:
    init = {"nr_runs": 4, "subset_size": 6, "perturb_baseline": "uniform", "return_aggregate": False,
            "perturb_func_kwargs": {"uniform_low": -1.0, "uniform_high": 2.0}}  # fmt: skip
    theirs, ours = both("FaithfulnessCorrelation", init, seed=5)
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    black, _ = both("FaithfulnessCorrelation", {**init, "perturb_baseline": "black", "perturb_func_kwargs": None}, seed=5)
    assert np.abs(black - ours).max() > 1e-3  # the draws are used, not only consumed


def test_completeness_and_monotonicity_take_uniform_as_quantus() -> None:
    # a linear model: f(x) - f(u) = sum(w_y * (x - u)), so the map w_y * (x - u) is complete exactly
    # for the per-sample values u that "uniform" draws (one per sample, numpy's generator)
    x, y, _ = data()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(42, 5, bias=False)).eval()
    w = model[1].weight.detach().numpy()[y].reshape(3, 1, 6, 7)
    np.random.seed(3)
    u = np.random.uniform(size=3).reshape(3, 1, 1, 1)
    metric = cq.Completeness(perturb_baseline="uniform", normalise=False, rtol=1e-4, atol=1e-5)  # float32 sums
    np.random.seed(3)
    assert metric(model=model, x_batch=x, y_batch=y, a_batch=w * (x - u)) == [True] * 3
    np.random.seed(3)
    assert metric(model=model, x_batch=x, y_batch=y, a_batch=w * (x - u + 0.1)) == [False] * 3
    after = []
    for lib in (quantus, cq):  # Monotonicity leaves numpy's generator where Quantus leaves it
        np.random.seed(4)
        extra = {"disable_warnings": True} if lib is quantus else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lib.Monotonicity(features_in_step=7, perturb_baseline="uniform", **extra)(
                model=net(5), x_batch=x, y_batch=y, a_batch=data()[2], device="cpu")  # fmt: skip
        after.append(np.random.random())
    assert after[0] == after[1]


@pytest.mark.parametrize("baseline", ["random", "neighbourhood_mean", "neighbourhood_random_min_max"])
def test_baselines_quantus_refuses_are_refused(baseline) -> None:
    with pytest.raises(ValueError):
        both("MonotonicityCorrelation", {"nr_samples": 1, "features_in_step": 7, "perturb_baseline": baseline})
    with pytest.raises(ValueError, match="'uniform', 'black', 'white', 'mean'"):
        cq.MonotonicityCorrelation(perturb_baseline=baseline)


@pytest.mark.parametrize(
    "similarity", ["correlation_spearman", "correlation_pearson", "correlation_kendall_tau", "ssim", "abs_difference"]
)
@pytest.mark.parametrize("source", ["quantus", "camkit"])
def test_random_logit_calls_similarity_func_on_flattened_maps(similarity: str, source: str) -> None:
    # Quantus flattens both maps to [B, H*W] rows and calls f(a, b, batched=True): scipy's spearmanr raised
    # on the unflattened [B, 1, 6, 7] arrays camkit passed before
    module = quantus.similarity_func if source == "quantus" else similarity_func
    func = getattr(module, similarity)
    if similarity == "abs_difference":  # not a batched function: one number for the batch, as in Quantus

        def func(a, b, batched=False, _f=func):
            return np.full(len(a), _f(a, b))

    init = {"similarity_func": func, "num_classes": 5, "normalise": False}
    theirs, ours = both("RandomLogit", init, {"a_batch": None, "explain_func": quantus.explain,
                                              "explain_func_kwargs": {"method": "Gradient"}})  # fmt: skip
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("baseline", [0.0, 0.4, "black", "mean"], ids=str)
def test_faithfulness_correlation_numeric_baselines_draw_as_quantus(baseline) -> None:
    # Quantus draws its extra uniform value only for named baselines: a number must not shift the subsets
    theirs, ours = both("FaithfulnessCorrelation", {"nr_runs": 4, "subset_size": 6, "perturb_baseline": baseline,
                                                     "return_aggregate": False})  # fmt: skip
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("name", ["FaithfulnessCorrelation", "FaithfulnessEstimate"])
def test_faithfulness_similarity_func_is_called_as_quantus_calls_it(name: str) -> None:
    init = {"similarity_func": quantus.similarity_func.correlation_spearman}
    init |= {"nr_runs": 4, "subset_size": 6, "return_aggregate": False} if name == "FaithfulnessCorrelation" else {
        "features_in_step": 7}
    theirs, ours = both(name, init)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("lib", ["quantus", "camkit"])
def test_default_perturb_func_passed_explicitly_is_the_default(lib: str) -> None:
    func = (quantus if lib == "quantus" else perturb_func).batch_baseline_replacement_by_indices
    theirs, ours = both("PixelFlipping", {"features_in_step": 7, "perturb_func": func})
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    with pytest.raises(ValueError, match="default perturbation"):
        cq.Sufficiency(perturb_func=quantus.gaussian_noise)  # no perturbation to replace (Quantus refuses it too)
    with pytest.raises(cq.NotTranslatedError, match="noisy_linear_imputation"):
        perturb_func.noisy_linear_imputation(np.zeros((1, 2)), indices=None)


@pytest.mark.parametrize("baseline", ["black", "white", "mean", 0.25, "uniform"])
def test_batch_baseline_replacement_equals_quantus(baseline) -> None:
    arr, indices = np.random.RandomState(2).rand(3, 10), np.array([[0, 4], [9, 1], [3, 3]])
    np.random.seed(5)
    theirs = quantus.batch_baseline_replacement_by_indices(arr=arr, indices=indices, perturb_baseline=baseline)
    np.random.seed(5)
    ours = perturb_func.batch_baseline_replacement_by_indices(arr=arr, indices=indices, perturb_baseline=baseline)
    np.testing.assert_allclose(ours, theirs)
    assert not np.shares_memory(ours, arr)


FUNCTIONS = [
    (similarity_func, name) for name in ("correlation_spearman", "correlation_pearson", "correlation_kendall_tau",
                                         "distance_euclidean", "distance_manhattan", "distance_chebyshev",
                                         "abs_difference", "squared_difference", "cosine", "difference")
]  # fmt: skip


@pytest.mark.parametrize(("module", "name"), FUNCTIONS, ids=[n for _, n in FUNCTIONS])
def test_similarity_functions_equal_quantus(module, name: str) -> None:
    a, b = np.random.RandomState(3).randn(2, 12)
    np.testing.assert_allclose(getattr(module, name)(a, b), getattr(quantus.similarity_func, name)(a, b))
    if "correlation" in name:
        rows_a, rows_b = a.reshape(3, 4), b.reshape(3, 4)
        np.testing.assert_allclose(getattr(module, name)(rows_a, rows_b, batched=True),
                                   getattr(quantus.similarity_func, name)(rows_a, rows_b, batched=True))  # fmt: skip


def test_ssim_lipschitz_and_other_functions_equal_quantus() -> None:
    rs = np.random.RandomState(4)
    a, b, c, d = rs.rand(4, 7, 9)
    np.testing.assert_allclose(similarity_func.ssim(a, b), quantus.similarity_func.ssim(a, b))
    np.testing.assert_allclose(similarity_func.lipschitz_constant(a.ravel(), b.ravel(), c.ravel(), d.ravel()),
                               quantus.similarity_func.lipschitz_constant(a.ravel(), b.ravel(), c.ravel(), d.ravel()))
    signed = rs.randn(2, 1, 4, 5)
    for name in ("normalise_by_max", "normalise_by_average_second_moment_estimate"):
        np.testing.assert_allclose(getattr(normalise_func, name)(signed.copy()),
                                   getattr(quantus.normalise_func, name)(signed.copy()))
        np.testing.assert_allclose(getattr(normalise_func, name)(signed.copy(), normalise_axes=(1, 2, 3)),
                                   getattr(quantus.normalise_func, name)(signed.copy(), normalise_axes=(1, 2, 3)))
    for name in ("fro_norm", "l2_norm", "linf_norm"):
        np.testing.assert_allclose(getattr(norm_func, name)(a), getattr(quantus.norm_func, name)(a))
    for kwargs in ({}, {"batched": True}, {"batched": True, "normalise_mse": True}):
        np.testing.assert_allclose(loss_func.mse(a, b, **kwargs), quantus.loss_func.mse(a, b, **kwargs))  # fmt: skip


def test_normalise_by_negative_on_maps_of_both_signs_where_quantus_raises() -> None:
    # Quantus 0.6.0 turns every warning into an error around its mixed-sign branch, which np.where
    # computes for every map, and numpy warns there about np.divide(where=) without out=: any map
    # that is not all zeros raises. camkit returns the normalisation the function describes:
    # positives over the maximum, negatives over |minimum|.
    for a, expected in (
        (np.array([[2.0, -4.0, 1.0, -1.0, 0.0]]), [[1.0, -1.0, 0.5, -0.25, 0.0]]),
        (np.array([[2.0, 4.0, 1.0]]), [[0.5, 1.0, 0.25]]),
        (np.array([[-2.0, -4.0]]), [[-0.5, -1.0]]),
    ):
        with pytest.raises(UserWarning, match="'where' used without 'out'"):
            quantus.normalise_func.normalise_by_negative(a.copy())
        np.testing.assert_allclose(normalise_func.normalise_by_negative(a), expected)


@pytest.mark.parametrize("method", ["Saliency", "Gradient", "InputXGradient"])
def test_explain_equals_quantus_captum_branch(method: str) -> None:
    x, y, _ = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = quantus.explain(net(5), x, y, method=method)
    ours = explain(net(5), x, y, method=method)
    assert ours.shape == theirs.shape == (3, 1, 6, 7)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)
    with pytest.raises(KeyError, match="VanillaGradients"):  # tf-explain's name: not a captum method
        explain(net(5), x, y, method="VanillaGradients")


def test_explain_integrated_gradients_weights_sum_to_one_where_quantus_loses_a_tenth() -> None:
    # Quantus asks captum for 10 "riemann_trapezoid" points, whose weights are 1/10 with the two
    # ends halved: they sum to 0.9, so every attribution is 0.9 of the path integral and the maps
    # miss completeness by a tenth. camkit's trapezoid over the same 10 points sums to 1. On a
    # linear model the integral is exact, so the sums must equal f(x) - f(0).
    x, y, _ = data()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(42, 5)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = quantus.explain(model, x, y, method="IntegratedGradients", reduce_axes=())
    ours = explain(model, x, y, method="IntegratedGradients", reduce_axes=())
    with torch.no_grad():
        scores = model(torch.as_tensor(x)) - model(torch.zeros_like(torch.as_tensor(x)))
    gap = scores[torch.arange(3), torch.as_tensor(y)].numpy()
    np.testing.assert_allclose(ours.reshape(3, -1).sum(axis=1), gap, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(theirs.reshape(3, -1).sum(axis=1), 0.9 * gap, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(0.9 * ours, theirs, rtol=1e-4, atol=1e-7)
