"""``model_predict_kwargs`` and ``IROF(segmentation_method="felzenszwalb")`` in camkit.compat.quantus, as Quantus 0.6.0."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat import quantus as cq
from camkit.errors import InvalidInputError
from camkit.metrics import irof

quantus = pytest.importorskip("quantus")


class Tempered(nn.Module):
    """A classifier whose forward takes a keyword, as ``model_predict_kwargs`` passes it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 3))

    def forward(self, x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        return self.body(x) / temperature


def data():
    x = np.random.RandomState(0).rand(2, 3, 8, 8).astype(np.float32)
    a = np.random.RandomState(1).rand(2, 3, 8, 8).astype(np.float32)
    return x, np.array([0, 2]), a


def run(lib, name, net, *, call=None, **kwargs):
    x, y, a = data()
    np.random.seed(3)
    extra = {"disable_warnings": True} if lib is quantus else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = getattr(lib, name)(normalise=False, **kwargs, **extra)
        return metric(model=net, x_batch=x, y_batch=y, a_batch=a, device="cpu", **(call or {}))


@pytest.mark.parametrize(("name", "kwargs"), [
    ("PixelFlipping", {"features_in_step": 32}),
    ("FaithfulnessEstimate", {"features_in_step": 64}),
    ("Selectivity", {"patch_size": 4}),
    ("NonSensitivity", {"features_in_step": 1, "eps": 1e-3}),
])  # fmt: skip
def test_model_predict_kwargs_reach_the_forward_as_in_quantus(name, kwargs):
    net = Tempered().eval()
    call = {"model_predict_kwargs": {"temperature": 0.25}, "softmax": False}  # Quantus fails with softmax, below
    theirs, ours = run(quantus, name, net, call=call, **kwargs), run(cq, name, net, call=call, **kwargs)
    np.testing.assert_allclose(np.array(ours, dtype=float), np.array(theirs, dtype=float), rtol=1e-5, atol=1e-6)
    if name in ("PixelFlipping", "Selectivity"):  # the keyword changes the scores (the correlation is scale-free)
        plain = run(cq, name, net, **kwargs)
        assert not np.allclose(np.array(plain, dtype=float), np.array(ours, dtype=float))


class Baked(Tempered):
    def forward(self, x: torch.Tensor, temperature: float = 0.25) -> torch.Tensor:
        return super().forward(x, temperature)


def test_with_softmax_quantus_fails_and_camkit_takes_the_softmax_of_the_forward_with_keywords():
    """Quantus appends its softmax as ``nn.Sequential(model, Softmax)`` and passes the keywords to the
    Sequential, whose forward takes none: a TypeError. camkit passes them to the model's forward."""
    net, call = Tempered().eval(), {"model_predict_kwargs": {"temperature": 0.25}}
    with pytest.raises(TypeError, match="temperature"):
        run(quantus, "PixelFlipping", net, call=call, features_in_step=32)
    ours = run(cq, "PixelFlipping", net, call=call, features_in_step=32)
    np.testing.assert_allclose(ours, run(cq, "PixelFlipping", Baked().eval(), features_in_step=32), rtol=1e-6)


def test_explain_func_gets_the_callers_model_without_the_keywords():
    net, seen = Tempered().eval(), []

    def explain(model, inputs, targets, **kwargs):
        seen.append(model)
        return np.ones((inputs.shape[0], 1, 8, 8), np.float32)

    x, y, _ = data()
    cq.PixelFlipping(features_in_step=64)(
        model=net, x_batch=x, y_batch=y, explain_func=explain, model_predict_kwargs={"temperature": 2.0}
    )
    assert seen == [net]


def test_irof_felzenszwalb_segments_as_quantus_makes_them():
    from quantus.helpers.utils import get_superpixel_segments

    net = Tempered().eval()
    x, y, a = data()
    ours = run(cq, "IROF", net, segmentation_method="felzenszwalb", perturb_baseline=0.0)
    segments = np.stack([get_superpixel_segments(np.moveaxis(image, 0, -1).astype("double"), "felzenszwalb") for image in x])
    direct = irof(net, torch.from_numpy(x), torch.from_numpy(a), torch.from_numpy(y), segments=torch.from_numpy(segments),
                  baseline=0.0)  # fmt: skip
    np.testing.assert_allclose(ours, direct.numpy(), rtol=1e-6)
    assert not np.allclose(ours, run(cq, "IROF", net, perturb_baseline=0.0))  # SLIC segments differ
    with pytest.raises(InvalidInputError, match="felzenszwalb"):
        cq.IROF(segmentation_method="watershed")


def test_infidelity_calls_a_loss_func_as_quantus_does():
    """``loss_func(a=score_changes, b=attribution_sums, batched=True)`` per patch size, averaged over sizes;
    Quantus's own ``mse`` passed as a function gives the default's value."""
    net = Tempered().eval()
    x, y, a = data()
    calls = []

    def mean_abs(a, b, batched=False, **kwargs):
        calls.append((a.shape, b.shape, batched))
        return np.mean(np.abs(a - b), axis=-1)

    def score(loss_func):
        np.random.seed(4)
        metric = cq.Infidelity(loss_func=loss_func, perturb_patch_sizes=[2, 4], n_perturb_samples=5, perturb_baseline=0.0)
        return np.array(metric(model=net, x_batch=x, y_batch=y, a_batch=a), dtype=float)

    np.testing.assert_allclose(score(quantus.functions.loss_func.mse), score("mse"), rtol=1e-6)
    spy_mse = []

    def recorded_mse(a, b, batched=False, **kwargs):
        spy_mse.append(np.mean((a - b) ** 2, axis=-1))
        return spy_mse[-1]

    default = score(recorded_mse)
    ours = score(mean_abs)
    assert calls == [((2, 5), (2, 5), True)] * 2
    np.testing.assert_allclose(default, np.mean(spy_mse, axis=0), rtol=1e-6)  # the mean over the two sizes
    assert not np.allclose(ours, default)
    with pytest.raises(InvalidInputError, match="loss_func"):
        cq.Infidelity(loss_func="mae")
    with pytest.raises(ValueError, match="loss_func"):
        quantus.Infidelity(loss_func="mae", disable_warnings=True)


def test_infidelity_calls_a_perturb_func_on_each_square_as_quantus_does():
    """camkit's Infidelity draws random squares (its docstring); a ``perturb_func`` gets Quantus's arguments for
    each: ``arr=x [B, F]`` and the square's elements ``[B, C * size^2]``, channel by channel. Quantus's default
    function with keywords gives the default's value."""
    net = Tempered().eval()
    x, y, a = data()
    calls = []

    def spy(arr, indices, perturb_baseline, **kwargs):
        calls.append((arr.shape, indices.shape, perturb_baseline, kwargs))
        assert (np.diff(indices, axis=1) > 0).all() and (indices[:, 4] - indices[:, 0] == 64).all()  # next channel
        return quantus.functions.perturb_func.batch_baseline_replacement_by_indices(arr, indices, perturb_baseline)

    def score(**options):
        np.random.seed(4)
        metric = cq.Infidelity(perturb_patch_sizes=[2], n_perturb_samples=3, perturb_baseline=0.0, **options)
        return np.array(metric(model=net, x_batch=x, y_batch=y, a_batch=a), dtype=float)

    np.testing.assert_allclose(score(perturb_func=spy, perturb_func_kwargs={"k": 2}), score(), rtol=1e-6)
    assert calls == [((2, 192), (2, 12), 0.0, {"k": 2})] * 3


def test_irof_calls_a_perturb_func_with_each_segments_mask_as_quantus_does():
    """``perturb_func(arr=images [B, C, H, W], mask=[B, 1, H, W])`` once per removed segment, on the previous step's
    images (Quantus's IROF cannot run on numpy 2.4, see the differences table: the check is the call contract, and
    the mask function giving the default's value)."""
    net = Tempered().eval()
    x, y, a = data()
    calls = []

    def spy(arr, mask, perturb_baseline, **kwargs):
        calls.append((arr.shape, mask.shape, mask.dtype, int(mask.sum())))
        # the mask read on every channel: Quantus's mask function wants arr's shape, so fails on RGB as IROF calls it
        return quantus.functions.perturb_func.baseline_replacement_by_mask(arr, np.broadcast_to(mask, arr.shape), perturb_baseline)

    def score(**options):
        metric = cq.IROF(perturb_baseline=0.0, normalise=False, segmentation_method="felzenszwalb", **options)
        return np.array(metric(model=net, x_batch=x, y_batch=y, a_batch=a), dtype=float)

    np.testing.assert_allclose(score(perturb_func=spy, perturb_func_kwargs={"k": 1}), score(), rtol=1e-6)
    assert calls and all(c[:3] == ((2, 3, 8, 8), (2, 1, 8, 8), np.bool_) for c in calls)
    assert sum(c[3] for c in calls) == 2 * 64  # every position of both images removed once
