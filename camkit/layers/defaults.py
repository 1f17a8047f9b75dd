"""Which layer a known architecture explains by default, and the wrappers camkit looks through.

* :func:`unwrap_model` strips ``DataParallel`` / ``DistributedDataParallel`` (``.module``)
  and ``torch.compile`` (``._orig_mod``) wrappers. Explainers run the eager module inside:
  hooks added after compiling are not traced by the compiled graph, and a ``DataParallel``
  replica per device would split the batch across separate captures.
* :func:`default_layer` gives the CAM layer for torchvision families, then MONAI's networks,
  then ultralytics' YOLO models (a list of layers: the neck stages their head reads), then
  timm and transformers families (:mod:`camkit.layers.families`; tables in
  ``docs/layers.md``); it takes precedence over the generic rule of
  :func:`camkit.layers.auto_layer` when it gives a spatial map for the input. A model wrapped
  in :class:`camkit.layers.video.ChannelsFirstVideo` gets its inner model's default, named
  ``model.<layer>``.
"""

from __future__ import annotations

import sys

from torch import nn

from .families import family_layer, monai, rules, torchvision, ultralytics
from .video import ChannelsFirstVideo

__all__ = ["default_layer", "default_layer_table", "unwrap_model"]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The eager module inside DataParallel / DistributedDataParallel / ``torch.compile`` wrappers.

    Example:
        >>> from torch import nn
        >>> from camkit.layers.defaults import unwrap_model
        >>> net = nn.Linear(2, 2)
        >>> unwrap_model(nn.DataParallel(net)) is net
        True
    """
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model.get_submodule("_orig_mod")
        else:
            return model


def default_layer_table() -> list[tuple[str, str]]:
    """``(architecture class, default layer)`` rows, as documented in ``docs/layers.md``.

    Torchvision's rows come first, then MONAI's (when MONAI is imported), then the timm /
    transformers families' (model classes and layer patterns, from
    :func:`camkit.layers.families.rules`).

    Example:
        >>> from camkit.layers.defaults import default_layer_table
        >>> dict(default_layer_table())["ResNet"]
        'layer4'
    """
    known = torchvision.table() + (monai.table() if "monai.networks.nets" in sys.modules else [])
    known += ultralytics.table()
    return known + [(", ".join(r.classes), " or ".join(r.patterns)) for r in rules()]  # timm, transformers


def default_layer(model: nn.Module) -> str | list[str] | None:
    """The default CAM layer name for a known architecture, or ``None``.

    Subclasses of a known class get the same default. Wrappers are looked through. Models
    that no torchvision rule knows get MONAI's network default
    (:mod:`camkit.layers.families.monai`), else ultralytics' (a list of names for its
    detectors, segmenters, pose and OBB models: the neck stages their head reads, whose
    maps are fused; :mod:`camkit.layers.families.ultralytics`), else the timm / transformers
    family default of :func:`camkit.layers.families.family_layer`, if one fits.

    Example:
        >>> from torchvision.models import resnet18
        >>> from camkit.layers.defaults import default_layer
        >>> default_layer(resnet18())
        'layer4'
    """
    model = unwrap_model(model)
    if isinstance(model, ChannelsFirstVideo):
        inner = default_layer(model.model)
        if isinstance(inner, list):
            return [f"model.{name}" for name in inner]
        return None if inner is None else f"model.{inner}"
    for library in (torchvision.torchvision_layer, monai.monai_layer):
        known, layer = library(model)
        if known:
            return layer
    several = ultralytics.ultralytics_layers(model)
    if several is not None:
        return several if len(several) > 1 else several[0]
    return family_layer(model)  # timm / transformers families (camkit.layers.families)
