"""Quantus 0.6.0's metric classes on camkit's native metrics: change one import.

``from camkit.compat import quantus`` then ``quantus.PixelFlipping(...)(model=, x_batch=,
y_batch=, a_batch=)`` as with Quantus. Each class takes Quantus's constructor arguments and
call and returns what Quantus returns; the values equal Quantus's where Quantus is right, and
each class's docstring names where it is not (the metrics guide lists them all).
"""

from ._base import Metric, quantus_baseline
from .faithfulness import (
    FaithfulnessCorrelation,
    FaithfulnessEstimate,
    Monotonicity,
    MonotonicityCorrelation,
    PixelFlipping,
)

__all__ = [
    "FaithfulnessCorrelation",
    "FaithfulnessEstimate",
    "Metric",
    "Monotonicity",
    "MonotonicityCorrelation",
    "PixelFlipping",
    "quantus_baseline",
]
