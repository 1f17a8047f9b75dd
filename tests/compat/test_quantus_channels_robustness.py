"""Maps with several channels in camkit.compat.quantus's robustness classes (and SmoothMPRT), against Quantus."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from camkit.compat import quantus as cq
from camkit.compat.quantus.functions.perturb_func import batched_translation
from camkit.errors import InvalidInputError
from tests.compat.test_quantus_channels import explain_rgb
from tests.compat.test_quantus_localisation_randomisation import setup

quantus = pytest.importorskip("quantus")


def _run(lib, name, init, seed=3, **call):
    np.random.seed(seed)
    extra = {"disable_warnings": True} if lib is quantus else {}
    with warnings.catch_warnings(), torch.random.fork_rng():
        warnings.simplefilter("ignore")
        return getattr(lib, name)(**init, **extra)(**call)


def _rgb_call():
    net, x, y = setup()
    return {"model": net, "x_batch": x, "y_batch": y, "a_batch": explain_rgb(net, x, y), "explain_func": explain_rgb,
            "device": "cpu"}  # fmt: skip


def _summed(model, inputs, targets, **kwargs):
    return explain_rgb(model, inputs, targets).sum(1, keepdims=True)


@pytest.mark.parametrize(
    ("name", "init"),
    [
        ("AvgSensitivity", {"nr_samples": 3}),
        pytest.param("MaxSensitivity", {"nr_samples": 3, "lower_bound": 0.1}, marks=pytest.mark.slow),
        ("LocalLipschitzEstimate", {"nr_samples": 3, "abs": False}),
        ("Continuity", {"nr_steps": 5, "abs": False}),
        ("RelativeInputStability", {"nr_samples": 3, "return_nan_when_prediction_changes": False}),
        ("RelativeOutputStability", {"nr_samples": 3, "return_nan_when_prediction_changes": False}),
        ("RelativeRepresentationStability", {"nr_samples": 2, "layer_names": ["conv2"],
                                             "return_nan_when_prediction_changes": False}),
    ],
)  # fmt: skip
def test_robustness_compares_maps_with_channels_whole_as_quantus(name: str, init: dict) -> None:
    call, init = _rgb_call(), {"normalise": False, **init}
    theirs = np.asarray(_run(quantus, name, init, **call), dtype=np.float64)
    ours = np.asarray(_run(cq, name, init, **call), dtype=np.float64)
    np.testing.assert_allclose(ours, theirs, rtol=2e-4)
    # the channels count: the same metric on the channels summed gives another value
    summed = {**call, "a_batch": call["a_batch"].sum(1, keepdims=True), "explain_func": _summed}
    assert not np.allclose(np.asarray(_run(cq, name, init, **summed), dtype=np.float64), ours, rtol=1e-3)


def test_consistency_labels_maps_with_channels_by_their_first_values_as_quantus() -> None:
    net, x, _ = setup()
    x = np.concatenate([x, x[1:2] - 3])  # predicted [1, 1, 1, 2]
    a = np.random.RandomState(2).randn(4, 3, 8, 8).astype(np.float32)
    a[1, 0, 0, :5] = 2 * a[0, 0, 0, :5]  # maps 0 and 1 share a sign label (their first five values)
    a[3, 0] = a[2, 0]  # so do maps 2 and 3, whose other channels differ
    call = {"model": net, "x_batch": x, "y_batch": np.zeros(4, dtype=int), "a_batch": a, "device": "cpu"}
    theirs = np.asarray(_run(quantus, "Consistency", {"abs": False}, **call), dtype=np.float64)
    ours = np.asarray(_run(cq, "Consistency", {"abs": False}, **call), dtype=np.float64)
    np.testing.assert_allclose(ours, theirs)
    predicted = net(torch.as_tensor(x)).argmax(1).numpy()
    assert predicted[0] == predicted[1] and predicted[2] != predicted[3]
    np.testing.assert_array_equal(ours, [1.0, 1.0, 0.0, 0.0])  # each map's partner: same class, other class


def test_a_one_channel_a_batch_with_an_rgb_explain_func_is_refused_by_both() -> None:
    call = _rgb_call()
    call["a_batch"] = _summed(call["model"], call["x_batch"], call["y_batch"])
    init = {"nr_samples": 2, "normalise": False}
    with pytest.raises(ValueError):  # Quantus: numpy cannot subtract rows of 64 and 192 values
        _run(quantus, "AvgSensitivity", init, **call)
    with pytest.raises(InvalidInputError, match="same layout"):
        _run(cq, "AvgSensitivity", init, **call)


def test_smooth_mprt_takes_maps_with_channels_where_quantus_fails() -> None:
    call = _rgb_call()
    # Quantus's SmoothMPRT explains with quantus.explain (one channel) and compares with the RGB a_batch
    with pytest.raises(ValueError, match="must match exactly"):
        _run(quantus, "SmoothMPRT", {"nr_samples": 1}, **call)
    ours = _run(cq, "SmoothMPRT", {"nr_samples": 1}, **call)
    # one sample: no noise, so each layer's value is MPRT's on the same maps, which is Quantus's (maps whole)
    theirs = _run(quantus, "MPRT", {"layer_order": "bottom_up"}, **call)
    assert list(ours) == list(theirs)
    for layer in theirs:
        np.testing.assert_allclose(ours[layer], theirs[layer], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("baseline", ["random", "blakc", None, True])
def test_continuity_refuses_an_unknown_fill_at_construction(baseline) -> None:
    with pytest.raises(InvalidInputError, match="perturb_baseline must be a number or one of") as caught:
        cq.Continuity(perturb_baseline=baseline)
    assert ("use 'uniform'" in str(caught.value)) == (baseline == "random")
    # Quantus 0.6.0 accepts it, and translates with "black" whatever it says
    call, init = _rgb_call(), {"nr_steps": 3, "normalise": False, "abs": False}
    np.testing.assert_array_equal(
        np.asarray(_run(quantus, "Continuity", {**init, "perturb_baseline": baseline}, **call)),
        np.asarray(_run(quantus, "Continuity", init, **call)),
    )


def test_continuity_takes_any_fill_with_a_translation_of_ones_own() -> None:
    def shift_with_label(arr, perturb_baseline, perturb_dx, direction, **kwargs):
        fill = {"low": 0.0, "high": 1.0}[perturb_baseline]
        return batched_translation(arr, fill, perturb_dx, direction)

    call = _rgb_call()
    init = {"nr_steps": 3, "normalise": False, "abs": False, "perturb_func": shift_with_label}
    low = np.asarray(_run(cq, "Continuity", {**init, "perturb_baseline": "low"}, **call))
    zero = np.asarray(_run(cq, "Continuity", {**init, "perturb_baseline": 0.0, "perturb_func": None}, **call))
    np.testing.assert_allclose(low, zero, rtol=1e-6)
    for fill in ("BLACK", "uniform", 0.5, np.float32(0.25)):
        cq.Continuity(perturb_baseline=fill)  # accepted
