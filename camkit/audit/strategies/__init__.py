"""Strategies per class, found without masks: SpRAy on the maps, the same on concept relevance vectors.

* :mod:`~camkit.audit.strategies.spectral`: one class's features -> a sparse kNN graph -> a
  spectral embedding -> the eigengap's number of clusters -> k-means.
* :mod:`~camkit.audit.strategies.analysis`: every class of both kinds, each strategy described,
  the outliers, the ranking (:func:`find_strategies`, usable on maps and vectors already computed).
* :mod:`~camkit.audit.strategies.store`: what an audit keeps per image for them (downsampled
  maps, concept vectors) beside its parts, and the merge that reads them back.
* :mod:`~camkit.audit.strategies.render`: the report's section per class.
"""

from .analysis import ClassStrategies, Strategies, Strategy, find_strategies, focus
from .spectral import Clustering, spectral_clusters

__all__ = ["ClassStrategies", "Clustering", "Strategies", "Strategy", "find_strategies", "focus", "spectral_clusters"]
