"""camkit.compat.quantus's robustness classes against Quantus 0.6.0 on the same numpy draws."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit import metrics
from camkit.compat import quantus as cq
from tests.models import RankNet, rank_input

quantus = pytest.importorskip("quantus")


def run(lib, name, *, seed=3, init=None, **call):
    np.random.seed(seed)
    extra = {"disable_warnings": True} if lib is quantus else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(getattr(lib, name)(**(init or {}), **extra)(**call), dtype=np.float64)


def q_explain(model, inputs, targets, **kwargs):
    x = torch.as_tensor(inputs).clone().requires_grad_(True)
    with torch.enable_grad():
        out = model(x)
        (grad,) = torch.autograd.grad(out.gather(1, torch.as_tensor(targets).long()[:, None]).sum(), x)
    return (grad * x).sum(1, keepdim=True).detach().numpy()


def setup():
    net = RankNet(2, classes=3).eval()
    x = rank_input(2, batch=3).numpy()
    y = np.array([0, 2, 1])
    return {"model": net, "x_batch": x, "y_batch": y, "a_batch": q_explain(net, x, y), "explain_func": q_explain,
            "device": "cpu"}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "init"),
    [
        ("AvgSensitivity", {"nr_samples": 4}),
        pytest.param("MaxSensitivity", {"nr_samples": 4, "lower_bound": 0.1}, marks=pytest.mark.slow),
        ("LocalLipschitzEstimate", {"nr_samples": 4, "abs": False}),
        ("RelativeInputStability", {"nr_samples": 3, "return_nan_when_prediction_changes": False}),
        ("RelativeOutputStability", {"nr_samples": 3}),
        ("RelativeRepresentationStability", {"nr_samples": 3, "layer_names": ["conv2"]}),
        pytest.param("RelativeRepresentationStability", {"nr_samples": 2}, marks=pytest.mark.slow),
        ("Continuity", {"nr_steps": 5, "abs": False}),
    ],
)
def test_equals_quantus_on_the_same_draws(name: str, init: dict) -> None:
    call = setup()
    init = {"normalise": False, **init}
    np.testing.assert_allclose(run(cq, name, init=init, **call), run(quantus, name, init=init, **call), rtol=2e-4)


def test_continuity_number_baseline_fills_every_channel_quantus_ignores_it() -> None:
    call = setup()
    init = {"nr_steps": 5, "abs": False, "normalise": False, "perturb_baseline": 0.5}
    ours = run(cq, "Continuity", init=init, **call)
    x, y = torch.as_tensor(call["x_batch"]), torch.as_tensor(call["y_batch"])
    explain = lambda inputs, t: torch.as_tensor(q_explain(call["model"], inputs.numpy(), t.numpy()))[:, 0]  # noqa: E731
    native = metrics.continuity(explain, x, y, model=call["model"], steps=5, fill=0.5)
    np.testing.assert_allclose(ours, native.numpy(), rtol=1e-5)
    # Quantus 0.6.0 translates with "black" (each sample's minimum) whatever perturb_baseline says
    theirs = run(quantus, "Continuity", init=init, **call)
    assert not np.allclose(ours, theirs, rtol=1e-2)
    black = metrics.continuity(explain, x, y, model=call["model"], steps=5)
    np.testing.assert_allclose(theirs, black.numpy(), rtol=1e-4)


def test_defaults_equal_quantus() -> None:
    call = setup()
    for name, init in (("AvgSensitivity", {"nr_samples": 2}), ("RelativeOutputStability", {"nr_samples": 2}),
                       ("Continuity", {"nr_steps": 3, "normalise": False})):  # fmt: skip
        np.testing.assert_allclose(run(cq, name, init=init, **call), run(quantus, name, init=init, **call), rtol=2e-4)


def test_quantus_sensitivity_is_nan_when_one_perturbation_changes_the_class() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 3)).eval()
    x = rank_input(2, batch=3).numpy()
    y = net(torch.as_tensor(x)).argmax(1).numpy()
    call = {"model": net, "x_batch": x, "y_batch": y, "explain_func": q_explain, "device": "cpu"}
    init = {"nr_samples": 6, "lower_bound": 2.0, "normalise": False, "return_nan_when_prediction_changes": True}
    theirs = run(quantus, "AvgSensitivity", init=init, **call)
    ours = run(cq, "AvgSensitivity", init=init, **call)
    kept = run(cq, "AvgSensitivity", init={**init, "return_nan_when_prediction_changes": False}, **call)
    assert np.isnan(theirs).any() and np.isfinite(ours).all()
    # a linear model's gradient x input does not depend on the class change: camkit averages the kept draws
    assert not np.allclose(ours, kept)


def test_consistency_equals_quantus_and_a_lonely_label_is_0_in_compat_nan_natively() -> None:
    call = setup()
    x = np.concatenate([call["x_batch"], call["x_batch"][:1]])
    y = call["model"](torch.as_tensor(x)).argmax(1).numpy()
    a = q_explain(call["model"], x, y)
    kwargs = {"model": call["model"], "x_batch": x, "y_batch": y, "a_batch": a, "device": "cpu"}
    np.testing.assert_allclose(run(cq, "Consistency", **kwargs), run(quantus, "Consistency", **kwargs))  # defaults
    theirs = run(quantus, "Consistency", init={"abs": False}, **kwargs)  # signed maps: labels differ
    ours = run(cq, "Consistency", init={"abs": False}, **kwargs)
    np.testing.assert_allclose(ours, theirs)
    # the samples whose label no other sample shares: Quantus's convention, 0; camkit's own function: NaN
    signs = np.sign(np.asarray(a).reshape(len(a), -1)[:, :5])
    lonely = np.array([sum((signs[j] == signs[i]).all() for j in range(len(a))) == 1 for i in range(len(a))])
    assert lonely.any() and not lonely[0] and (ours[lonely] == 0).all()
    native = metrics.consistency(torch.as_tensor(np.asarray(a)).flatten(1), torch.as_tensor(y), n=5)
    assert torch.isnan(native[torch.as_tensor(lonely)]).all() and not torch.isnan(native[torch.as_tensor(~lonely)]).any()


@pytest.mark.parametrize(
    ("name", "init"),
    [
        ("AvgSensitivity", {"nr_samples": 3, "perturb_func_kwargs": {"perturb_std": 0.05}}),
        ("LocalLipschitzEstimate", {"nr_samples": 3, "perturb_func_kwargs": {"perturb_std": 0.05}}),
        ("RelativeInputStability", {"nr_samples": 3, "return_nan_when_prediction_changes": False}),
    ],
)
def test_a_custom_perturb_func_is_called_as_quantus_calls_it(name: str, init: dict) -> None:
    call = setup()
    init = {"normalise": False, "perturb_func": quantus.perturb_func.batch_gaussian_noise, **init}
    if name == "LocalLipschitzEstimate":
        init["perturb_func"] = quantus.perturb_func.batch_uniform_noise  # its default is the Gaussian one
        init["perturb_func_kwargs"] = {"lower_bound": 0.05}
    ours, theirs = run(cq, name, init=init, **call), run(quantus, name, init=init, **call)
    np.testing.assert_allclose(ours, theirs, rtol=2e-4)
    default = run(cq, name, init={k: v for k, v in init.items() if k != "perturb_func"}, **call)
    assert not np.allclose(ours, default)  # the function given was used


@pytest.mark.parametrize("layers", [{"layer_indices": [0]}, {"layer_indices": [2]}, {"layer_names": ["conv2"]}])
def test_representation_layers_count_over_the_hidden_modules_as_quantus(layers: dict) -> None:
    call = setup()
    init = {"nr_samples": 2, "normalise": False, "return_nan_when_prediction_changes": False, **layers}
    ours = run(cq, "RelativeRepresentationStability", init=init, **call)
    np.testing.assert_allclose(ours, run(quantus, "RelativeRepresentationStability", init=init, **call), rtol=2e-4)
    if "layer_indices" in layers:  # the model itself is not module 0
        other = {"layer_indices": [layers["layer_indices"][0] + 1]}
        assert not np.allclose(ours, run(cq, "RelativeRepresentationStability", init={**init, **other}, **call))
