"""Any ``perturb_func`` (and ``perturb_func_kwargs``, ``perturb_baseline="uniform"``) in the perturbation
classes of camkit.compat.quantus, called as Quantus 0.6.0 calls it: equal to Quantus on the same draws."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat import quantus as cq

quantus = pytest.importorskip("quantus")


def net_for(channels: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).eval()


@pytest.fixture(scope="module")
def batch():
    x = np.random.RandomState(0).rand(3, 1, 6, 6).astype(np.float32)
    a = np.random.RandomState(1).rand(3, 1, 6, 6).astype(np.float32)
    return net_for(1), x, np.array([0, 2, 1]), a


def dim(arr, indices, perturb_baseline, factor=0.5, **kwargs):
    """A caller's perturbation: scale the chosen features (and check Quantus's calling contract)."""
    assert arr.ndim == 2 and indices.ndim == 2 and arr.shape[0] == indices.shape[0]
    out = arr.copy()
    rows = np.arange(arr.shape[0])[:, None]
    out[rows, indices] = out[rows, indices] * factor + (0.0 if isinstance(perturb_baseline, str) else perturb_baseline)
    return out


def both(name, batch, *, seed=3, **kwargs):
    net, x, y, a = batch
    out = []
    for lib in (quantus, cq):
        np.random.seed(seed)
        extra = {"disable_warnings": True} if lib is quantus else {}
        metric = getattr(lib, name)(normalise=False, **kwargs, **extra)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out.append(metric(model=net, x_batch=x, y_batch=y, a_batch=a, device="cpu"))
    return out


def close(ours, theirs):
    np.testing.assert_allclose(np.array(ours, dtype=float), np.array(theirs, dtype=float), rtol=1e-5, atol=1e-6)


CASES = [
    ("PixelFlipping", {"features_in_step": 3}),
    ("FaithfulnessEstimate", {"features_in_step": 4}),
    ("FaithfulnessCorrelation", {"nr_runs": 6, "subset_size": 5, "return_aggregate": False}),
    ("MonotonicityCorrelation", {"nr_samples": 3, "features_in_step": 6}),
    ("RegionPerturbation", {"patch_size": 3, "regions_evaluation": 3}),
    ("Selectivity", {"patch_size": 2}),
    ("NonSensitivity", {"features_in_step": 1, "eps": 1e-3}),
    ("Monotonicity", {"features_in_step": 6}),
    ("Completeness", {}),
]


@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=[c[0] for c in CASES])
def test_a_callers_perturb_func_with_keywords_equals_quantus(name, kwargs, batch):
    options = {"perturb_func": dim, "perturb_func_kwargs": {"factor": 0.25}, "perturb_baseline": 0.1}
    theirs, ours = both(name, batch, **kwargs, **options)
    close(ours, theirs)


RANDOM = [
    ("PixelFlipping", {"features_in_step": 4}),
    ("FaithfulnessCorrelation", {"nr_runs": 5, "subset_size": 4, "return_aggregate": False}),  # draws alternate
    ("FaithfulnessEstimate", {"features_in_step": 6}),
    ("MonotonicityCorrelation", {"nr_samples": 2, "features_in_step": 6}),
    ("Selectivity", {"patch_size": 3}),
    ("NonSensitivity", {"features_in_step": 1, "eps": 1e-3}),
    ("RegionPerturbation", {"patch_size": 2, "regions_evaluation": 4}),
]


@pytest.mark.parametrize(("name", "kwargs"), RANDOM, ids=[c[0] for c in RANDOM])
def test_quantus_own_function_drawing_uniform_values_equals_quantus(name, kwargs, batch):
    """Quantus's default function passed with keywords: its uniform draws come in Quantus's order."""
    options = {
        "perturb_func": quantus.functions.perturb_func.batch_baseline_replacement_by_indices,
        "perturb_func_kwargs": {"uniform_low": -0.5, "uniform_high": 0.25},
        "perturb_baseline": "uniform",
    }
    theirs, ours = both(name, batch, **kwargs, **options)
    close(ours, theirs)


def noisy(arr, indices, perturb_baseline, scale=1.0, **kwargs):
    """A caller's random perturbation: Gaussian values from numpy's global generator at the chosen features."""
    out = arr.copy()
    out[np.arange(arr.shape[0])[:, None], indices] = scale * np.random.normal(size=indices.shape)
    return out


@pytest.mark.parametrize(("name", "kwargs"), [*RANDOM, ("Monotonicity", {"features_in_step": 9})],
                         ids=[*(c[0] for c in RANDOM), "Monotonicity"])  # fmt: skip
def test_a_callers_random_function_draws_quantus_numbers(name, kwargs, batch):
    theirs, ours = both(name, batch, perturb_func=noisy, perturb_func_kwargs={"scale": 0.5}, **kwargs)
    close(ours, theirs)


@pytest.mark.parametrize(("name", "kwargs"), [
    ("Selectivity", {"patch_size": 3}),
    ("NonSensitivity", {"features_in_step": 1, "eps": 1e-3}),
])  # fmt: skip
def test_uniform_baseline_equals_quantus(name, kwargs, batch):
    theirs, ours = both(name, batch, perturb_baseline="uniform", **kwargs)
    close(ours, theirs)
    assert not np.allclose(np.array(ours, dtype=float), np.array(both(name, batch, seed=4, perturb_baseline="uniform", **kwargs)[1], dtype=float))


def test_ties_of_a_one_channel_map_are_taken_in_quantus_order():
    """A [B, 1, H, W] map on RGB inputs ties every position's three channels: numpy's argsort (Quantus)
    orders them differently from a stable sort, and per-index values land where Quantus puts them."""
    x = np.random.RandomState(2).rand(2, 3, 6, 6).astype(np.float32)
    a = np.random.RandomState(3).rand(2, 1, 6, 6).astype(np.float32)

    def ramp(arr, indices, perturb_baseline, **kwargs):  # a different value for each place in the step
        out = arr.copy()
        out[np.arange(arr.shape[0])[:, None], indices] = np.linspace(-1.0, 1.0, indices.shape[1])[None]
        return out

    theirs, ours = both("PixelFlipping", (net_for(3), x, np.array([1, 0]), a), features_in_step=9, perturb_func=ramp)
    close(ours, theirs)


def test_sensitivity_n_calls_the_function_as_quantus_does(batch):
    """camkit's SensitivityN is Ancona's estimator (random subsets, see its docstring), so not Quantus's value;
    the function gets Quantus's arguments: the batch [B, F] and one subset per sample [B, n]."""
    net, x, y, a = batch
    calls = []

    def spy(arr, indices, perturb_baseline, **kwargs):
        calls.append((arr.shape, indices.shape, perturb_baseline, kwargs))
        return dim(arr, indices, 0.0)

    np.random.seed(0)
    cq.SensitivityN(features_in_step=12, nr_samples=2, perturb_func=spy, perturb_func_kwargs={"k": 1})(
        model=net, x_batch=x, y_batch=y, a_batch=a
    )
    assert calls == [((3, 36), (3, 12), "black", {"k": 1})] * 2 + [((3, 36), (3, 24), "black", {"k": 1})] * 2


def test_sensitivity_n_uniform_draws_through_quantus_default(batch):
    net, x, y, a = batch
    runs = []
    for seed in (0, 0, 1):
        np.random.seed(seed)
        runs.append(cq.SensitivityN(features_in_step=12, nr_samples=3, perturb_baseline="uniform")(
            model=net, x_batch=x, y_batch=y, a_batch=a))  # fmt: skip
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_monotonicity_starts_from_uniform_values_in_0_1_whatever_the_keywords(batch):
    """Quantus fills the starting input with ``get_baseline_value`` called without ``perturb_func_kwargs``: values
    in [0, 1) whatever the bounds, which reach only the function's own draws; the generator ends as Quantus's."""
    net, x, y, a = batch
    firsts, after = [], []

    def spy(arr, indices, perturb_baseline, **kwargs):
        firsts.append(arr.copy())
        return quantus.functions.perturb_func.batch_baseline_replacement_by_indices(arr, indices, perturb_baseline, **kwargs)

    bounds = {"uniform_low": 5.0, "uniform_high": 6.0}
    for lib, func in ((cq, spy), (quantus, spy), (cq, None), (quantus, None)):
        np.random.seed(6)
        extra = {"disable_warnings": True} if lib is quantus else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            metric = lib.Monotonicity(features_in_step=9, perturb_baseline="uniform", perturb_func=func,
                                      perturb_func_kwargs=bounds, **extra)  # fmt: skip
            metric(model=net, x_batch=x, y_batch=y, a_batch=a, device="cpu")
        after.append(np.random.random())
    start = np.random.RandomState(6).uniform(0.0, 1.0, 3)
    np.testing.assert_allclose(firsts[0], np.repeat(start[:, None], 36, axis=1), rtol=1e-6)
    np.testing.assert_allclose(firsts[0], firsts[len(firsts) // 2], rtol=1e-6)  # Quantus's first call: the same array
    assert after[0] == after[1] and after[2] == after[3]
