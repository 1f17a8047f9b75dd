"""Quantus 0.6.0's metric classes on camkit's native metrics: change one import.

``from camkit.compat import quantus`` then ``quantus.PixelFlipping(...)(model=, x_batch=,
y_batch=, a_batch=)`` as with Quantus. Each class takes Quantus's constructor arguments and
call and returns what Quantus returns; the values equal Quantus's where Quantus is right, and
each class's docstring names where it is not (the metrics guide lists them all).
"""

from ._base import Metric, quantus_baseline
from ._evaluate import MetricFailedError, evaluate
from .axiomatic import Completeness, InputInvariance, NonSensitivity
from .complexity import Complexity, EffectiveComplexity, Sparseness
from .faithfulness import (
    FaithfulnessCorrelation,
    FaithfulnessEstimate,
    Infidelity,
    Monotonicity,
    MonotonicityCorrelation,
    PixelFlipping,
    SensitivityN,
)
from .regions import IROF, ROAD, RegionPerturbation, Selectivity, Sufficiency

__all__ = [
    "IROF",
    "ROAD",
    "Completeness",
    "Complexity",
    "EffectiveComplexity",
    "FaithfulnessCorrelation",
    "FaithfulnessEstimate",
    "Infidelity",
    "InputInvariance",
    "Metric",
    "MetricFailedError",
    "Monotonicity",
    "MonotonicityCorrelation",
    "NonSensitivity",
    "PixelFlipping",
    "RegionPerturbation",
    "Selectivity",
    "SensitivityN",
    "Sparseness",
    "Sufficiency",
    "evaluate",
    "quantus_baseline",
]
