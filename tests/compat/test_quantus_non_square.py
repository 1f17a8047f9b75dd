"""Every metric class of camkit.compat.quantus against Quantus 0.6.0 on images that are not square (6 x 8).

Each class runs once on Quantus and once on camkit's translation, after the same ``np.random.seed``,
on the same maps; the classes whose value differs from Quantus's on purpose are compared on what
they share, and the test of each difference is named (docs/guide/metrics.md lists them).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from camkit.compat import quantus as cq
from camkit.compat.quantus._install import FAMILIES

quantus = pytest.importorskip("quantus")

H, W = 6, 8


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * H * W, 3)).eval()


def explain(model, inputs, targets, **kwargs):
    x = torch.as_tensor(inputs).clone().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(model(x).gather(1, torch.as_tensor(targets).long()[:, None]).sum(), x)
    return (grad * x).sum(1, keepdim=True).detach().numpy()


def batch() -> dict:
    rs = np.random.RandomState(0)
    x = rs.rand(4, 1, H, W).astype(np.float32)
    y = np.array([0, 2, 1, 0])
    s = np.zeros((4, 1, H, W), dtype=np.float32)
    s[:, :, 1:4, 2:7] = 1.0
    return {"x_batch": x, "y_batch": y, "a_batch": explain(net(), x, y), "s_batch": s}


#: class -> constructor arguments (small, fast); every class of FAMILIES has an entry
CASES: dict[str, dict] = {
    "Completeness": {}, "InputInvariance": {}, "NonSensitivity": {"normalise": False, "eps": 0.05},
    "Complexity": {}, "EffectiveComplexity": {"eps": 1e-3}, "Sparseness": {},
    "FaithfulnessCorrelation": {"nr_runs": 5, "subset_size": 6, "return_aggregate": False},
    "FaithfulnessEstimate": {"features_in_step": 8}, "Infidelity": {"normalise": False, "n_perturb_samples": 2, "perturb_patch_sizes": [2]},
    "IROF": {}, "Monotonicity": {"features_in_step": 8},
    "MonotonicityCorrelation": {"nr_samples": 2, "features_in_step": 8},
    "PixelFlipping": {"features_in_step": 8}, "RegionPerturbation": {"patch_size": 2, "regions_evaluation": 4},
    "ROAD": {"percentages": [10, 50]}, "Selectivity": {"patch_size": 2},
    "SensitivityN": {"features_in_step": 8, "n_max_percentage": 0.5}, "Sufficiency": {"threshold": 0.6},
    "AttributionLocalisation": {}, "AUC": {}, "Focus": {}, "PointingGame": {}, "RelevanceMassAccuracy": {},
    "RelevanceRankAccuracy": {}, "TopKIntersection": {"k": 10},
    "EfficientMPRT": {}, "MPRT": {"layer_order": "independent"}, "RandomLogit": {"normalise": False, "num_classes": 3, "similarity_func": quantus.similarity_func.ssim},
    "SmoothMPRT": {"nr_samples": 2},
    "AvgSensitivity": {"nr_samples": 2}, "Consistency": {}, "Continuity": {"normalise": False, "nr_steps": 4},
    "LocalLipschitzEstimate": {"normalise": False, "nr_samples": 2}, "MaxSensitivity": {"nr_samples": 2},
    "RelativeInputStability": {"nr_samples": 2}, "RelativeOutputStability": {"nr_samples": 2},
    "RelativeRepresentationStability": {"nr_samples": 2},
}  # fmt: skip

#: classes whose values differ from Quantus's on purpose: the test that shows each difference
DIFFERENT = {
    "Monotonicity": "test_quantus_faithfulness.py::test_quantus_monotonicity_always_true_camkit_restores_features",
    "SensitivityN": "test_quantus_axiomatic_complexity.py::test_sensitivity_n_per_sample_against_quantus_across_samples",
    "IROF": "test_quantus_regions.py::test_irof_is_the_papers_area_with_slic_segments",
    "ROAD": "test_quantus_regions.py::test_quantus_road_scores_only_the_first_batch_and_fails_on_rgb",
    "Infidelity": "test_quantus_axiomatic_complexity.py::test_quantus_infidelity_repeats_are_identical",
    "SmoothMPRT": "test_quantus_localisation_randomisation.py::test_smooth_mprt_with_one_sample_equals_quantus_and_quantus_ignores_explain_func",
    "Focus": "Focus takes mosaics (test_quantus_localisation_randomisation.py), not single images",
}


def test_every_metric_class_has_a_case() -> None:
    assert sorted(CASES) == sorted(name for names in FAMILIES.values() for name in names)


def run(lib, name: str) -> np.ndarray:
    data = batch()
    np.random.seed(7)
    torch.manual_seed(7)
    extra = {"disable_warnings": True} if lib is quantus else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = getattr(lib, name)(**CASES[name], **extra)
        out = metric(model=net(), **data, explain_func=explain, device="cpu")
    if isinstance(out, dict):  # MPRT, SmoothMPRT: {layer: scores}
        out = [out[key] for key in sorted(out)]
    return np.asarray(out, dtype=np.float64)


@pytest.mark.parametrize("name", sorted(set(CASES) - set(DIFFERENT)))
def test_equals_quantus_on_non_square_images(name: str) -> None:
    theirs, ours = run(quantus, name), run(cq, name)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=1e-6, equal_nan=True)
