"""Region methods: FeatureAblation, ShapleyValueSampling, KernelShap and Lime.

Hand-computed values on a three-region toy game, Shapley efficiency, the exact Shapley
values by enumeration, the regions' plumbing (user masks, superpixels, renumbering,
deduplication, chunking, seeds) and agreement with captum.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from models import TinyNet, tiny_input
from torch import Tensor, nn

import camkit
from camkit.functional.regions import grid_regions, kernel_shap_coalitions, relabel_regions


class Game(nn.Module):
    """f(x) = x[0,0] * x[1,1] + 3 * x[0,1] on one-channel 2x2 images; class 1 is -f."""

    def forward(self, x: Tensor) -> Tensor:
        f = x[:, 0, 0, 0] * x[:, 0, 1, 1] + 3 * x[:, 0, 0, 1]
        return torch.stack([f, -f], dim=1)


# Regions: 0 = {x00}, 1 = {x01}, 2 = {x10, x11}. With x = [[1, 2], [3, 4]] and baseline 0 the
# game is v(S) = 4 [0 in S and 2 in S] + 6 [1 in S]; f(x) = 10, f(baseline) = 0.
REGIONS = torch.tensor([[0, 1], [2, 2]])
X = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])


def _values(e: camkit.Explanation) -> list[float]:
    return [round(v, 5) for v in e.extras["values"][0].tolist()]


def test_feature_ablation_by_hand():
    e = camkit.FeatureAblation(Game(), regions=REGIONS).explain(X, target=0)
    # phi_r = f(x) - v(all but r): 10 - 6, 10 - 4, 10 - 6
    assert _values(e) == [4.0, 6.0, 4.0]
    assert e.raw.tolist() == [[[4.0, 6.0], [4.0, 4.0]]]
    assert e.extras["evaluated"] == 3
    assert e.scores.tolist() == [10.0]


def test_shapley_sampling_by_hand_and_efficiency():
    # exact Shapley: the interaction 4 is shared by regions 0 and 2: (2, 6, 2).
    e = camkit.ShapleyValueSampling(Game(), regions=REGIONS, samples=400, seed=3).explain(X, target=0)
    values = e.extras["values"][0]
    assert values[1].item() == pytest.approx(6.0, abs=1e-6)  # no interaction: exact in every order
    assert values[0].item() == pytest.approx(2.0, abs=0.4) and values[2].item() == pytest.approx(2.0, abs=0.4)
    assert values.sum().item() == pytest.approx(10.0, abs=1e-5)  # efficiency holds exactly, each order telescopes
    assert values[0].item() + values[2].item() == pytest.approx(4.0, abs=1e-5)
    assert e.extras["evaluated"] <= 2**3  # 400 orders, at most 8 distinct coalitions run


def test_kernel_shap_exact_when_every_coalition_fits():
    e = camkit.KernelShap(Game(), regions=REGIONS, samples=6).explain(X, target=0)
    assert _values(e) == [2.0, 6.0, 2.0]
    assert e.extras["evaluated"] == 8


def test_kernel_shap_sampled_keeps_efficiency():
    model = TinyNet().eval()
    x = tiny_input(batch=2)
    e = camkit.KernelShap(model, cells=4, samples=30, seed=1).explain(x, target=[1, 2])
    with torch.no_grad():
        full = model(x).gather(1, torch.tensor([[1], [2]]))[:, 0]
        empty = model(torch.zeros_like(x))[:, [1, 2]].diagonal()
    torch.testing.assert_close(e.extras["values"].sum(dim=1), full - empty, atol=1e-4, rtol=0)


def test_lime_by_hand_matches_the_weighted_regression_over_all_coalitions():
    # With many samples every coalition z appears with frequency ~ 1/8; the fit tends to the
    # weighted least squares over the 8 coalitions, weights exp(-d^2 / (2 * 0.25^2)),
    # d = 1 - sqrt(|z| / 3) (d = 1 for the empty coalition).
    rows, weights, targets = [], [], []
    for z in itertools.product([0, 1], repeat=3):
        s = sum(z)
        d = 1 - math.sqrt(s / 3)
        rows.append([1.0, *z])
        weights.append(math.exp(-(d**2) / (2 * 0.25**2)))
        targets.append(4 * z[0] * z[2] + 6 * z[1])
    a, w, y = np.array(rows), np.sqrt(np.array(weights)), np.array(targets, dtype=float)
    expected = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)[0][1:]
    e = camkit.Lime(Game(), regions=REGIONS, samples=20000, seed=0).explain(X, target=0)
    np.testing.assert_allclose(e.extras["values"][0].numpy(), expected, atol=0.1)
    assert e.extras["evaluated"] == 8  # 20000 samples, 8 distinct coalitions


def test_region_maps_given_as_ids():
    ids = torch.tensor([[[5, 9], [7, 7]]])  # renumbered to 0, 2, 1: the same game
    e = camkit.FeatureAblation(Game(), regions=ids).explain(X, target=0)
    assert e.raw.tolist() == [[[4.0, 6.0], [4.0, 4.0]]]
    assert e.extras["regions"].tolist() == [[[0, 2], [1, 1]]]
    with pytest.raises(camkit.InvalidInputError, match=r"\[H, W\] or \[B, H, W\]"):
        camkit.FeatureAblation(Game(), regions=torch.zeros(3, 3, dtype=torch.long)).explain(X, target=0)
    with pytest.raises(camkit.InvalidInputError, match="regions must be"):
        camkit.FeatureAblation(Game(), regions="watershed")


def test_relabel_and_grid():
    assert grid_regions((3, 4), (2, 2)).tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3]]
    ids, counts = relabel_regions(torch.tensor([[[3, 3], [8, 8]], [[1, 2], [4, 1]]]))
    assert counts == [2, 3] and ids.tolist() == [[[0, 0], [1, 1]], [[0, 1], [2, 0]]]


def test_superpixels_and_ragged_region_counts():
    model = TinyNet().eval()
    x = tiny_input(batch=2, size=16)
    e = camkit.FeatureAblation(model, regions="slic", segments={"n_segments": 6}).explain(x, target=1)
    ids = e.extras["regions"]
    for b in range(2):  # each region's pixels share one value, equal to the score lost without them
        for r in ids[b].unique().tolist():
            inside = e.raw[b][ids[b] == r]
            assert torch.all(inside == inside[0])
            masked = x[b : b + 1] * (ids[b] != r)
            with torch.no_grad():
                drop = model(x[b : b + 1])[0, 1] - model(masked)[0, 1]
            assert inside[0].item() == pytest.approx(drop.item(), abs=1e-5)


@pytest.mark.heavy
@pytest.mark.parametrize("cls", [camkit.ShapleyValueSampling, camkit.KernelShap, camkit.Lime])
def test_seeds_and_chunking(cls):
    model = TinyNet().eval()
    x = tiny_input(batch=2)
    one = cls(model, cells=3, samples=12, seed=5, batch_size=3).explain(x, target=0).extras["values"]
    again = cls(model, cells=3, samples=12, seed=5, batch_size=64).explain(x, target=0).extras["values"]
    other = cls(model, cells=3, samples=12, seed=6, batch_size=3).explain(x, target=0).extras["values"]
    torch.testing.assert_close(one, again, atol=1e-5, rtol=0)
    assert not torch.allclose(one, other, atol=1e-3)


def test_tensor_baseline_and_neuron_target():
    model = TinyNet().eval()
    x = tiny_input(batch=1)
    base = torch.full((3, 8, 8), 0.5)
    target = camkit.NeuronTarget("conv2", 3)
    e = camkit.FeatureAblation(model, cells=2, baseline=base).explain(x, target=target)
    ids = e.extras["regions"][0]
    with torch.no_grad():
        value = model.conv2(model.relu(model.bn1(model.conv1(x))))[0, 3].mean()
        masked = torch.where(ids == 0, base, x[0])[None]
        ablated = model.conv2(model.relu(model.bn1(model.conv1(masked))))[0, 3].mean()
    assert e.extras["values"][0, 0].item() == pytest.approx((value - ablated).item(), abs=1e-5)


def test_kernel_shap_sampling_distribution():
    z = kernel_shap_coalitions(5, 20000, torch.Generator().manual_seed(0))
    sizes = torch.bincount(z.sum(dim=1), minlength=6)[1:5].double() / 20000
    kernel = torch.tensor([4 / (s * (5 - s)) for s in range(1, 5)], dtype=torch.float64)
    torch.testing.assert_close(sizes, kernel / kernel.sum(), atol=0.01, rtol=0)


# --- agreement with captum ----------------------------------------------------------------

captum_attr = pytest.importorskip("captum.attr", reason="captum is not installed")


def _exact_shapley(model: nn.Module, x: Tensor, ids: Tensor, target: int) -> Tensor:
    m = int(ids.max()) + 1
    value = {}
    with torch.no_grad():
        for z in itertools.product([0, 1], repeat=m):
            keep = torch.tensor(z, dtype=torch.float32)[ids]
            value[z] = model(x * keep)[0, target].double()
    phi = torch.zeros(m, dtype=torch.float64)
    for z, v in value.items():
        for i in range(m):
            if z[i]:
                continue
            s = sum(z)
            with_i = tuple(1 if j == i else z[j] for j in range(m))
            phi[i] += math.factorial(s) * math.factorial(m - s - 1) / math.factorial(m) * (value[with_i] - v)
    return phi


def test_feature_ablation_matches_captum():
    model = TinyNet().eval()
    x = tiny_input(batch=3)
    ids = grid_regions((8, 8), (4, 4))
    target = torch.tensor([0, 3, 1])
    ours = camkit.FeatureAblation(model, regions=ids, batch_size=5).explain(x, target).raw
    theirs = captum_attr.FeatureAblation(model).attribute(x, target=target, feature_mask=ids[None, None], baselines=0.0)
    for c in range(3):
        torch.testing.assert_close(ours, theirs[:, c], atol=1e-4, rtol=0)


@pytest.mark.heavy
def test_shapley_methods_agree_with_exact_values_and_captum():
    model = TinyNet().eval()
    x = tiny_input(batch=1)
    ids = grid_regions((8, 8), (2, 2))
    exact = _exact_shapley(model, x, ids, 2).float()
    scale = exact.abs().max().item()
    kernel = camkit.KernelShap(model, regions=ids, samples=14).explain(x, 2).extras["values"][0]
    torch.testing.assert_close(kernel, exact, atol=1e-4, rtol=0)  # every coalition used: exact
    sampled = camkit.ShapleyValueSampling(model, regions=ids, samples=60, seed=0).explain(x, 2).extras["values"][0]
    torch.manual_seed(0)
    theirs = captum_attr.ShapleyValueSampling(model).attribute(x, target=2, feature_mask=ids[None, None], n_samples=60)
    theirs_values = torch.stack([theirs[0, 0][ids == r][0] for r in range(4)])
    torch.testing.assert_close(sampled, exact, atol=0.1 * scale, rtol=0)
    torch.testing.assert_close(theirs_values, exact, atol=0.1 * scale, rtol=0)
    torch.manual_seed(0)
    ks = captum_attr.KernelShap(model).attribute(x, target=2, feature_mask=ids[None, None], n_samples=100)
    ks_values = torch.stack([ks[0, 0][ids == r][0] for r in range(4)])
    torch.testing.assert_close(ks_values, exact, atol=0.1 * scale, rtol=0)  # captum's expectation is the same


def test_lime_agrees_with_captum_given_the_same_kernel():
    # captum's Lime with camkit's kernel (distance between the coalition and the full one in
    # region space) and a plain linear regression tends to the same weighted fit.
    pytest.importorskip("sklearn")
    from captum._utils.models.linear_model import SkLearnLinearRegression

    def similarity(original, perturbed, interpretable, **kwargs):
        d = 1 - math.sqrt(float(interpretable.sum()) / interpretable.numel())
        return math.exp(-(d**2) / (2 * 0.25**2))

    lime = captum_attr.Lime(Game(), interpretable_model=SkLearnLinearRegression(), similarity_func=similarity)
    torch.manual_seed(0)
    theirs = lime.attribute(X, target=0, feature_mask=REGIONS[None, None], n_samples=600, perturbations_per_eval=600)
    theirs_values = torch.stack([theirs[0, 0][REGIONS == r][0] for r in range(3)])
    ours = camkit.Lime(Game(), regions=REGIONS, samples=600, seed=0).explain(X, target=0).extras["values"][0]
    torch.testing.assert_close(ours, theirs_values, atol=0.2, rtol=0)


@pytest.mark.parametrize("method", ["slic", "quickshift", "felzenszwalb"])
def test_each_superpixel_algorithm(method):
    from camkit.functional.regions import superpixel_regions

    x = torch.zeros(2, 3, 16, 16)
    x[:, :, :, 8:] = 1.0  # two flat halves: no superpixel crosses the edge
    ids = superpixel_regions(x, method)
    assert ids.shape == (2, 16, 16) and ids.dtype == torch.long
    left, right = set(ids[0, :, :8].unique().tolist()), set(ids[0, :, 8:].unique().tolist())
    assert not left & right
    if method == "quickshift":
        with pytest.raises(camkit.InvalidInputError, match="RGB"):
            superpixel_regions(x[:, :1], method)
