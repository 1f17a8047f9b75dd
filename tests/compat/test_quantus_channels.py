"""Maps with several channels in camkit.compat.quantus's localisation and randomisation classes, against Quantus."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat import quantus as cq

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
