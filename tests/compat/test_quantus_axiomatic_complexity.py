"""camkit.compat.quantus's complexity, axiomatic, Infidelity and SensitivityN classes against Quantus 0.6.0,
and where Quantus is wrong."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat import quantus as cq
from camkit.errors import InvalidInputError
from camkit.metrics import infidelity

quantus = pytest.importorskip("quantus")


def conv_net(size: int = 6) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * size * size, 3)).eval()


def linear_net(size: int = 6) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(size * size, 3)).eval()


def data(size: int = 6, batch: int = 3):
    x = np.random.RandomState(0).rand(batch, 1, size, size).astype(np.float32)
    a = np.random.RandomState(1).randn(batch, 1, size, size).astype(np.float32)
    return x, np.array([0, 2, 1])[:batch], a


def run(lib, name, net, x, y, a, *, seed=3, **kwargs):
    np.random.seed(seed)
    extra = {"disable_warnings": True} if lib is quantus else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(lib, name)(**kwargs, **extra)(model=net, x_batch=x, y_batch=y, a_batch=a.copy(), device="cpu")


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("Sparseness", {}),
        ("Sparseness", {"normalise": False}),
        ("Complexity", {}),
        ("EffectiveComplexity", {"normalise": False, "eps": 0.5}),
        ("EffectiveComplexity", {"normalise": False, "abs": False, "eps": 0.5}),
        ("NonSensitivity", {"normalise": False, "eps": 0.05}),
    ],
)
def test_equal_to_quantus(name, kwargs):
    x, y, a = data()
    net = conv_net()
    theirs = run(quantus, name, net, x, y, a, **kwargs)
    ours = run(cq, name, net, x, y, a, **kwargs)
    np.testing.assert_allclose(np.array(ours, dtype=float), np.array(theirs, dtype=float), rtol=1e-5, atol=1e-6)


def test_quantus_sparseness_mutates_the_callers_maps():
    x, y, a = data()
    before = a.copy()
    np.random.seed(0)
    quantus.Sparseness(normalise=False, abs=False, disable_warnings=True)(model=None, x_batch=x, y_batch=y, a_batch=a)
    assert not np.array_equal(a, before)  # Quantus added 1e-7 to the caller's array
    mine = before.copy()
    cq.Sparseness(normalise=False, abs=False)(model=None, x_batch=x, y_batch=y, a_batch=mine)
    assert np.array_equal(mine, before)


def test_effective_complexity_normalise_per_sample():
    x, y, a = data()
    a[1] *= 10.0
    theirs = run(quantus, "EffectiveComplexity", None, x, y, a, eps=0.5)
    ours = run(cq, "EffectiveComplexity", None, x, y, a, eps=0.5)
    per_sample = [int((np.abs(s) / np.abs(s).max() > 0.5).sum()) for s in a]
    assert ours == per_sample and theirs != per_sample  # Quantus divides by the batch's largest value


def test_sparseness_of_signed_maps_reads_their_magnitude():
    x, y, a = data()
    theirs = run(quantus, "Sparseness", None, x, y, a, normalise=False, abs=False)
    ours = run(cq, "Sparseness", None, x, y, a, normalise=False, abs=False)
    assert min(theirs) < 0 or max(theirs) > 1  # Quantus's Gini of signed values leaves [0, 1]
    np.testing.assert_allclose(ours, run(quantus, "Sparseness", None, x, y, a, normalise=False), rtol=1e-5)


def test_completeness_exact_linear_attribution():
    size = 16
    x = np.random.RandomState(0).rand(3, 3, size, size).astype(np.float32)
    y = np.array([0, 2, 1])
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * size * size, 3)).eval()
    exact = (net[1].weight.detach().numpy()[y].reshape(3, 3, size, size) * x).astype(np.float32)
    # f(x) - f(0) = sum_i w_i x_i exactly, up to float32 rounding in another order
    theirs = run(quantus, "Completeness", net, x, y, exact, normalise=False, perturb_baseline=0.0)
    ours = run(cq, "Completeness", net, x, y, exact, normalise=False, perturb_baseline=0.0)
    assert ours == [True, True, True]
    assert not any(theirs)  # exact float equality fails on rounding alone
    wrong = run(cq, "Completeness", net, x, y, exact * 1.01, normalise=False, perturb_baseline=0.0)
    assert wrong == [False, False, False]


def test_non_sensitivity_quantus_fails_for_steps_above_one():
    x, y, a = data()
    net = conv_net()
    with pytest.raises(ValueError):
        run(quantus, "NonSensitivity", net, x, y, a, normalise=False, eps=0.05, features_in_step=4)
    counts = run(cq, "NonSensitivity", net, x, y, a, normalise=False, eps=0.05, features_in_step=4)
    assert len(counts) == 3 and all(0 <= c <= 36 for c in counts)


@pytest.mark.heavy
def test_quantus_infidelity_repeats_are_identical():
    x, y, a = data(8)
    net = conv_net(8)
    one = run(quantus, "Infidelity", net, x, y, a, n_perturb_samples=1, perturb_patch_sizes=[2], seed=1)
    ten = run(quantus, "Infidelity", net, x, y, a, n_perturb_samples=10, perturb_patch_sizes=[2], seed=2)
    np.testing.assert_allclose(ten, one, rtol=1e-6)  # ten "samples", no randomness: one raster pass
    ours_1 = run(cq, "Infidelity", net, x, y, a, n_perturb_samples=10, perturb_patch_sizes=[2], seed=1)
    ours_2 = run(cq, "Infidelity", net, x, y, a, n_perturb_samples=10, perturb_patch_sizes=[2], seed=2)
    assert not np.allclose(ours_1, ours_2)  # random squares: the draws matter


def test_infidelity_whole_input_patch_equals_quantus_and_the_estimator():
    x, y, a = data(8)
    net = conv_net(8)
    theirs = run(quantus, "Infidelity", net, x, y, a, n_perturb_samples=2, perturb_patch_sizes=[8], perturb_baseline=0.0)
    ours = run(cq, "Infidelity", net, x, y, a, n_perturb_samples=2, perturb_patch_sizes=[8], perturb_baseline=0.0)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)  # one possible square: the same single perturbation
    xt = torch.from_numpy(x)
    direct = infidelity(net, xt, torch.from_numpy(a), torch.from_numpy(y), perturbations=xt[:, None])
    np.testing.assert_allclose(ours, direct.numpy(), rtol=1e-5)


def test_sensitivity_n_per_sample_against_quantus_across_samples():
    x, y, _ = data(6, batch=3)
    net = linear_net()
    exact = (net[1].weight.detach().numpy()[y].reshape(3, 1, 6, 6) * x).astype(np.float32)
    kwargs = dict(normalise=False, perturb_baseline=0.0, features_in_step=6, return_aggregate=False)
    np.random.seed(0)
    ours = cq.SensitivityN(nr_samples=6, **kwargs)(model=net, x_batch=x, y_batch=y, a_batch=exact, softmax=False)
    np.testing.assert_allclose(ours, 1.0, rtol=1e-5)  # a linear model's exact attribution: 1 for every n
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = quantus.SensitivityN(disable_warnings=True, **kwargs)(
            model=net, x_batch=x, y_batch=y, a_batch=exact, softmax=False
        )
    assert len(theirs) == len(ours) == 4
    assert not np.allclose(theirs, 1.0, atol=1e-3)  # cumulative drops against one step's attribution


def _gradient(model, inputs, targets, **kwargs):
    t = torch.tensor(inputs, requires_grad=True)
    out = model(t).gather(1, torch.as_tensor(targets)[:, None]).sum()
    return torch.autograd.grad(out, t)[0].numpy()


def _input_times_gradient(model, inputs, targets, **kwargs):
    return _gradient(model, inputs, targets) * inputs


def test_input_invariance_quantus_shift_breaks_padded_layers():
    x, y, _ = data(8)
    net = conv_net(8)
    np.random.seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = quantus.InputInvariance(disable_warnings=True)(model=net, x_batch=x, y_batch=y, a_batch=None, explain_func=_gradient)
    ours = cq.InputInvariance()(model=net, x_batch=x, y_batch=y, a_batch=None, explain_func=_gradient)
    assert not any(theirs)  # Quantus's shifted copy is another function: even the gradient "fails"
    assert ours == [True, True, True]
    assert cq.InputInvariance()(model=net, x_batch=x, y_batch=y, explain_func=_input_times_gradient) == [False] * 3
    with pytest.raises(InvalidInputError, match="explain_func"):
        cq.InputInvariance()(model=net, x_batch=x, y_batch=y, a_batch=x)


def test_evaluate_raises_where_quantus_prints(capsys):
    x, y, a = data()
    net = conv_net()
    metrics = {"sparseness": cq.Sparseness(), "broken": cq.FaithfulnessCorrelation(subset_size=10_000)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = quantus.evaluate(
            metrics={"sparseness": quantus.Sparseness(disable_warnings=True),
                     "broken": quantus.FaithfulnessCorrelation(subset_size=10_000, disable_warnings=True)},
            xai_methods={"random": a}, model=net, x_batch=x, y_batch=y, call_kwargs={"first": {}, "second": {}},
        )  # fmt: skip
    assert theirs["random"]["broken"] == {}  # the failure is printed and the entry left empty
    assert "subset_size" in capsys.readouterr().out
    with pytest.raises(cq.MetricFailedError, match="'broken' failed on method 'random'"):
        cq.evaluate(metrics=metrics, xai_methods={"random": a}, model=net, x_batch=x, y_batch=y)
    ok = cq.evaluate(metrics={"sparseness": cq.Sparseness()}, xai_methods={"random": a}, model=net, x_batch=x, y_batch=y)
    np.testing.assert_allclose(ok["random"]["sparseness"], theirs["random"]["sparseness"]["first"], rtol=1e-5)
    frame = cq.evaluate(metrics={"sparseness": cq.Sparseness()}, xai_methods={"random": a, "grad": _gradient},
                        model=net, x_batch=x, y_batch=y, agg_func=np.mean, explain_func_kwargs={}, return_as_df=True)  # fmt: skip
    assert list(frame.columns) == ["random", "grad"] and list(frame.index) == ["sparseness"]


def test_evaluate_returns_none_for_none_as_quantus_and_refuses_empty_mappings():
    x, y, a = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert quantus.evaluate(metrics=None, xai_methods=None, model=conv_net(), x_batch=x, y_batch=y) is None
    with pytest.warns(UserWarning, match="metrics=None"):
        assert cq.evaluate(metrics=None, xai_methods={"random": a}, model=conv_net(), x_batch=x, y_batch=y) is None
    with pytest.raises(InvalidInputError, match="at least one metric"):
        cq.evaluate(metrics={}, xai_methods={"random": a}, model=conv_net(), x_batch=x, y_batch=y)


def test_sensitivity_n_draws_follow_numpy_seed_with_one_draw_per_batch():
    x, y, a = data(6, batch=3)
    net = conv_net()
    kwargs = dict(normalise=False, perturb_baseline=0.0, features_in_step=6, return_aggregate=False, nr_samples=5)

    def call(seed):
        np.random.seed(seed)
        out = cq.SensitivityN(**kwargs)(model=net, x_batch=x, y_batch=y, a_batch=a, softmax=False, batch_size=2)
        return out, np.random.randint(0, 2**31)

    first, after = call(0)
    again, after_again = call(0)
    np.testing.assert_array_equal(first, again)
    assert after == after_again
    np.random.seed(0)
    np.random.randint(0, 2**62, dtype=np.int64, size=2)  # two batches of at most 2: two seeds drawn
    assert after == np.random.randint(0, 2**31)
    assert not np.allclose(call(1)[0], first)
