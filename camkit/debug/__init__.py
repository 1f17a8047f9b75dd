"""Hook-based model debugging, on camkit's scoped hook layer.

* :func:`trace_shapes`: every module call with shapes, dtypes and parameter counts.
* :class:`NonFiniteTracer`, :func:`find_nonfinite`: the first NaN/Inf in the forward or backward.
* :class:`ActivationMonitor`, :class:`GradientMonitor`: statistics over training steps,
  sampled every k steps; CSV, TensorBoard and PNG export.
* :func:`extract_features` (also ``camkit.extract_features``), :func:`extract_features_batched`.
* :class:`GradientEditor`: clip, scale or zero gradients of parameters or activations.
* :func:`feature_grid`: a layer's channels as one image.
* :func:`inspect`: the common hook traps (in-place ops, reused modules, functional
  activations, training mode).

Every tool removes its hooks when it ends, also after an exception.
"""

from .features import extract_features, extract_features_batched
from .gradedit import GradientEditor
from .grid import FeatureGrid, feature_grid, tile_maps
from .monitor import ActivationMonitor, GradientMonitor, MissingDependencyError
from .nonfinite import NonFiniteError, NonFiniteEvent, NonFiniteTracer, find_nonfinite
from .shapes import ShapeRecord, ShapeTable, trace_shapes
from .stats import activation_stats
from .traps import Finding, InspectWarning, inspect

__all__ = [
    "ActivationMonitor",
    "FeatureGrid",
    "Finding",
    "GradientEditor",
    "GradientMonitor",
    "InspectWarning",
    "MissingDependencyError",
    "NonFiniteError",
    "NonFiniteEvent",
    "NonFiniteTracer",
    "ShapeRecord",
    "ShapeTable",
    "activation_stats",
    "extract_features",
    "extract_features_batched",
    "feature_grid",
    "find_nonfinite",
    "inspect",
    "tile_maps",
    "trace_shapes",
]
