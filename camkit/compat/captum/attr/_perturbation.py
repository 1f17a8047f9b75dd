"""captum's perturbation attributions: the classes of :mod:`._ablation`, :mod:`._permutation`, :mod:`._shapley` and :mod:`._lime` in one place.

Each follows captum's contract for perturbation methods (:mod:`._engine`): feature masks of any
shape shared across inputs, baselines per input, ``perturbations_per_eval`` perturbed copies per
forward call, and forward functions that return one value per example or a fixed-size output
for the whole batch.
"""

from __future__ import annotations

from ._ablation import FeatureAblation, Occlusion
from ._lime import KernelShap, Lime, LimeBase
from ._permutation import FeaturePermutation, LayerFeaturePermutation
from ._shapley import ShapleyValues, ShapleyValueSampling

__all__ = [
    "FeatureAblation",
    "FeaturePermutation",
    "KernelShap",
    "LayerFeaturePermutation",
    "Lime",
    "LimeBase",
    "Occlusion",
    "ShapleyValueSampling",
    "ShapleyValues",
]
