"""Default layers of ultralytics' YOLO models, recognised by class name without importing ultralytics.

An ultralytics model keeps its layers in ``model.model``, an ``nn.Sequential`` whose modules
say where their inputs come from (``f``: ``-1`` for the module before, or indices). The head
(``Detect``, ``Segment``, ``Pose``, ``OBB``) reads several neck stages, one per scale; the
default layers are those stages, and a CAM explainer fuses their maps (each upsampled to the
input and normalised, then averaged: :func:`camkit.methods._core.output.finish_maps`). The classifier's
``Classify`` head reads one stage: the default is that stage.
"""

from __future__ import annotations

from torch import nn

__all__ = ["FAMILIES", "is_ultralytics", "table", "ultralytics_layers"]

#: Model classes recognised (the class or a base class), with what the default layers are.
FAMILIES: tuple[tuple[str, str], ...] = (
    ("DetectionModel", "model.<i> for each i the Detect head reads (the neck's outputs, one per scale), fused"),
    ("SegmentationModel", "model.<i> for each i the Segment head reads, fused"),
    ("PoseModel", "model.<i> for each i the Pose head reads, fused"),
    ("OBBModel", "model.<i> for each i the OBB head reads, fused"),
    ("ClassificationModel", "model.<i>: the stage the Classify head reads"),
)
_CLASSES = {name for name, _ in FAMILIES}


def is_ultralytics(model: nn.Module) -> str | None:
    """The recognised ultralytics class of ``model`` (or of a base class), else ``None``.

    Example:
        >>> from torch import nn
        >>> from camkit.layers.families.ultralytics import is_ultralytics
        >>> class DetectionModel(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.model = nn.Sequential(nn.Conv2d(3, 4, 3))
        >>> is_ultralytics(DetectionModel()), is_ultralytics(nn.Linear(2, 2))
        ('DetectionModel', None)
    """
    inner = getattr(model, "model", None)
    if not isinstance(inner, nn.Sequential) or not len(inner):
        return None
    for cls in type(model).__mro__:
        if cls.__name__ in _CLASSES:
            return cls.__name__
    return None


def ultralytics_layers(model: nn.Module) -> list[str] | None:
    """The default layers of a recognised ultralytics model: the stages its head reads; else ``None``.

    Example:
        >>> from torch import nn
        >>> from camkit.layers.families.ultralytics import ultralytics_layers
        >>> class Detect(nn.Identity):
        ...     f = [1, 2]
        >>> class DetectionModel(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.ReLU(), Detect())
        >>> ultralytics_layers(DetectionModel())
        ['model.1', 'model.2']
    """
    if is_ultralytics(model) is None:
        return None
    inner = model.get_submodule("model")
    if not isinstance(inner, nn.Sequential):
        return None
    head = inner[-1]
    sources = getattr(head, "f", -1)
    sources = [sources] if isinstance(sources, int) else list(sources)
    count = len(inner)
    indices = [count - 1 + s if s < 0 else s for s in sources if isinstance(s, int)]
    if not indices or not all(0 <= i < count - 1 for i in indices):
        return None
    return [f"model.{i}" for i in indices]


def table() -> list[tuple[str, str]]:
    """``(model class, default layers)`` rows for ``docs/layers.md``.

    Example:
        >>> from camkit.layers.families.ultralytics import table
        >>> table()[-1][0]
        'ClassificationModel'
    """
    return list(FAMILIES)
