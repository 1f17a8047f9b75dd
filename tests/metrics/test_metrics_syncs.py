"""The perturbation metrics score their whole plan without a host sync when the target is a tensor.

As in ``tests/test_syncs.py``: :func:`camkit._internal.syncs.record_syncs` records the aten ops that
would make a CUDA device wait for the host, and ``reads_are_free`` is replaced so that camkit takes
the paths it takes on a GPU. ROAD (a sparse solve per input) and IROF (SLIC segments) compute on
the host by design and are not listed.
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from camkit import metrics
from camkit._internal import syncs as _syncs
from camkit._internal.syncs import record_syncs


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


CALLS = {
    "pixel_flipping": lambda m, x, a, t: metrics.pixel_flipping(m, x, a, t, features_in_step=8),
    "faithfulness_estimate": lambda m, x, a, t: metrics.faithfulness_estimate(m, x, a, t, features_in_step=8),
    "faithfulness_correlation": lambda m, x, a, t: metrics.faithfulness_correlation(
        m, x, a, t, runs=5, subset_size=6, generator=_generator()
    ),
    "monotonicity": lambda m, x, a, t: metrics.monotonicity(m, x, a, t, features_in_step=8),
    "monotonicity_correlation": lambda m, x, a, t: metrics.monotonicity_correlation(
        m, x, a, t, features_in_step=8, generator=_generator()
    ),
    "infidelity": lambda m, x, a, t: metrics.infidelity(m, x, a, t, samples=4, generator=_generator()),
    "sensitivity_n": lambda m, x, a, t: metrics.sensitivity_n(
        m, x, a, t, sizes=[4, 8], samples=4, generator=_generator()
    ),
    "region_perturbation": lambda m, x, a, t: metrics.region_perturbation(m, x, a, t, patch_size=2),
    "selectivity": lambda m, x, a, t: metrics.selectivity(m, x, a, t, patch_size=2),
    "non_sensitivity": lambda m, x, a, t: metrics.non_sensitivity(m, x, a, t, features_in_step=8),
    "completeness": lambda m, x, a, t: metrics.completeness(m, x, a, t),
    "deletion_curve": lambda m, x, a, t: metrics.deletion_curve(m, x, a, t, steps=4),
    "insertion_curve": lambda m, x, a, t: metrics.insertion_curve(m, x, a, t, steps=4),
    "average_drop": lambda m, x, a, t: metrics.average_drop(m, x, a, t),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_metric_makes_no_host_sync(name, monkeypatch):
    monkeypatch.setattr(_syncs, "reads_are_free", lambda tensor: False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 5)).eval()
    x, maps, target = torch.rand(3, 3, 8, 8), torch.rand(3, 8, 8), torch.tensor([0, 1, 2])
    with record_syncs() as syncs:
        CALLS[name](model, x, maps, target)
    assert syncs == [], [str(s) for s in syncs]


def test_sensitivity_n_with_sizes_of_different_widths_equals_subset_by_subset():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 2, 3), nn.Tanh(), nn.Flatten(), nn.Linear(2 * 16, 4)).eval()
    x, maps, target = torch.rand(2, 3, 6, 6), torch.rand(2, 3, 6, 6), torch.tensor([1, 3])
    sizes, got = metrics.sensitivity_n(
        model, x, maps, target, sizes=[5, 20, 1], samples=6, generator=_generator(), chunk_size=7
    )
    g = _generator()  # the draws replayed: keys per sample and size, the n largest
    expected = torch.empty(2, 3, dtype=torch.float64)
    with torch.no_grad():
        for k, n in enumerate([5, 20, 1]):
            for b, keys in enumerate([torch.rand(6, 108, generator=g) for _ in range(2)]):
                drops, sums = [], []
                for subset in keys.topk(n, dim=1).indices:
                    mask = torch.zeros(108, dtype=torch.bool)
                    mask[subset] = True
                    removed = torch.where(mask.view(3, 6, 6), 0.0, x[b])
                    drops.append(float(model(x[b : b + 1])[0, target[b]] - model(removed[None])[0, target[b]]))
                    sums.append(float(maps[b].flatten()[subset].sum()))
                expected[b, k] = torch.corrcoef(torch.tensor([sums, drops], dtype=torch.float64))[0, 1]
    assert sizes.tolist() == [5, 20, 1]
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)


DEVICE_DRAWS = {"faithfulness_correlation", "sensitivity_n"}  # draw on a generator of the input's device


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", sorted(set(CALLS) - {"infidelity", "monotonicity_correlation"}))
def test_cuda_metric_under_sync_debug_error(name, monkeypatch):
    if name in DEVICE_DRAWS:
        monkeypatch.setattr(sys.modules[__name__], "_generator", lambda: torch.Generator("cuda").manual_seed(0))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 5)).cuda().eval()
    x, maps = torch.rand(3, 3, 8, 8, device="cuda"), torch.rand(3, 8, 8, device="cuda")
    target = torch.tensor([0, 1, 2], device="cuda")
    CALLS[name](model, x, maps, target)  # warm-up: allocator, kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = CALLS[name](model, x, maps, target)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    values = out[1] if isinstance(out, tuple) else out
    assert values.device.type == "cuda"
