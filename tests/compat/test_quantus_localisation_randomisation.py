"""camkit.compat.quantus's localisation and randomisation classes against Quantus 0.6.0, and where Quantus is wrong."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import camkit
from camkit.compat import quantus as cq
from camkit.errors import InvalidInputError
from tests.models import RankNet, rank_input

quantus = pytest.importorskip("quantus")


def run(lib, name, *, seed=3, init=None, **call):
    np.random.seed(seed)
    extra = {"disable_warnings": True} if lib is quantus else {}
    with warnings.catch_warnings(), torch.random.fork_rng():
        warnings.simplefilter("ignore")
        return getattr(lib, name)(**(init or {}), **extra)(**call)


def masks_and_maps(batch: int = 4):
    g = np.random.RandomState(0)
    a = g.rand(batch, 1, 6, 6).astype(np.float32)
    s = (g.rand(batch, 1, 6, 6) > 0.6).astype(np.float32)
    s[-1] = 0  # the last region is empty
    x = g.rand(batch, 1, 6, 6).astype(np.float32)
    return x, np.zeros(batch, dtype=int), a, s


@pytest.mark.parametrize(
    ("name", "init"),
    [
        ("RelevanceMassAccuracy", {}),
        ("RelevanceRankAccuracy", {}),
        ("TopKIntersection", {"k": 8}),
        ("TopKIntersection", {"k": 8, "concept_influence": True}),
        ("AttributionLocalisation", {}),
        ("AUC", {}),
        ("AUC", {"abs": True, "normalise": False}),
    ],
)
def test_localisation_equals_quantus(name: str, init: dict) -> None:
    x, y, a, s = masks_and_maps()
    call = {"model": None, "x_batch": x, "y_batch": y, "a_batch": a, "s_batch": s}
    theirs = np.asarray(run(quantus, name, init=init, **call), dtype=np.float64)
    ours = np.asarray(run(cq, name, init=init, **call), dtype=np.float64)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, equal_nan=True)
    assert np.isnan(ours[-1])


def test_pointing_game_empty_region_and_weighting() -> None:
    x, y, a, s = masks_and_maps()
    call = {"model": None, "x_batch": x, "y_batch": y, "a_batch": a, "s_batch": s}
    theirs = run(quantus, "PointingGame", **call)
    ours = run(cq, "PointingGame", **call)
    assert [bool(v) for v in theirs[:-1]] == ours[:-1]
    assert bool(theirs[-1]) is True and np.isnan(ours[-1])  # Quantus: an empty region is a hit
    weighted = run(cq, "PointingGame", init={"weighted": True}, **call)
    share = s[:-1].reshape(3, -1).mean(1)
    np.testing.assert_allclose(weighted[:-1], np.asarray(ours[:-1], dtype=float) * (1 - share))
    with pytest.raises(TypeError):  # Quantus 0.6.0's weighted pointing game fails outright
        run(quantus, "PointingGame", init={"weighted": True}, **call)


def test_focus_equals_quantus() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(36, 2)).eval()
    x, y, a, _ = masks_and_maps(3)
    a = a - 0.3  # some negative relevance, clipped by Focus
    parts = np.array([[1, 0, 0, 1], [0, 1, 0, 0], [1, 1, 1, 0]])
    call = {"model": net, "x_batch": x, "y_batch": y, "a_batch": a, "custom_batch": parts}
    np.testing.assert_allclose(run(cq, "Focus", **call), run(quantus, "Focus", **call), rtol=1e-5)
    with pytest.raises(InvalidInputError, match="custom_batch"):
        run(cq, "Focus", model=net, x_batch=x, y_batch=y, a_batch=a)


def test_localisation_needs_masks_of_the_right_size() -> None:
    x, y, a, s = masks_and_maps()
    with pytest.raises(InvalidInputError, match="s_batch"):
        run(cq, "AUC", model=None, x_batch=x, y_batch=y, a_batch=a)
    with pytest.raises(InvalidInputError, match="do not match"):
        run(cq, "AUC", model=None, x_batch=x, y_batch=y, a_batch=a, s_batch=s[:, :, :5])


# ---- randomisation --------------------------------------------------------------------------


def q_explain(model, inputs, targets, **kwargs):
    x = torch.as_tensor(inputs).clone().requires_grad_(True)
    out = model(x)
    (grad,) = torch.autograd.grad(out.gather(1, torch.as_tensor(targets).long()[:, None]).sum(), x)
    return (grad * x).sum(1, keepdim=True).detach().numpy()


def setup():
    net = RankNet(2, classes=3).eval()
    x = rank_input(2, batch=3).numpy()
    return net, x, np.array([0, 2, 1])


@pytest.mark.parametrize(
    "order",
    [
        "top_down",
        pytest.param("bottom_up", marks=pytest.mark.slow),
        pytest.param("independent", marks=pytest.mark.slow),
    ],
)
def test_mprt_per_layer_equals_quantus(order: str) -> None:
    net, x, y = setup()
    call = {"model": net, "x_batch": x, "y_batch": y, "explain_func": q_explain, "device": "cpu"}
    theirs = run(quantus, "MPRT", init={"layer_order": order}, **call)
    ours = run(cq, "MPRT", init={"layer_order": order}, **call)
    assert list(ours) == list(theirs)
    for name in theirs:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-4, atol=1e-6)
    rng_before = torch.random.get_rng_state()
    cq.MPRT()(**call)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # the caller's generator is left alone


def test_mprt_average_leaves_out_the_unrandomised_entry() -> None:
    net, x, y = setup()
    call = {"model": net, "x_batch": x, "y_batch": y, "explain_func": q_explain, "device": "cpu"}
    per_layer = run(cq, "MPRT", **call)
    layers = [k for k in per_layer if k != "original"]
    expected = np.mean([per_layer[k] for k in layers], axis=0)
    ours = run(cq, "MPRT", init={"return_average_correlation": True}, **call)
    theirs = run(quantus, "MPRT", init={"return_average_correlation": True}, **call)
    np.testing.assert_allclose(ours, expected, rtol=1e-5)
    np.testing.assert_allclose(theirs, (expected * len(layers) + 1.0) / (len(layers) + 1), rtol=1e-4)
    last = run(cq, "MPRT", init={"return_last_correlation": True}, **call)
    np.testing.assert_allclose(last, per_layer[layers[-1]])


def test_mprt_with_a_camkit_explainer_rebuilt_on_each_copy() -> None:
    net, x, y = setup()
    explainer = camkit.GradCAM(net, "conv2")
    res = run(cq, "MPRT", model=net, x_batch=x, y_batch=y, explain_func=explainer, device="cpu")
    np.testing.assert_allclose(res["original"], 1.0, atol=1e-5)
    assert all(np.isfinite(v).all() or True for v in res.values())
    assert {k for k in res} == {"original", "fc", "conv2", "bn1", "conv1"}
    assert not np.allclose(res["conv1"], 1.0)  # the copies' maps change: the explainer follows the copy


def test_smooth_mprt_with_one_sample_equals_quantus_and_quantus_ignores_explain_func() -> None:
    net, x, y = setup()
    saliency = {"explain_func": quantus.explain, "explain_func_kwargs": {"method": "Saliency"}}
    call = {"model": net, "x_batch": x, "y_batch": y, "device": "cpu"}
    init = {"nr_samples": 1}
    theirs = run(quantus, "SmoothMPRT", init=init, **call, **saliency)
    ours = run(cq, "SmoothMPRT", init=init, **call, **saliency)
    for name in theirs:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-4, atol=1e-6)
    # Quantus's SmoothMPRT calls quantus.explain(**explain_func_kwargs) whatever explain_func is
    own = {"explain_func": q_explain, "explain_func_kwargs": {"method": "Saliency"}}
    ignored = run(quantus, "SmoothMPRT", init=init, **call, **own)
    for name in theirs:
        np.testing.assert_allclose(ignored[name], theirs[name], rtol=1e-6)
    followed = run(cq, "SmoothMPRT", init=init, **call, **own)
    plain = run(cq, "MPRT", init={"layer_order": "bottom_up"}, **call, explain_func=q_explain)
    for name in plain:
        np.testing.assert_allclose(followed[name], plain[name], rtol=1e-5)
    assert not np.allclose(followed["conv1"], theirs["conv1"], atol=1e-3)
    smooth = run(cq, "SmoothMPRT", init={"nr_samples": 3}, **call, **own)
    assert set(smooth) == set(theirs)


def test_efficient_mprt_equals_quantus() -> None:
    net, x, y = setup()
    call = {"model": net, "x_batch": x, "y_batch": y, "explain_func": q_explain, "device": "cpu"}
    for init in ({}, {"complexity_func_kwargs": {"n_bins": 12}}):
        np.testing.assert_allclose(run(cq, "EfficientMPRT", init=init, **call),
                                   run(quantus, "EfficientMPRT", init=init, **call), rtol=1e-4)  # fmt: skip


def test_random_logit_draws_quantus_classes_and_compares_on_the_grid() -> None:
    net, x, y = setup()
    call = {"model": net, "x_batch": x, "y_batch": y, "explain_func": q_explain, "device": "cpu"}
    init = {"num_classes": 3, "normalise": False}  # Quantus normalises by the batch's maximum

    # Quantus's default, passed explicitly: called as Quantus calls it, on the flattened rows
    theirs = run(quantus, "RandomLogit", init=init, **call)
    same = run(cq, "RandomLogit", init={**init, "similarity_func": quantus.similarity_func.ssim}, **call)
    np.testing.assert_allclose(same, theirs, rtol=1e-4)
    on_grid = run(cq, "RandomLogit", init=init, **call)
    assert not np.allclose(on_grid, theirs, atol=1e-3)


def test_auc_is_summed_as_scikit_learn_and_native_is_correctly_rounded():
    # float64 maps with ties, ranks that collide with the region, and a map whose area is exactly 1/3
    g = np.random.RandomState(1)
    a = np.round(g.rand(6, 1, 5, 5) * 4) / 4  # ties between positives and negatives
    s = (g.rand(6, 1, 5, 5) > 0.5).astype(np.float64)
    a[0, 0], s[0, 0] = 2.0, 0.0  # map 0: one positive (1.0) above 8 of its 24 negatives, an area of 1/3
    a[0, 0, 0, 0], s[0, 0, 0, 0] = 1.0, 1.0
    a[0, 0, 4, :], a[0, 0, 3, :3] = 0.0, 0.0
    x, y = np.zeros((6, 1, 5, 5)), np.zeros(6, dtype=int)
    ours = run(cq, "AUC", init={"normalise": False}, model=None, x_batch=x, y_batch=y, a_batch=a, s_batch=s)
    theirs = run(quantus, "AUC", init={"normalise": False}, model=None, x_batch=x, y_batch=y, a_batch=a, s_batch=s)
    assert ours == list(theirs)  # to the last bit
    native = camkit.metrics.region_auc(torch.as_tensor(a[:, 0]), torch.as_tensor(s[:, 0]) > 0)
    torch.testing.assert_close(native, torch.as_tensor(ours, dtype=torch.float64), rtol=1e-15, atol=0)
    assert float(native[0]) == 1 / 3 != ours[0]  # the trapezoid's rounding: 0.33333333333333337
