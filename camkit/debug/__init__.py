from .shapes import ShapeRecord, ShapeTable, trace_shapes
from .nonfinite import NonFiniteError, NonFiniteEvent, NonFiniteTracer, find_nonfinite
from .monitor import ActivationMonitor, GradientMonitor, MissingDependencyError
