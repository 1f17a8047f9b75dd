"""The ``perturb=`` hook of the perturbation metrics: a hook that writes the baseline gives the baseline's result,
and it is called once per step on the whole batch, in order."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from camkit import metrics


def zero_at(calls: list[tuple[int, ...]]):
    def perturb(images: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(indices.shape))
        flat = images.flatten(1).clone()
        flat.scatter_(1, indices, 0.0)
        return flat.view_as(images)

    return perturb


@pytest.fixture(scope="module")
def case():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 5)).eval()
    x, maps = torch.rand(3, 2, 4, 4), torch.rand(3, 2, 4, 4)
    return net, x, maps, torch.tensor([0, 3, 1])


@pytest.mark.parametrize(("name", "options", "count"), [
    ("pixel_flipping", {"features_in_step": 5}, 7),
    ("faithfulness_estimate", {"features_in_step": 8}, 4),
    ("monotonicity", {"features_in_step": 8}, 4),
    ("non_sensitivity", {"features_in_step": 4, "eps": 1e-3}, 8),
    ("region_perturbation", {"patch_size": 2}, 4),
    ("selectivity", {"patch_size": 2}, 4),
])  # fmt: skip
def test_a_hook_writing_the_baseline_equals_the_baseline(name, options, count, case):
    net, x, maps, y = case
    func = getattr(metrics, name)
    calls: list[tuple[int, ...]] = []
    hooked = func(net, x, maps, y, perturb=zero_at(calls), chunk_size=2, **options)
    if name == "monotonicity":  # the hook replaces restoring: it writes the baseline on the baseline
        assert torch.equal(hooked, func(net, torch.zeros_like(x), maps, y, **options))
    else:
        torch.testing.assert_close(hooked, func(net, x, maps, y, baseline=0.0, **options))
    assert len(calls) == count and all(c[0] == 3 for c in calls)


def test_correlation_and_sensitivity_n_hooks_get_the_subsets(case):
    net, x, maps, y = case
    g = torch.Generator().manual_seed(1)
    subsets = metrics.faithfulness.draw_subsets(3, 32, 5, 6, g)
    calls: list[tuple[int, ...]] = []
    hooked = metrics.faithfulness_correlation(net, x, maps, y, subsets=subsets, perturb=zero_at(calls))
    torch.testing.assert_close(hooked, metrics.faithfulness_correlation(net, x, maps, y, subsets=subsets))
    assert calls == [(3, 6)] * 5
    calls.clear()
    _, hooked = metrics.sensitivity_n(net, x, maps, y, subsets=[subsets, subsets[:, :, :2]], perturb=zero_at(calls))
    _, plain = metrics.sensitivity_n(net, x, maps, y, subsets=[subsets, subsets[:, :, :2]])
    torch.testing.assert_close(hooked, plain)
    assert calls == [(3, 6)] * 5 + [(3, 2)] * 5


def test_monotonicity_correlation_calls_the_hook_samples_times_per_group(case):
    net, x, maps, y = case
    calls: list[tuple[int, ...]] = []
    metrics.monotonicity_correlation(net, x, maps, y, features_in_step=8, samples=3, perturb=zero_at(calls))
    assert calls == [(3, 8)] * 12


def test_a_hook_returning_the_wrong_shape_is_refused(case):
    net, x, maps, y = case
    with pytest.raises(ValueError, match="shaped like the inputs"):
        metrics.pixel_flipping(net, x, maps, y, features_in_step=16, perturb=lambda images, indices: images[:, :1])
    with pytest.raises(ValueError, match="patch_size that divides"):
        metrics.selectivity(net, x, maps, y, patch_size=3, perturb=zero_at([]))
