"""``ablation_cam_multilayer``: the original's second Ablation-CAM module, on this package's :class:`AblationCAM`.

pytorch-grad-cam 1.5.7 ships this module beside ``ablation_cam`` without importing it: its
``AblationCAM`` swaps every target layer for an ``AblationLayer`` and ablates channel ``k`` of
all of them in the same forward pass. Here the names resolve to the maintained translation:
each target layer's channels are ablated on their own (as the original's main ``AblationCAM``
does with several layers), by camkit's hook, without replacing modules. The original's class
cannot run in 1.5.7: its ``get_cam_weights`` still has the signature of an older ``BaseCAM``,
so every call raises ``TypeError`` (and ``AblationLayer.forward`` returns ``None``).
"""

from __future__ import annotations

from ._cams import AblationCAM
from .ablation_layer import AblationLayer
from .utils.find_layers import replace_layer_recursive

__all__ = ["AblationCAM", "AblationLayer", "replace_layer_recursive"]
