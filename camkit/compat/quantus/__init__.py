"""Quantus 0.6.0's metric classes on camkit's native metrics: change one import.

``from camkit.compat import quantus`` then ``quantus.PixelFlipping(...)(model=, x_batch=,
y_batch=, a_batch=)`` as with Quantus. Each class takes Quantus's constructor arguments and
call and returns what Quantus returns; the values equal Quantus's where Quantus is right, and
each class's docstring names where it is not (docs/migration/quantus.md lists them all).

A script written for Quantus switches with one line run before it imports Quantus::

    import camkit.compat.quantus as cq; cq.install()

after which ``import quantus``, ``quantus.similarity_func.correlation_spearman`` and ``from
quantus.metrics.faithfulness import PixelFlipping`` load this package (see :func:`install`).
"""

import importlib
from typing import Any

from ._base import Metric, quantus_baseline
from ._evaluate import MetricFailedError, evaluate
from ._install import AlreadyImportedError, NotTranslatedError, install, installed, uninstall
from .axiomatic import Completeness, InputInvariance, NonSensitivity
from .complexity import Complexity, EffectiveComplexity, Sparseness
from .efficient_mprt import EfficientMPRT
from .faithfulness import (
    FaithfulnessCorrelation,
    FaithfulnessEstimate,
    Monotonicity,
    MonotonicityCorrelation,
    PixelFlipping,
)
from .infidelity import Infidelity, SensitivityN
from .localisation import (
    AUC,
    AttributionLocalisation,
    Focus,
    PointingGame,
    RelevanceMassAccuracy,
    RelevanceRankAccuracy,
    TopKIntersection,
)
from .randomisation import MPRT, RandomLogit, SmoothMPRT
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
    "AlreadyImportedError",
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
    "NotTranslatedError",
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
    "complexity_func",
    "discretise_func",
    "evaluate",
    "explain",
    "functions",
    "install",
    "installed",
    "loss_func",
    "mosaic_func",
    "n_bins_func",
    "norm_func",
    "normalise_func",
    "perturb_func",
    "quantus_baseline",
    "similarity_func",
    "uninstall",
]

__version__ = "0.6.0"

#: Quantus's function modules, read as ``quantus.similarity_func`` and so on
_FUNCTION_MODULES = (
    "complexity_func", "discretise_func", "loss_func", "mosaic_func", "n_bins_func", "norm_func", "normalise_func",
    "perturb_func", "similarity_func",
)  # fmt: skip


def __getattr__(name: str) -> Any:
    if name == "explain":
        from .functions.explanation_func import explain

        return explain
    if name == "functions" or name in _FUNCTION_MODULES:
        module = importlib.import_module(f"{__name__}.functions" + ("" if name == "functions" else f".{name}"))
        globals()[name] = module
        return module
    raise AttributeError(
        f"camkit.compat.quantus has no {name!r}: it translates Quantus's metric classes, evaluate and the "
        f"modules {', '.join(_FUNCTION_MODULES)}; for anything else (the perturbation "
        "functions, the model wrappers) use the original Quantus without install()"
    )
