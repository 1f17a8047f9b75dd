"""Quantus's ``explain`` branches routed to camkit: the captum methods through camkit.compat.captum, the zennit branch.

Each case runs the same call on Quantus 0.6.0 (on captum and zennit) and on camkit's translation,
on images that are not square (6 x 7), and compares the values.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat.quantus.functions import explanation_func as ours

quantus_explain = pytest.importorskip("quantus.functions.explanation_func")
zcomp = pytest.importorskip("zennit.composites")
zattr = pytest.importorskip("zennit.attribution")


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 5, 5)
    ).eval()


def data() -> tuple[np.ndarray, np.ndarray]:
    rs = np.random.RandomState(0)
    return rs.rand(3, 1, 6, 7).astype(np.float32), np.array([0, 2, 4])


def theirs(fn: str, **kwargs: object) -> np.ndarray:
    x, y = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(quantus_explain, fn)(net(), x, y, **kwargs)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "composite", [None, zcomp.GuidedBackprop, zcomp.DeconvNet, zcomp.EpsilonPlus, zcomp.EpsilonAlpha2Beta1, "epsilon_plus"]
)
def test_zennit_branch_equals_quantus_on_zennit(composite: object) -> None:
    kwargs = {"xai_lib": "zennit", "attributor": zattr.Gradient, "composite": composite}
    expected = theirs("explain", **kwargs)
    x, y = data()
    got = ours.explain(net(), x, y, **kwargs)
    assert got.shape == expected.shape == (3, 1, 6, 7)
    scale = np.abs(expected).max()
    assert scale > 0
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * scale)


def test_zennit_integrated_gradients_and_reduce_axes_equal_quantus() -> None:
    kwargs = {"xai_lib": "zennit", "attributor": zattr.IntegratedGradients, "attributor_kwargs": {"n_iter": 7},
              "reduce_axes": (1, 2)}  # fmt: skip
    expected = theirs("explain", **kwargs)
    x, y = data()
    got = ours.explain(net(), x, y, **kwargs)
    assert got.shape == expected.shape == (3, 1, 1, 7)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7)


def test_zennit_branch_refuses_what_it_does_not_compute() -> None:
    x, y = data()
    with pytest.raises(ValueError, match="ExcitationBackprop"):
        ours.explain(net(), x, y, xai_lib="zennit", composite=zcomp.ExcitationBackprop)
    with pytest.raises(ValueError, match="SmoothGrad"):
        ours.explain(net(), x, y, xai_lib="zennit", attributor=zattr.SmoothGrad)
    with pytest.raises(ValueError, match="no zennit composite"):
        ours.explain(net(), x, y, xai_lib="zennit", composite="epsilon")
    with pytest.raises(AssertionError):  # Quantus's contract; also an InvalidInputError
        ours.explain(net(), x, y, xai_lib="zennit", reduce_axes=(0, 1))
    with pytest.raises(ValueError, match="more axes"):
        ours.explain(net(), x, y, method="Gradient", reduce_axes=(1, 2, 3, 4))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"method": "DeepLift"},
        {"method": "Deconvolution"},
        {"method": "FeatureAblation"},
        {"method": "Occlusion", "window": (1, 2, 2)},
        {"method": "GuidedGradCam", "gc_layer": "model._modules.get('2')"},
        {"method": "LayerActivation", "gc_layer": "model._modules.get('2')", "interpolate": (6, 7)},
        {"method": "LayerGradientXActivation", "xai_lib_kwargs": {"layer": "model._modules.get('2')"}},
        {"method": "Saliency", "softmax": True},
    ],
    ids=lambda k: k["method"] + ("-softmax" if "softmax" in k else ""),
)
def test_captum_branch_methods_equal_quantus_on_captum(kwargs: dict) -> None:
    expected = theirs("generate_captum_explanation", **copy.deepcopy(kwargs))  # Quantus writes into xai_lib_kwargs
    x, y = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = ours.generate_captum_explanation(net(), x, y, **kwargs)
    assert got.shape == expected.shape
    scale = np.abs(expected).max()
    assert scale > 0
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * scale)


class FlatInForward(nn.Module):
    """The net above with the flattening in ``forward`` (captum's LRP has no rule for ``nn.Flatten``)."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = net()[:4], net()[5]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1))


def test_captum_branch_lrp_equals_quantus_on_captum() -> None:
    x, y = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = quantus_explain.generate_captum_explanation(FlatInForward().eval(), x, y, method="LRP")
    got = ours.generate_captum_explanation(FlatInForward().eval(), x, y, method="LRP")
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


def test_deprecated_gradcam_name_warns_and_unknown_methods_raise_a_key_error() -> None:
    x, y = data()
    with pytest.warns(UserWarning, match="deprecated"):
        got = ours.explain(net(), x, y, method="GradCam", gc_layer="model._modules.get('2')")
    assert got.shape == (3, 1, 4, 5)
    with pytest.raises(KeyError, match="Nonexistent"):
        ours.explain(net(), x, y, method="Nonexistent")


def test_get_explanation_refuses_models_that_are_not_torch_modules() -> None:
    x, y = data()
    with pytest.raises(ValueError, match=r"torch\.nn\.Module"):
        ours.get_explanation(object(), x, y)


def test_occlusion_default_window_on_a_three_channel_signal_occludes_one_channel_at_a_time() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(3, 4, 5), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 16, 5)).eval()
    x = np.random.RandomState(1).randn(3, 3, 20).astype(np.float32)
    y = np.array([0, 3, 4])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = quantus_explain.explain(model=model, inputs=x, targets=y, method="Occlusion")
        got = ours.explain(model=model, inputs=x, targets=y, method="Occlusion")
    assert got.shape == theirs.shape == (3, 1, 20)
    np.testing.assert_allclose(got, theirs, rtol=1e-5, atol=1e-7)
