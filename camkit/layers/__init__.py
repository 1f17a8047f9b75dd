"""Which layer, and how its output lies on the input.

* :mod:`camkit.layers.names`: the model's layers by name (:func:`list_layers`);
* :mod:`camkit.layers.resolve`: a ``layer=`` argument to modules (:func:`resolve_layers`);
* :mod:`camkit.layers.auto`: the automatic rule (:func:`auto_layer`, :func:`qualifying_layers`);
* :mod:`camkit.layers.defaults`: per-architecture defaults (:func:`default_layer`) and the
  wrappers looked through (:func:`unwrap_model`), from the family rules in
  :mod:`camkit.layers.families` (torchvision, MONAI, timm, transformers: a module each);
* :mod:`camkit.layers.layout`: how an output lies on the input grid: channel-first or
  channel-last maps, tokens and their prefix (:func:`grid_shape`, :func:`layer_grid`), and
  the grid and token order a model's configuration fixes (:class:`TokenLayout`,
  :mod:`camkit.layers.token_layout`);
* :mod:`camkit.layers.video`: :class:`ChannelsFirstVideo`, for video models that take their
  frames before their channels (Hugging Face's ``pixel_values`` ``[B, T, C, H, W]``).
"""

from .auto import auto_layer, default_score, qualifying_layers
from .defaults import default_layer, default_layer_table, unwrap_model
from .families import check_frames_order
from .layout import TokenLayout, grid_shape, known_channels_last, layer_grid, prefix_token_hint, token_prefix
from .names import LayerInfo, LayerSpec, list_layers
from .resolve import resolve_layers
from .video import ChannelsFirstVideo

__all__ = [
    "ChannelsFirstVideo",
    "LayerInfo",
    "LayerSpec",
    "TokenLayout",
    "auto_layer",
    "check_frames_order",
    "default_layer",
    "default_layer_table",
    "default_score",
    "grid_shape",
    "known_channels_last",
    "layer_grid",
    "list_layers",
    "prefix_token_hint",
    "qualifying_layers",
    "resolve_layers",
    "token_prefix",
    "unwrap_model",
]
