"""Which explanation method can I trust on this model and data: ``camkit evaluate``.

:func:`evaluate` runs every method on every image once, scores every map with the metrics of
:data:`METRICS` (one row each in :mod:`camkit.evaluation.table`) beside three controls that need no
model, runs the sanity gates, and writes ``scores.csv``, ``summary.json`` and ``report.html``
with the statistics of :mod:`camkit.evaluation.stats` and the verdict of
:mod:`camkit.evaluation.analysis`.
"""

from .run import DEFAULT_METHODS, evaluate
from .table import METRICS, MetricInput, MetricSpec, register_metric

__all__ = ["DEFAULT_METHODS", "METRICS", "MetricInput", "MetricSpec", "evaluate", "register_metric"]
