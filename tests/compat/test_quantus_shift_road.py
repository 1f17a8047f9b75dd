"""A caller's ``perturb_func`` in ``InputInvariance`` and ``ROAD``, called as Quantus 0.6.0 calls it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat import quantus as cq

quantus = pytest.importorskip("quantus")


class Smooth(nn.Module):
    """Unpadded first convolution (Quantus moves its shift into that layer's bias exactly) and tanh (a smooth
    gradient: any change of the input changes it)."""

    def __init__(self, channels: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(channels, 4, 3)
        self.act = nn.Tanh()
        self.fc = nn.Linear(4 * 4 * 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(self.conv(x)).flatten(1))


def gradient(model, inputs, targets, **kwargs):
    x = torch.as_tensor(inputs).clone().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(model(x).gather(1, torch.as_tensor(targets).long()[:, None]).sum(), x)
    return grad.detach().numpy()


def recorded(calls: list):
    """A shift of every value by ``input_shift + extra`` that records how it is called."""

    def shift_every(arr, indices, indexed_axes, input_shift, extra=0.0, **kwargs):
        calls.append(
            (arr.shape, arr.dtype, indices.copy(), np.asarray(indexed_axes).copy(), input_shift, extra, kwargs)
        )
        return arr + input_shift + extra

    return shift_every


def run(lib, name, *, model=None, call=None, **kwargs):
    extra = {"disable_warnings": True} if lib is quantus else {}
    np.random.seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(lib, name)(**kwargs, **extra)(model=model, device="cpu", **call)


def images(channels: int = 1):
    x = np.random.RandomState(0).rand(3, channels, 6, 8).astype(np.float32)
    return {"x_batch": x, "y_batch": np.array([0, 1, 2])}


@pytest.mark.parametrize("options", [{}, {"perturb_func_kwargs": {"input_shift": -2.0, "extra": 0.5}}])
def test_input_invariance_calls_the_perturb_func_as_quantus(options) -> None:
    results, calls = [], {}
    for lib in (quantus, cq):
        calls[lib] = []
        results.append(run(lib, "InputInvariance", model=Smooth().eval(), perturb_func=recorded(calls[lib]),
                           call={**images(), "a_batch": None, "explain_func": gradient}, **options))  # fmt: skip
    assert [bool(v) for v in results[0]] == results[1] == [not options] * 3  # off by `extra`: another input
    assert len(calls[quantus]) == len(calls[cq]) == 3  # once per input
    for theirs, ours in zip(calls[quantus], calls[cq]):
        assert theirs[:2] == ours[:2] and theirs[4:] == ours[4:]
        np.testing.assert_array_equal(theirs[2], ours[2])  # every index but the first, as Quantus's perturb_batch
        np.testing.assert_array_equal(theirs[3], ours[3])


def test_input_invariance_quantus_own_shift_leaves_the_first_value() -> None:
    """Quantus's ``perturb_batch`` drops index 0, so its default shift leaves each input's first value: on a
    network whose shifted copy is exact even the gradient fails; camkit shifts every value."""
    call = {**images(), "a_batch": None, "explain_func": gradient}
    own = quantus.functions.perturb_func.baseline_replacement_by_shift
    theirs = run(quantus, "InputInvariance", model=Smooth().eval(), call=call, perturb_func=own)
    assert not any(theirs)
    assert run(cq, "InputInvariance", model=Smooth().eval(), call=call, perturb_func=own) == [True] * 3
    assert all(run(quantus, "InputInvariance", model=Smooth().eval(), call=call, perturb_func=recorded([])))


def recorded_fill(calls: list):
    """Writes ``value + noise`` at the indices given (of the flattened input); records how it is called."""

    def fill(arr, indices, noise, value=0.0, **kwargs):
        calls.append((arr.shape, indices.copy(), noise, value, kwargs))
        out = arr.copy().reshape(-1)
        out[indices] = value + noise
        return out.reshape(arr.shape)

    return fill


@pytest.mark.parametrize("channels", [1, 3])
def test_road_calls_the_perturb_func_as_quantus(channels: int) -> None:
    """One batch (Quantus averages its first batch only); on three channels too, where Quantus's own imputation
    fails: the indices count over the input's values, as many as the map's ``p`` percent."""
    data = images(channels)
    data["a_batch"] = np.random.RandomState(1).rand(3, 1, 6, 8).astype(np.float32)
    options = {"percentages": [10, 30, 60], "normalise": False, "perturb_func_kwargs": {"value": -3.0}}
    results, calls = [], {}
    for lib in (quantus, cq):
        calls[lib] = []
        results.append(run(lib, "ROAD", model=Smooth(channels).eval(), perturb_func=recorded_fill(calls[lib]),
                           call=data, **options))  # fmt: skip
    assert list(results[0]) == list(results[1]) == [10, 30, 60]
    np.testing.assert_allclose([results[1][p] for p in (10, 30, 60)], [results[0][p] for p in (10, 30, 60)])
    assert len(calls[quantus]) == len(calls[cq]) == 9  # each input at each percentage
    for theirs, ours in zip(calls[quantus], calls[cq]):
        assert theirs[0] == ours[0] == (channels, 6, 8) and theirs[2:] == ours[2:] == (0.01, -3.0, {})
        np.testing.assert_array_equal(theirs[1], ours[1])
    assert len(set(results[1].values())) > 1  # the fill changes the classes as more is removed


def recorded_patch(calls: list):
    """Quantus's own replacement by indices, recording each call's array shape and indices."""
    own = quantus.functions.perturb_func.batch_baseline_replacement_by_indices

    def replace(arr, indices, **kwargs):
        calls.append((arr.shape, indices.copy()))
        return own(arr=arr, indices=indices, **kwargs)

    return replace


@pytest.mark.parametrize(("name", "options"), [
    ("RegionPerturbation", {"patch_size": 4, "regions_evaluation": 5}),
    ("RegionPerturbation", {"patch_size": 3, "order": "random"}),
    ("RegionPerturbation", {"patch_size": 4, "order": "lerf", "perturb_baseline": "uniform"}),
    ("Selectivity", {"patch_size": 4}),
    ("Selectivity", {"patch_size": 2}),
])  # fmt: skip
def test_patches_with_a_perturb_func_follow_quantus_padding_and_order(name: str, options: dict) -> None:
    """6 x 8 images: a patch_size of 4 or 3 does not divide both sides, and Quantus pads; the maps are
    rounded to a few values, so patches tie and are taken in numpy's order."""
    data = images(3)
    data["a_batch"] = np.round(np.random.RandomState(1).rand(3, 1, 6, 8) * 2).astype(np.float32)
    results, calls = [], {}
    for lib in (quantus, cq):
        calls[lib] = []
        results.append(run(lib, name, model=Smooth(3).eval(), perturb_func=recorded_patch(calls[lib]), call=data,
                           normalise=False, **options))  # fmt: skip
    np.testing.assert_allclose(np.asarray(results[1]), np.asarray(results[0]), rtol=1e-5, atol=1e-6)
    assert len(calls[cq]) == len(calls[quantus]) > 1
    for theirs, ours in zip(calls[quantus], calls[cq]):
        assert theirs[0] == ours[0]  # the padded images, flattened
        np.testing.assert_array_equal(theirs[1], ours[1])
