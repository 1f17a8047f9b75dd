"""Turn a ``layer=`` argument into the model's modules: a name, a module, a list, or ``None`` (automatic)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from ..errors import CamkitWarning, InvalidInputError, LayerNotFoundError
from .auto import all_spatial_here, auto_layer, is_spatial_here
from .defaults import default_layer
from .families import check_frames_order
from .names import LayerSpec, _names, _resolve_one, _strip_wrappers

__all__ = ["resolve_layers"]


def resolve_layers(
    model: nn.Module,
    layer: LayerSpec,
    example: Tensor | None = None,
    *,
    forward: Callable[[Tensor], Any] | None = None,
    score: Callable[[Any], Tensor] | None = None,
    plain_forward: bool = False,
) -> list[tuple[str, nn.Module]]:
    """Turn a layer argument into ``(dotted name, module)`` pairs.

    Names written for a ``DataParallel`` (``module.``) or ``torch.compile`` (``_orig_mod.``)
    wrapper resolve on the bare model and the other way round.

    Args:
        model: the model to explain.
        layer: a dotted name from ``model.named_modules()``, a module, a list of either, or
            ``None``: the architecture's default layer for known torchvision families (see
            :func:`camkit.layers.defaults.default_layer`), else :func:`auto_layer` (which
            needs ``example``).
        example: an input batch, used only when ``layer`` is ``None``.
        forward: how to run the model on ``example`` for the dry run (default ``model(example)``).
        score: what the dry run differentiates (see :func:`qualifying_layers`).
        plain_forward: ``forward`` runs ``model(example)`` and nothing else (no other inputs): the check
            that an architecture's default layer is spatial then runs the first image alone, and its
            decision is kept for later calls on inputs of that shape (:func:`camkit.layers.auto.all_spatial_here`).

    Raises:
        InvalidInputError: for a video model that takes its frames before its channels
            (Hugging Face's VideoMAE, TimeSformer, ViViT) unless it is wrapped in
            :class:`camkit.layers.video.ChannelsFirstVideo`
            (:func:`camkit.layers.families.check_frames_order`).
        LayerNotFoundError: a name that is not the model's, or no layer found automatically.

    Example:
        >>> from torch import nn
        >>> from camkit.layers import resolve_layers
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        >>> resolve_layers(net, "0")[0][0]
        '0'
    """
    check_frames_order(model)
    names = _names(model)
    if layer is None:
        return _automatic(model, names, example, forward, score, plain_forward)
    if isinstance(layer, (str, nn.Module)):
        specs: list[str | nn.Module] = [layer]
    elif isinstance(layer, (list, tuple)):
        specs = list(layer)
    else:
        raise TypeError(
            f"layer must be a dotted name (str), a module of the model, a list of them, or None (automatic), "
            f"got {type(layer).__name__} {layer!r}; see camkit.list_layers(model, x) for the names."
        )
    if not specs:
        raise LayerNotFoundError("layer is an empty list; give at least one layer")
    resolved = [_resolve_one(model, spec, names) for spec in specs]
    seen = set()
    for name, _ in resolved:
        if name in seen:
            raise LayerNotFoundError(f"layer '{name}' is listed twice")
        seen.add(name)
    return resolved


def _automatic(
    model: nn.Module,
    names: dict[str, nn.Module],
    example: Tensor | None,
    forward: Callable[[Tensor], Any] | None,
    score: Callable[[Any], Tensor] | None,
    plain_forward: bool = False,
) -> list[tuple[str, nn.Module]]:
    """``layer=None``: the architecture's default layer(s) when they are spatial here, else :func:`auto_layer`."""
    check = None if plain_forward else forward  # one image through the model, the decision kept
    known = default_layer(model)
    if isinstance(known, list):  # several scales, fused (ultralytics' detection heads)
        several = [_strip_wrappers(name, names) for name in known]
        if all(name is not None for name in several) and (
            example is None or all_spatial_here(model, [(n, names[n]) for n in several if n], example, check)
        ):
            return [(n, names[n]) for n in several if n is not None]
        known = None
    found = None if known is None else _strip_wrappers(known, names)
    if found is not None and (example is None or is_spatial_here(model, found, names[found], example, check)):
        return [(found, names[found])]
    if example is None:
        raise InvalidInputError("layer=None needs an example input to find a layer automatically")
    chosen = auto_layer(model, example, forward=forward, score=score)
    if found is not None:
        warnings.warn(
            f"{type(model).__name__}'s default layer '{found}' gives no spatial map on this "
            f"{'x'.join(map(str, example.shape[2:]))} input (1x1, say); using '{chosen[0]}', the last layer that "
            "does. Pass layer= to choose.",
            CamkitWarning,
            stacklevel=4,  # the caller of the function that called resolve_layers
        )
    return [chosen]
