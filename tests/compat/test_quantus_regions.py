"""camkit.compat.quantus's RegionPerturbation, Selectivity, IROF, Sufficiency and ROAD against Quantus 0.6.0."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat import quantus as cq
from camkit.metrics import irof
from camkit.metrics.regions import slic_segments

quantus = pytest.importorskip("quantus")


def conv_net(channels: int = 1) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 3)).eval()


def data(channels: int = 1, batch: int = 4):
    x = np.random.RandomState(0).rand(batch, channels, 8, 8).astype(np.float32)
    a = np.random.RandomState(1).randn(batch, 1, 8, 8).astype(np.float32)
    return x, np.array([0, 2, 1, 1])[:batch], a


def run(lib, name, net, x, y, a, *, seed=3, call=None, **kwargs):
    np.random.seed(seed)
    extra = {"disable_warnings": True} if lib is quantus else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = getattr(lib, name)(normalise=False, **kwargs, **extra)
        return metric(model=net, x_batch=x, y_batch=y, a_batch=a.copy(), device="cpu", **(call or {}))


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("RegionPerturbation", {"patch_size": 2, "regions_evaluation": 5}),
        ("RegionPerturbation", {"patch_size": 4, "order": "lerf", "perturb_baseline": "uniform"}),
        ("Selectivity", {"patch_size": 4}),
        ("Sufficiency", {"threshold": 0.9}),
        ("ROAD", {"percentages": [25, 50], "noise": 0.0}),
    ],
)
def test_equal_to_quantus(name, kwargs):
    x, y, a = data()
    net = conv_net()
    theirs = run(quantus, name, net, x, y, a, **kwargs)
    ours = run(cq, name, net, x, y, a, **kwargs)
    if name == "ROAD":
        assert ours == pytest.approx(theirs)
    else:
        np.testing.assert_allclose(np.array(ours, dtype=float), np.array(theirs, dtype=float), rtol=1e-5, atol=1e-6)
    if name == "Sufficiency":
        assert len(set(ours)) > 1  # not a trivial case: some samples agree with their neighbours, some not


def test_quantus_road_scores_only_the_first_batch_and_fails_on_rgb():
    x, y, a = data()
    net = conv_net()
    kwargs = dict(percentages=[25, 50], noise=0.0)
    theirs = run(quantus, "ROAD", net, x, y, a, call={"batch_size": 2}, **kwargs)
    first = run(quantus, "ROAD", net, x[:2], y[:2], a[:2], **kwargs)
    ours = run(cq, "ROAD", net, x, y, a, call={"batch_size": 2}, **kwargs)
    assert theirs == first  # the second batch is dropped
    assert ours == run(cq, "ROAD", net, x, y, a, **kwargs)  # every sample, whatever the batch size
    assert ours != theirs
    rgb, net3 = data(channels=3)[0], conv_net(3)
    with pytest.raises(Exception):  # noqa: B017 - Quantus's imputation indexes past the image
        run(quantus, "ROAD", net3, rgb, y, a, **kwargs)
    got = run(cq, "ROAD", net3, rgb, y, a, **kwargs)
    assert set(got) == {25, 50} and all(0.0 <= v <= 1.0 for v in got.values())


def test_irof_is_the_papers_area_with_slic_segments():
    x, y, a = data()
    net = conv_net()
    ours = run(cq, "IROF", net, x, y, a, perturb_baseline=0.0)
    xt = torch.from_numpy(x)
    direct = irof(net, xt, torch.from_numpy(a)[:, 0], torch.from_numpy(y), segments=slic_segments(xt), baseline=0.0)
    np.testing.assert_allclose(ours, direct.numpy(), rtol=1e-6)
    if not hasattr(np, "trapz"):  # Quantus 0.6.0's IROF calls np.trapz, gone in numpy 2.4
        with pytest.raises(AttributeError, match="trapz"):
            run(quantus, "IROF", net, x, y, a, perturb_baseline=0.0)
