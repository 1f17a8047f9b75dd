"""camkit.compat.quantus on a float64 model: the inputs follow the model's dtype, where Quantus casts them to float32 and fails."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat import quantus as cq
from camkit.compat.quantus._base import model_dtype

quantus = pytest.importorskip("quantus")


class _Cast(nn.Module):
    """The float64 model behind a cast of its input: what Quantus's float32 inputs need to reach it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(x.double())
        return out


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 8 * 8, 3))
    return net.double().eval()


def _run(lib, name, init, **call):
    np.random.seed(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(getattr(lib, name)(disable_warnings=True, **init)(**call), dtype=np.float64)


@pytest.mark.parametrize(
    ("name", "init"),
    [
        ("FaithfulnessCorrelation", {"nr_runs": 3, "subset_size": 4, "return_aggregate": False}),
        ("PixelFlipping", {"features_in_step": 16}),
        ("MaxSensitivity", {"nr_samples": 2}),
    ],
)
def test_a_float64_model_equals_quantus_behind_a_cast(name, init):
    net = _net()
    rng = np.random.default_rng(0)
    x = rng.random((4, 1, 8, 8)).astype(np.float32).astype(np.float64)  # the same values in both precisions
    y = np.array([0, 1, 2, 0])
    call = {"x_batch": x, "y_batch": y, "device": "cpu"}
    if name == "MaxSensitivity":  # it explains each perturbed input again
        call.update(explain_func=quantus.explain, explain_func_kwargs={"method": "Saliency"})
    else:  # given maps: the order of the features is the same on both sides (no ties broken by rounding)
        call["a_batch"] = rng.random((4, 1, 8, 8)).astype(np.float32).astype(np.float64)
    with pytest.raises(RuntimeError, match="type"):  # Quantus hands the float64 model float32 inputs
        _run(quantus, name, init, model=net, **call)
    theirs = _run(quantus, name, init, model=_Cast(net).eval(), **call)
    if "explain_func" in call:
        call["explain_func"] = cq.explain
    ours = _run(cq, name, init, model=net, **call)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert all(p.dtype == torch.float64 and p.grad is None for p in net.parameters())


def test_model_dtype_reads_the_first_floating_parameter_or_buffer():
    assert model_dtype(None) == torch.float32
    assert model_dtype(nn.ReLU()) == torch.float32
    assert model_dtype(nn.Linear(2, 2).double()) == torch.float64
    assert model_dtype(nn.BatchNorm1d(2).half()) == torch.float16
    bare = nn.Module()
    bare.register_buffer("scale", torch.ones(2, dtype=torch.float64))
    assert model_dtype(bare) == torch.float64
