"""camkit.compat.quantus's faithfulness classes against Quantus 0.6.0 on the same inputs and draws,
and the places where Quantus is wrong."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat import quantus as cq
from camkit.errors import InvalidInputError

quantus = pytest.importorskip("quantus")


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).eval()


@pytest.fixture(scope="module")
def batch():
    x = np.random.RandomState(0).rand(3, 1, 6, 6).astype(np.float32)
    a = np.random.RandomState(1).rand(3, 1, 6, 6).astype(np.float32)  # distinct values: no ties to order
    return small_net(), x, np.array([0, 2, 1]), a


def both(name, batch, *, seed=3, call=None, **kwargs):
    net, x, y, a = batch
    out = []
    for lib in (quantus, cq):
        np.random.seed(seed)
        extra = {"disable_warnings": True} if lib is quantus else {}
        metric = getattr(lib, name)(**kwargs, **extra)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out.append(metric(model=net, x_batch=x, y_batch=y, a_batch=a, device="cpu", **(call or {})))
    return out


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("PixelFlipping", {"features_in_step": 3}),
        ("PixelFlipping", {"features_in_step": 4, "perturb_baseline": 0.5}),
        ("FaithfulnessEstimate", {"features_in_step": 2}),
        ("FaithfulnessCorrelation", {"nr_runs": 8, "subset_size": 5, "return_aggregate": False}),
        ("FaithfulnessCorrelation", {"nr_runs": 5, "subset_size": 7}),  # aggregate: the mean, as Quantus
        ("MonotonicityCorrelation", {"nr_samples": 4, "features_in_step": 4}),
    ],
)
def test_equal_to_quantus_on_the_same_draws(name, kwargs, batch):
    theirs, ours = both(name, batch, normalise=False, **kwargs)
    np.testing.assert_allclose(np.array(ours, dtype=float), np.array(theirs, dtype=float), rtol=1e-5, atol=1e-6)


def test_auc_per_sample_is_the_trapezoid_of_quantus_curves(batch):
    theirs, _ = both("PixelFlipping", batch, normalise=False, features_in_step=4)
    net, x, y, a = batch
    ours = cq.PixelFlipping(features_in_step=4, normalise=False, return_auc_per_sample=True)(
        model=net, x_batch=x, y_batch=y, a_batch=a
    )
    np.testing.assert_allclose(ours, np.trapezoid(np.array(theirs), dx=1.0, axis=1), rtol=1e-5)
    if not hasattr(np, "trapz"):  # Quantus 0.6.0 calls np.trapz, gone in numpy 2.4
        with pytest.raises(AttributeError, match="trapz"):
            both("PixelFlipping", batch, normalise=False, features_in_step=4, return_auc_per_sample=True)


def test_equal_to_quantus_with_normalise_on_one_sample_and_batches(batch):
    net, x, y, a = batch
    one = (net, x[:1], y[:1], a[:1])  # one sample: Quantus's batch-wide max is the sample's own
    theirs, ours = both("FaithfulnessEstimate", one, normalise=True, abs=True, features_in_step=3)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    # batch_size splits the call into batches as Quantus does; the draws follow the same order
    theirs, ours = both("FaithfulnessCorrelation", batch, normalise=False, nr_runs=4, subset_size=3,
                        return_aggregate=False, call={"batch_size": 2})  # fmt: skip
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_quantus_monotonicity_always_true_camkit_restores_features(batch):
    theirs, ours = both("Monotonicity", batch, normalise=False, features_in_step=6)
    assert theirs == [True, True, True]  # Quantus writes the baseline back: the input never changes
    net, x, y, a = batch
    from camkit.metrics import pixel_flipping

    # Quantus's own PixelFlipping shows its model is far from constant on these inputs
    curves = pixel_flipping(net, torch.from_numpy(x), torch.from_numpy(a), torch.from_numpy(y), features_in_step=6)
    assert bool((curves.max(dim=1).values - curves.min(dim=1).values > 1e-3).all())
    assert ours != theirs and all(isinstance(v, bool) for v in ours)


def test_normalise_is_per_sample_in_camkit_batch_wide_in_quantus(batch):
    net, x, y, a = batch
    a = a.copy()
    a[1] *= 100.0  # a loud batch-mate
    kwargs = dict(normalise=True, features_in_step=6)
    theirs, ours = both("PixelFlipping", (net, x, y, a), **kwargs)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)  # removal order does not depend on the scale
    estimate_q, estimate_c = both("FaithfulnessCorrelation", (net, x, y, a), normalise=True, nr_runs=6,
                                  subset_size=4, return_aggregate=False)  # fmt: skip
    np.testing.assert_allclose(estimate_c, estimate_q, rtol=1e-5)  # Pearson ignores a scale too
    metric = cq.Metric(normalise=True)
    maps = metric._preprocess(torch.from_numpy(a))
    assert maps.flatten(1).abs().amax(dim=1).tolist() == pytest.approx([1.0, 1.0, 1.0])
    batch_wide = quantus.normalise_func.normalise_by_max(a)
    assert batch_wide.reshape(3, -1).max(axis=1)[0] < 0.02  # Quantus shrinks sample 0 by its batch-mate


def test_black_means_the_sample_minimum_in_compat_and_zero_natively(batch):
    net, x, y, a = batch
    x = x + 0.5  # minimum about 0.5, not 0
    theirs, ours = both("PixelFlipping", (net, x, y, a), normalise=False, features_in_step=36)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    from camkit.metrics import pixel_flipping

    native = pixel_flipping(net, torch.from_numpy(x), torch.from_numpy(a), torch.from_numpy(y), features_in_step=36)
    zero = net(torch.zeros(3, 1, 6, 6)).gather(1, torch.from_numpy(y)[:, None])[:, 0]
    torch.testing.assert_close(native[:, 0], zero.detach())
    assert not np.allclose(np.array(ours)[:, 0], native[:, 0].numpy())


def test_explain_func_quantus_style_and_camkit_explainer(batch):
    net, x, y, a = batch

    def explain(model, inputs, targets, **kwargs):
        assert isinstance(inputs, np.ndarray) and kwargs == {"scale": 2.0}
        return a[: len(inputs)] * kwargs["scale"]

    metric = cq.PixelFlipping(features_in_step=12, normalise=False)
    got = metric(model=net, x_batch=x, y_batch=y, explain_func=explain, explain_func_kwargs={"scale": 2.0})
    want = metric(model=net, x_batch=x, y_batch=y, a_batch=a)
    assert got == want and len(got) == 3 and len(got[0]) == 3
    import camkit

    net2 = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    explainer = camkit.GradCAM(net2, layer="0")
    scores = cq.FaithfulnessEstimate(features_in_step=6)(model=net2, x_batch=x, y_batch=y, explain_func=explainer)
    maps = explainer(torch.from_numpy(x), torch.from_numpy(y))[:, None].expand(3, 1, 6, 6)
    direct = cq.FaithfulnessEstimate(features_in_step=6)(model=net2, x_batch=x, y_batch=y, a_batch=maps.numpy())
    np.testing.assert_allclose(scores, direct)


def test_channel_last_inputs_and_aggregate(batch):
    net, x, y, a = batch
    metric = cq.FaithfulnessEstimate(features_in_step=6, return_aggregate=True, aggregate_func=np.median)
    last = metric(model=net, x_batch=np.moveaxis(x, 1, -1), y_batch=y, a_batch=np.moveaxis(a, 1, -1), channel_first=False)
    per_sample = cq.FaithfulnessEstimate(features_in_step=6)(model=net, x_batch=x, y_batch=y, a_batch=a)
    assert last == [pytest.approx(np.median(per_sample))]
    assert metric.all_evaluation_scores == last


def test_compat_errors():
    with pytest.raises(InvalidInputError, match="perturb_baseline"):
        cq.PixelFlipping(perturb_baseline="neighbourhood_mean")
    with pytest.raises(InvalidInputError, match="perturb_func"):
        cq.Sufficiency(perturb_func=lambda arr, **kw: arr)  # no perturbation to replace (Quantus refuses it too)
    with pytest.raises(TypeError, match="unknown"):
        cq.PixelFlipping(not_an_argument=1)
    with pytest.raises(InvalidInputError, match="a_batch"):
        cq.PixelFlipping()(model=small_net(), x_batch=np.zeros((1, 1, 6, 6), np.float32), y_batch=np.zeros(1))


def test_sensitivity_n_calls_any_similarity_as_quantus_calls_it(batch):
    from scipy.stats import rankdata

    net, x, y, a = batch
    calls = []

    def spy(a=None, b=None, batched=False, **kwargs):
        calls.append((a.shape, b.shape, batched))
        return np.full(len(a), 0.5)

    def run(func=None):
        np.random.seed(2)
        return cq.SensitivityN(similarity_func=func, features_in_step=12, nr_samples=5, return_aggregate=False)(
            model=net, x_batch=x, y_batch=y, a_batch=a)

    assert run(spy) == pytest.approx([0.5] * 2) and calls == [((3, 5), (3, 5), True)] * 2  # per n: B rows of draws
    spearman = run(quantus.similarity_func.correlation_spearman)

    def by_ranks(a=None, b=None, batched=True):  # Pearson's correlation of the ranks, row by row
        ra, rb = (rankdata(v, axis=1) for v in (a, b))
        return np.array([np.corrcoef(p, q)[0, 1] for p, q in zip(ra, rb)])

    assert spearman == pytest.approx(run(by_ranks)) and spearman != pytest.approx(run())
    assert run() == pytest.approx(run(quantus.similarity_func.correlation_pearson))


def test_compat_leaves_the_model_and_arrays_as_they_were(batch):
    net, x, y, a = batch
    net.train()
    x0, a0 = x.copy(), a.copy()
    cq.PixelFlipping(features_in_step=12)(model=net, x_batch=x, y_batch=y, a_batch=a)
    assert all(m.training for m in net.modules())  # Quantus leaves it in eval mode
    assert all(p.grad is None for p in net.parameters())
    assert np.array_equal(x, x0) and np.array_equal(a, a0)
    net.eval()
