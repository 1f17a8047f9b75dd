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
from .localisation import (
    AUC,
    AttributionLocalisation,
    Focus,
    PointingGame,
    RelevanceMassAccuracy,
    RelevanceRankAccuracy,
    TopKIntersection,
)
from .randomisation import MPRT, EfficientMPRT, RandomLogit, SmoothMPRT
from .regions import IROF, ROAD, RegionPerturbation, Selectivity, Sufficiency
from .robustness import (
    AvgSensitivity,
    Consistency,
    Continuity,
    LocalLipschitzEstimate,
    MaxSensitivity,
    RelativeInputStability,
    RelativeOutputStability,
    RelativeRepresentationStability,
)

__all__ = [
    "AUC",
    "IROF",
    "MPRT",
    "ROAD",
    "AttributionLocalisation",
    "AvgSensitivity",
    "Completeness",
    "Complexity",
    "Consistency",
    "Continuity",
    "EffectiveComplexity",
    "EfficientMPRT",
    "FaithfulnessCorrelation",
    "FaithfulnessEstimate",
    "Focus",
    "Infidelity",
    "InputInvariance",
    "LocalLipschitzEstimate",
    "MaxSensitivity",
    "Metric",
    "MetricFailedError",
    "Monotonicity",
    "MonotonicityCorrelation",
    "NonSensitivity",
    "PixelFlipping",
    "PointingGame",
    "RandomLogit",
    "RegionPerturbation",
    "RelativeInputStability",
    "RelativeOutputStability",
    "RelativeRepresentationStability",
    "RelevanceMassAccuracy",
    "RelevanceRankAccuracy",
    "Selectivity",
    "SensitivityN",
    "SmoothMPRT",
    "Sparseness",
    "Sufficiency",
    "TopKIntersection",
    "evaluate",
    "quantus_baseline",
]
