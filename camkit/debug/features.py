"""Intermediate features by layer name, for one batch or a whole DataLoader."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Union

import torch
from torch import Tensor, nn

from .._internal.state import eval_mode
from ..errors import InvalidInputError
from ..hooks import LayerCapture
from ..layers.resolve import resolve_layers

__all__ = ["extract_features", "extract_features_batched"]

Layers = Union[str, nn.Module, Sequence[Union[str, nn.Module]]]


def extract_features(
    model: nn.Module,
    x: Tensor,
    layers: Layers,
    *,
    to_cpu: bool = False,
    call: int = -1,
) -> dict[str, Tensor]:
    """Run ``model(x)`` once and return what the chosen layers output, by name.

    The forward runs under ``torch.no_grad()`` in eval mode (each module's own training
    flag is restored afterwards) and the hooks are removed when it returns. Each output is
    recorded as it left its layer (a later in-place op cannot change it), detached.

    Args:
        model: the model.
        x: its input, e.g. [B, C, H, W].
        layers: dotted names or modules (see :func:`camkit.list_layers`).
        to_cpu: move the features to the CPU (otherwise they stay on ``x``'s device).
        call: for a module that runs several times in one forward, which call (-1: the last).

    Returns:
        ``{dotted name: tensor}`` in the order of ``layers``; each tensor has the layer's output
        shape, e.g. [B, C', H', W'].

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1))
        >>> feats = camkit.extract_features(net, torch.randn(2, 3, 6, 6), ["0", "2"])
        >>> {name: tuple(t.shape) for name, t in feats.items()}
        {'0': (2, 4, 4, 4), '2': (2, 4, 1, 1)}
    """
    if not isinstance(x, Tensor):
        raise InvalidInputError(f"x must be a tensor, got {type(x).__name__}; for a DataLoader use extract_features_batched")
    resolved = resolve_layers(model, layers)
    with eval_mode(model), LayerCapture(resolved, gradients=False, call=call) as capture:
        model(x)
    acts = capture.activations()
    return {name: act.cpu() if to_cpu else act for (name, _), act in zip(resolved, acts)}


def _default_select(batch: Any) -> Tensor:
    if isinstance(batch, Tensor):
        return batch
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], Tensor):
        return batch[0]
    raise InvalidInputError(
        f"cannot find the input in a batch of type {type(batch).__name__}; batches must be a tensor or a "
        "(tensor, ...) tuple/list. Pass select=lambda batch: ... to pick the input."
    )


def extract_features_batched(
    model: nn.Module,
    loader: Iterable[Any],
    layers: Layers,
    *,
    device: torch.device | str | None = None,
    to_cpu: bool = True,
    call: int = -1,
    select: Callable[[Any], Tensor] | None = None,
    limit: int | None = None,
) -> dict[str, Tensor]:
    """:func:`extract_features` over every batch of a loader, concatenated along dim 0.

    Useful for exporting embeddings. Each batch's features are moved to the CPU right after
    that batch (with ``to_cpu=True``, the default), so device memory holds one batch at a time.

    Args:
        model: the model.
        loader: any iterable of batches (a ``DataLoader``): tensors, or tuples/lists whose
            first item is the input.
        layers: dotted names or modules.
        device: where to run each batch (default: the device of the model's first parameter,
            else the batch's own).
        to_cpu: move each batch's features to the CPU.
        call: which call of a module that runs several times (-1: the last).
        select: ``f(batch) -> input tensor`` for other batch layouts (e.g. dicts).
        limit: stop after this many batches.

    Returns:
        ``{dotted name: tensor [N, ...]}`` with N the number of samples seen.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from camkit.debug import extract_features_batched
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(12, 5), nn.ReLU())
        >>> data = TensorDataset(torch.randn(10, 3, 2, 2), torch.arange(10))
        >>> feats = extract_features_batched(net, DataLoader(data, batch_size=4), ["1"])
        >>> tuple(feats["1"].shape)
        (10, 5)
    """
    pick = select or _default_select
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else None
    parts: dict[str, list[Tensor]] = {}
    for index, batch in enumerate(loader):
        if limit is not None and index >= limit:
            break
        x = pick(batch)
        if device is not None:
            x = x.to(device, non_blocking=True)
        for name, feature in extract_features(model, x, layers, to_cpu=to_cpu, call=call).items():
            parts.setdefault(name, []).append(feature)
    if not parts:
        raise InvalidInputError("the loader yielded no batches; nothing to extract")
    return {name: torch.cat(chunks) for name, chunks in parts.items()}
