"""Re-explaining many inputs in bounded batches, and running the model on them without gradients.

Private: shared by the randomisation and robustness measures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .._internal.state import eval_mode
from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target, select_output
from ._common import MAP_SHAPES, chunks

__all__ = ["explain_maps", "explain_stack", "model_outputs", "slice_target", "top1"]


def slice_target(target: Target, index: Tensor, batch: int) -> Target:
    """The target of the rows ``index`` of a batch of ``batch`` inputs (per-input targets are sliced)."""
    if isinstance(target, Tensor) and target.dim() >= 1 and target.shape[0] == batch:
        return target[index.to(target.device)]
    if isinstance(target, (list, tuple)) and len(target) == batch:
        return torch.as_tensor(target)[index]
    return target


def explain_maps(explainer: Callable[..., Any], x: Tensor, target: Target, *, channels: bool = False) -> Tensor:
    """The maps [B, *S] ``explainer(x, target)`` gives for inputs [B, C, *S] (or its ``.maps``), detached, in float.

    With ``channels``, maps with a channel axis [B, K, *S] are accepted too.
    """
    result = explainer(x, target)
    maps = result.maps if hasattr(result, "maps") else result
    ranks = (x.dim() - 1, x.dim()) if channels else (x.dim() - 1,)
    if (
        not isinstance(maps, Tensor) or maps.dim() not in ranks or maps.shape[0] != x.shape[0]
        or (channels and tuple(maps.shape[maps.dim() - x.dim() + 2 :]) != tuple(x.shape[2:]))
    ):  # fmt: skip
        got = list(maps.shape) if isinstance(maps, Tensor) else type(maps).__name__
        raise InvalidInputError(
            f"the explainer must return maps {MAP_SHAPES[x.dim() - 1]}{' (or with a channel axis)' if channels else ''}"
            f" with B={x.shape[0]} for inputs {list(x.shape)}, got {got}"
        )
    return maps.detach().float()


def explain_stack(
    explainer: Callable[..., Any], inputs: Tensor, target: Target, chunk_size: int, *, channels: bool = False
) -> Tensor:
    """Maps [N, B, *S] of inputs [N, B, C, *S] (N versions of a batch of B), ``chunk_size`` inputs per call.

    Row ``b`` of every version is explained for the target of input ``b``; with ``channels``, maps
    with a channel axis [N, B, K, *S] are accepted too (the same K for all).
    """
    count, batch = inputs.shape[:2]
    flat = inputs.flatten(0, 1)
    owners = torch.arange(batch).repeat(count)
    out = [
        explain_maps(explainer, flat[a:b], slice_target(target, owners[a:b], batch), channels=channels)
        for a, b in chunks(flat.shape[0], chunk_size)
    ]
    return torch.cat(out).view(count, batch, *(out[0].shape[1:] if channels else inputs.shape[3:]))


def model_outputs(model: nn.Module, inputs: Tensor, chunk_size: int, output: OutputSelector = None) -> Tensor:
    """The model's outputs [M, K] for inputs [M, C, *S], in chunks, in eval mode, without gradients."""
    with torch.no_grad(), eval_mode(model):
        return torch.cat([select_output(model(inputs[a:b]), output) for a, b in chunks(inputs.shape[0], chunk_size)])


def top1(model: nn.Module, x: Tensor, chunk_size: int, output: OutputSelector = None) -> Tensor:
    """The model's top-1 classes [B] for inputs [B, C, *S]."""
    return model_outputs(model, x, chunk_size, output).argmax(dim=1)
