"""camkit.compat.quantus.EfficientMPRT's bin rules and extra scores against Quantus 0.6.0."""

from __future__ import annotations

import numpy as np
import pytest
from test_quantus_localisation_randomisation import q_explain, run, setup

from camkit.compat import quantus as cq
from camkit.compat.quantus.efficient_mprt import bins_by_rule
from camkit.errors import InvalidInputError

quantus = pytest.importorskip("quantus")


def test_bin_rules_by_hand():
    maps = np.arange(2 * 64, dtype=np.float64).reshape(2, 1, 8, 8)  # n = 64 values per map, 0..127
    iqr = np.percentile(maps, 75) - np.percentile(maps, 25)  # 63.5
    width = 2 * iqr / 64 ** (1 / 3)  # 64^(1/3) is 4 less an ulp: 127 / width is just under 4
    assert bins_by_rule(maps, "Freedman Diaconis") == 10  # clamped to the minimum
    assert bins_by_rule(maps, "Freedman Diaconis", low=1) == int(127 / width) == 3
    assert bins_by_rule(maps, "Scotts", low=1) == int(127 / (3.5 * maps.std() / 64 ** (1 / 3))) == 3
    assert bins_by_rule(maps, "Square Root", low=1) == 8
    assert bins_by_rule(maps, "Sturges Formula", low=1) == 7
    assert bins_by_rule(maps, "Rice", low=1) == 7  # int(2 * 3.9999...) in floating point
    assert bins_by_rule(maps, "Square Root", low=1, high=5) == 5
    with pytest.raises(InvalidInputError, match="rule"):
        cq.EfficientMPRT(complexity_func_kwargs={"rule": "nope"})


@pytest.mark.heavy
@pytest.mark.parametrize("rule", ["Square Root", "Sturges Formula", "Rice"])
def test_count_rules_equal_quantus_where_both_clamp(rule):
    # 8x8 maps: camkit's counts (8, 7, 8) and Quantus's (from n = 3 axes: 1, 2, 2) all clamp to the minimum 10
    net, x, y = setup()
    call = {"model": net, "x_batch": x, "y_batch": y, "explain_func": q_explain, "device": "cpu"}
    init = {"complexity_func_kwargs": {"rule": rule}}
    np.testing.assert_allclose(run(cq, "EfficientMPRT", init=init, **call),
                               run(quantus, "EfficientMPRT", init=init, **call), rtol=1e-4)  # fmt: skip


def test_freedman_diaconis_counts_the_values_where_quantus_counts_the_axes():
    net, x, y = setup()
    a = q_explain(net, x, y)
    call = {"model": net, "x_batch": x, "y_batch": y, "a_batch": a, "explain_func": q_explain, "device": "cpu"}
    init = {"complexity_func_kwargs": {"rule": "Freedman Diaconis", "min_n_bins": 2}}
    ours_bins = bins_by_rule(a, "Freedman Diaconis", low=2)
    iqr = np.percentile(a, 75) - np.percentile(a, 25)
    their_bins = max(min(int((a.max() - a.min()) / max(2 * iqr / 3 ** (1 / 3), 1e-6)), 200), 2)  # n = a[0].ndim = 3
    assert ours_bins != their_bins
    fixed = {k: v for k, v in init["complexity_func_kwargs"].items() if k != "rule"}
    np.testing.assert_allclose(run(cq, "EfficientMPRT", init=init, **call),
                               run(cq, "EfficientMPRT", init={"complexity_func_kwargs": {**fixed, "n_bins": ours_bins}},
                                   **call), rtol=1e-6)  # fmt: skip
    np.testing.assert_allclose(run(quantus, "EfficientMPRT", init=init, **call),
                               run(cq, "EfficientMPRT", init={"complexity_func_kwargs": {"n_bins": their_bins}}, **call),
                               rtol=1e-4)  # fmt: skip


@pytest.mark.parametrize("skip_layers", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_extra_scores_equal_quantus(skip_layers):
    net, x, y = setup()
    call = {"model": net, "x_batch": x, "y_batch": y, "explain_func": q_explain, "device": "cpu"}
    init = {"compute_extra_scores": True, "skip_layers": skip_layers, "complexity_func_kwargs": {"n_bins": 12}}
    theirs_metric = quantus.EfficientMPRT(disable_warnings=True, **init)
    ours_metric = cq.EfficientMPRT(**init)
    np.random.seed(3)
    theirs = theirs_metric(**call)
    ours = ours_metric(**call)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    assert set(ours_metric.scores_extra) == set(theirs_metric.scores_extra)
    for name, values in theirs_metric.scores_extra.items():
        np.testing.assert_allclose(ours_metric.scores_extra[name], np.asarray(values, dtype=float), rtol=1e-4,
                                   atol=1e-7, equal_nan=True, err_msg=name)  # fmt: skip
    fraction = np.asarray(ours_metric.scores_extra["scores_fraction_explanation"])
    np.testing.assert_allclose(np.asarray(ours), fraction - 1, rtol=1e-5)  # the score is the fraction's rise


def _spread(a, x, **kwargs):
    """A complexity that reads its keywords: the map's spread in units of the bins."""
    assert a.ndim == 3 and a.shape[0] == 1 and kwargs["extra"] == "kept"
    return float(np.std(a)) * kwargs["n_bins"]


def test_complexity_func_called_as_quantus_calls_it():
    net, x, y = setup()
    call = {"model": net, "x_batch": x, "y_batch": y, "explain_func": q_explain, "device": "cpu"}
    init = {"complexity_func": _spread, "complexity_func_kwargs": {"n_bins": 12, "extra": "kept"}, "abs": True}
    theirs = run(quantus, "EfficientMPRT", init=init, **call)
    ours = run(cq, "EfficientMPRT", init=init, **call)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    default = run(cq, "EfficientMPRT", init={"complexity_func_kwargs": {"n_bins": 12}, "abs": True}, **call)
    assert not np.allclose(ours, default, rtol=1e-3)


def test_quantus_own_entropy_fails_where_camkit_passes_each_input():
    net, x, y = setup()
    call = {"model": net, "x_batch": x, "y_batch": y, "explain_func": q_explain, "device": "cpu"}
    init = {"complexity_func": quantus.functions.complexity_func.entropy, "abs": True, "skip_layers": True}
    with pytest.raises(AttributeError, match="NoneType"):  # Quantus passes x=None for the randomised maps
        run(quantus, "EfficientMPRT", init=init, **call)
    calls = []

    def recorded(a, x, **kwargs):
        calls.append((x, quantus.functions.complexity_func.entropy(a, x, **kwargs)))
        return calls[-1][1]

    ours = np.asarray(run(cq, "EfficientMPRT", init={**init, "complexity_func": recorded}, **call))
    assert len(calls) == 6  # three original maps, then three of the randomised model
    for i, (given, _) in enumerate(calls):
        np.testing.assert_array_equal(given, x[i % 3])  # each map's own input, each map once
    # by hand: the Shannon entropy of each |map| read as a distribution
    a = np.abs(q_explain(net, x, y)).reshape(len(x), -1).astype(np.float64)
    p = a / a.sum(1, keepdims=True)
    before = -(p * np.log(np.where(p > 0, p, 1))).sum(1)
    np.testing.assert_allclose([value for _, value in calls[:3]], before, rtol=1e-5)
    after = np.array([value for _, value in calls[3:]])
    np.testing.assert_allclose(ours, (after - before) / before, rtol=1e-5)
