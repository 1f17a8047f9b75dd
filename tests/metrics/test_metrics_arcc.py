"""ARCC with its complexity and coherency parts: by hand, and against pytorch-grad-cam 1.5.7."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import camkit
from camkit.metrics import arcc, arcc_complexity, coherency
from camkit.metrics.arcc import road_removals

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "methods"))
from test_cam_extra_parity import TARGETS, SmallCNN, anchor_targets, inputs


class Sum(nn.Module):
    """Score 0 = the sum of the input, score 1 = minus it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.flatten(1).sum(dim=1)
        return torch.stack([s, -s], dim=1)


def test_complexity_is_the_mean_absolute_value_any_rank():
    torch.testing.assert_close(arcc_complexity(torch.tensor([[0.0, 1.0, 0.5, 0.5]])), torch.tensor([0.5]))
    torch.testing.assert_close(arcc_complexity(torch.ones(2, 3, 4, 4)), torch.ones(2))
    with pytest.raises(camkit.InvalidInputError, match="maps must be"):
        arcc_complexity(torch.ones(4))


def test_coherency_by_hand():
    x = torch.ones(1, 1, 1, 4)
    maps = torch.tensor([[[0.0, 0.5, 1.0, 0.5]]])
    # an "explainer" that returns the masked image squared: [0, .25, 1, .25]
    got = coherency(x, maps, lambda images, target: images[:, 0] ** 2)
    a, b = np.array([0.0, 0.25, 1.0, 0.25]), np.array([0.0, 0.5, 1.0, 0.5])
    r = np.corrcoef(a, b)[0, 1]
    torch.testing.assert_close(got, torch.tensor([(r + 1) / 2], dtype=torch.float32))
    # anti-correlated maps give 0, a flat answer 0.5
    assert coherency(x, maps, lambda images, target: 1 - images[:, 0]).item() == pytest.approx(0.0, abs=1e-6)
    assert coherency(x, maps, lambda images, target: torch.zeros(1, 1, 4)).item() == pytest.approx(0.5)


def test_road_removals_follow_the_percentile_threshold():
    values = np.random.default_rng(0).random(51)  # (n - 1) * 0.2 = 10.000000000000002 in floats
    for p, removed in zip([20, 40, 60, 80], road_removals([20, 40, 60, 80], 51)):
        assert removed == int((values >= np.percentile(values, p)).sum())


def test_arcc_combines_its_parts_by_the_harmonic_mean():
    # Sum model: removing pixels and imputing them from neighbours changes the score in a known way
    # only through the imputation, so check the combination rule on the parts instead.
    x = torch.rand(2, 3, 6, 6, generator=torch.Generator().manual_seed(0))
    maps = torch.rand(2, 6, 6, generator=torch.Generator().manual_seed(1))
    explainer = lambda images, target: images.mean(dim=1) / x.mean(dim=1)  # noqa: E731  gives maps back
    s = arcc(Sum(), x, maps, explainer, 0, noise=0.0)
    torch.testing.assert_close(s.coherency, torch.ones(2), atol=1e-6, rtol=0)
    torch.testing.assert_close(s.complexity, maps.flatten(1).mean(dim=1))
    _, lerf = camkit.metrics.road_curve(Sum(), x, maps, 0, fractions=[c / 36 for c in road_removals([20, 40, 60, 80], 36)],
                                        order="lerf", noise=0.0)
    _, morf = camkit.metrics.road_curve(Sum(), x, maps, 0, fractions=[c / 36 for c in road_removals([20, 40, 60, 80], 36)],
                                        order="morf", noise=0.0)
    road = (lerf.mean(dim=1) - morf.mean(dim=1)).clamp(0, 1)
    torch.testing.assert_close(s.road, road)
    expected = 3 / (1 / (s.coherency + 1e-8) + 1 / (1 - s.complexity + 1e-8) + 1 / (road + 1e-8))
    torch.testing.assert_close(s.arcc, expected)
    assert s.arcc.min() > 0 and math.isfinite(s.arcc.sum().item())


def test_arcc_equals_pytorch_grad_cam(monkeypatch):
    pgc = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.metrics import arcc as anchor_arcc
    from pytorch_grad_cam.metrics import road as anchor_road

    # no imputation noise in either library (the anchor draws it from torch's global generator per image)
    monkeypatch.setattr(anchor_road.NoisyLinearImputer.__init__, "__defaults__", (0.0, anchor_road.neighbors_weights))
    model, x = SmallCNN().eval(), inputs()
    maps = torch.rand(3, 12, 12, generator=torch.Generator().manual_seed(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = pgc.GradCAM(model, [model.bn2])
        theirs = anchor_arcc.ARCC(base)(x, maps.numpy(), anchor_targets(), model)
        their_coherency = anchor_arcc.Coherency()(x, maps.numpy(), anchor_targets(), model, base)
        their_road = anchor_road.ROADCombined(percentiles=[20, 40, 60, 80])(x, maps.numpy(), anchor_targets(), model)
    ours = arcc(model, x, maps, camkit.GradCAM(model, "bn2"), TARGETS, noise=0.0)
    np.testing.assert_allclose(ours.complexity.numpy(), anchor_arcc.Complexity()(maps.numpy()), atol=1e-6)
    np.testing.assert_allclose(ours.coherency.numpy(), their_coherency, atol=1e-5)
    np.testing.assert_allclose(ours.road.numpy(), np.clip(their_road * 2, 0, 1), atol=1e-5)
    np.testing.assert_allclose(ours.arcc.numpy(), theirs, atol=1e-5)
    assert (ours.road > 0).any()  # a real ROAD part, not the clipped floor everywhere


def test_arcc_on_signals_and_volumes():
    for conv, shape in ((nn.Conv1d, (2, 2, 16)), (nn.Conv3d, (2, 2, 4, 4, 4))):
        torch.manual_seed(0)
        model = nn.Sequential(conv(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(1), nn.LazyLinear(3)).eval()
        x = torch.rand(*shape, generator=torch.Generator().manual_seed(1))
        model(x)  # materialise the lazy layer
        explainer = camkit.GradCAM(model, "1")
        maps = explainer(x, 0)
        s = arcc(model, x, maps, explainer, 0, noise=0.0)
        assert s.arcc.shape == s.road.shape == (2,)
        torch.testing.assert_close(s.complexity, maps.flatten(1).abs().mean(dim=1))
        expected = 3 / (1 / (s.coherency + 1e-8) + 1 / (1 - s.complexity + 1e-8) + 1 / (s.road + 1e-8))
        torch.testing.assert_close(s.arcc, expected)
