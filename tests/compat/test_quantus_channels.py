"""Maps with several channels in camkit.compat.quantus's localisation and randomisation classes, against Quantus."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit import metrics
from camkit.compat import quantus as cq
from tests.compat.test_quantus_localisation_randomisation import setup

quantus = pytest.importorskip("quantus")

LOCALISATION = [
    ("PointingGame", {}),
    ("AttributionLocalisation", {}),
    ("TopKIntersection", {"k": 8}),
    ("RelevanceRankAccuracy", {}),
    ("RelevanceMassAccuracy", {}),
    ("AUC", {}),
]


def _quiet(lib, name, init, **call):
    extra = {"disable_warnings": True} if lib is quantus else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(getattr(lib, name)(**init, **extra)(**call), dtype=np.float64)


def _rgb_maps(batch: int = 3):
    g = np.random.RandomState(0)
    a = g.randn(batch, 3, 6, 6).astype(np.float32)
    s = (g.rand(batch, 1, 6, 6) > 0.6).astype(np.float32)
    return g.rand(batch, 3, 6, 6).astype(np.float32), np.zeros(batch, dtype=int), a, s


@pytest.mark.parametrize(("name", "init"), LOCALISATION)
def test_localisation_reads_every_channel_as_positions_of_their_own(name: str, init: dict) -> None:
    x, y, a, s = _rgb_maps()
    ours = _quiet(cq, name, init, model=None, x_batch=x, y_batch=y, a_batch=a, s_batch=s)
    # Quantus's own value on the same problem laid out flat: the channels side by side, the mask repeated
    flat = {"x_batch": x.reshape(3, 1, 1, -1), "a_batch": a.reshape(3, 1, 1, -1),
            "s_batch": np.tile(s.reshape(3, 1, 1, -1), (1, 1, 1, 3))}  # fmt: skip
    theirs = _quiet(quantus, name, init, model=None, y_batch=y, channel_first=True, **flat)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    # Quantus 0.6.0 itself fails on the maps with channels: its one-channel mask is three times shorter
    with pytest.raises((ValueError, IndexError)):
        _quiet(quantus, name, init, model=None, x_batch=x, y_batch=y, a_batch=a, s_batch=s)


def test_focus_sums_each_channels_positive_relevance_as_quantus() -> None:
    g = np.random.RandomState(1)
    x, a = g.rand(3, 3, 8, 8).astype(np.float32), g.randn(3, 3, 8, 8).astype(np.float32)
    net = nn.Sequential(nn.Flatten(), nn.Linear(192, 2))
    call = {"model": net, "x_batch": x, "y_batch": np.zeros(3, dtype=int), "a_batch": a,
            "custom_batch": np.array([[1, 0, 0, 1], [0, 1, 0, 0], [1, 1, 1, 0]])}  # fmt: skip
    ours, theirs = _quiet(cq, "Focus", {}, **call), _quiet(quantus, "Focus", {}, **call)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    summed = _quiet(cq, "Focus", {}, **{**call, "a_batch": a.sum(1, keepdims=True)})
    assert not np.allclose(ours, summed, rtol=1e-3)  # not the focus of the summed map


def explain_rgb(model, inputs, targets, **kwargs):
    """Gradient x input per channel: maps [B, C, H, W]."""
    x = torch.as_tensor(inputs).clone().requires_grad_(True)
    with torch.enable_grad():
        out = model(x)
        (grad,) = torch.autograd.grad(out.gather(1, torch.as_tensor(targets).long()[:, None]).sum(), x)
    return (grad * x).detach().numpy()


@pytest.mark.parametrize(
    ("name", "init"),
    [
        ("MPRT", {"layer_order": "independent"}),
        ("EfficientMPRT", {"complexity_func_kwargs": {"n_bins": 12}}),
        ("RandomLogit", {"num_classes": 3, "similarity_func": quantus.similarity_func.correlation_spearman}),
    ],
)
def test_randomisation_compares_maps_with_channels_whole_as_quantus(name: str, init: dict) -> None:
    net, x, y = setup()
    call = {"model": net, "x_batch": x, "y_batch": y, "a_batch": explain_rgb(net, x, y), "explain_func": explain_rgb,
            "device": "cpu"}  # fmt: skip
    np.random.seed(3)
    theirs = getattr(quantus, name)(disable_warnings=True, **init)(**call)
    np.random.seed(3)
    with torch.random.fork_rng():
        ours = getattr(cq, name)(**init)(**call)
    if isinstance(theirs, dict):
        assert list(ours) == list(theirs)
        theirs, ours = np.concatenate(list(theirs.values())), np.concatenate(list(ours.values()))
    np.testing.assert_allclose(np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float), rtol=1e-4)


def test_random_logit_ssim_averages_the_channels_on_their_grid() -> None:
    net, x, y = setup()
    call = {"model": net, "x_batch": x, "y_batch": y, "explain_func": explain_rgb, "device": "cpu"}
    ours = np.asarray(cq.RandomLogit(num_classes=3, normalise=False)(**call))
    np.random.seed(42)
    off = np.random.randint(0, 2, len(y))
    off = off + (off >= y)
    a, b = torch.as_tensor(explain_rgb(net, x, y)), torch.as_tensor(explain_rgb(net, x, off))
    for i in range(len(y)):
        span = float(torch.maximum(a[i].max(), b[i].max()) - torch.minimum(a[i].min(), b[i].min()))
        per_channel = [float(metrics.ssim(a[i, c][None], b[i, c][None], data_range=span)) for c in range(3)]
        assert ours[i] == pytest.approx(np.mean(per_channel), rel=1e-5)
