"""Perturbed copies of a batch, shared by the robustness and stability measures.

Private: the maps of the unperturbed inputs, the perturbed inputs (a plan given or uniform
draws), their maps, which copies change the model's prediction, the norm of each copy's change
and the reduction over the copies. Maps may carry a channel axis ([B, K, *S], per-channel
attributions); every measure here compares a map whole (flattened), so the channels count as
positions of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from ..targets.classes import OutputSelector, Target
from ._common import check_chunk_size, check_images, check_maps, check_model
from ._reexplain import explain_stack, model_outputs, top1

__all__ = [
    "Explain",
    "perturbed_inputs",
    "prediction_changed",
    "reduce_copies",
    "reexplained",
    "row_norms",
    "uniform_noise",
    "unperturbed_maps",
]

Explain = Callable[..., Any]


def unperturbed_maps(
    explainer: Explain, model: nn.Module | None, x: Tensor, target: Target, maps: Tensor | None, chunk_size: int,
    output: OutputSelector,
) -> tuple[Target, Tensor]:  # fmt: skip
    """The resolved target and the maps [B, *S] (or [B, K, *S], with a channel axis) of the unperturbed inputs."""
    check_images(x)
    check_chunk_size(chunk_size)
    if model is not None:
        check_model(model)
    if target is None:
        if model is None:
            raise InvalidInputError("target=None explains each input's top-1 class, which needs the model: pass model=")
        target = top1(model, x, chunk_size, output)
    if maps is None:
        return target, explain_stack(explainer, x[None], target, chunk_size, channels=True)[0]
    if isinstance(maps, Tensor) and maps.dim() == x.dim():
        if maps.shape[0] != x.shape[0] or maps.shape[1] < 1 or maps.shape[2:] != x.shape[2:]:
            raise InvalidInputError(
                f"maps with a channel axis must be [B, K, *S] = [{x.shape[0]}, K, {', '.join(map(str, x.shape[2:]))}] "
                f"for inputs {list(x.shape)}, got {list(maps.shape)}"
            )
        check_maps(maps[:, 0], x)
        return target, maps.to(x.device) if maps.is_floating_point() else maps.to(x.device).float()
    return target, check_maps(maps, x)


def reexplained(explainer: Explain, plan: Tensor, target: Target, chunk_size: int, maps: Tensor) -> Tensor:
    """The maps [N, B, ...] of the perturbed inputs ``plan`` [N, B, C, *S], in the layout of ``maps`` [B, ...]."""
    moved = explain_stack(explainer, plan, target, chunk_size, channels=True)
    if moved.shape[2:] != maps.shape[1:]:
        raise InvalidInputError(
            f"the explainer gave maps {list(moved.shape[2:])} per perturbed input where the maps of x are "
            f"{list(maps.shape[1:])}: both need the same layout (the same channel axis, or none)"
        )
    return moved


def perturbed_inputs(x: Tensor, perturbed: Tensor | None, samples: int, draw: Callable[[tuple[int, ...]], Tensor]) -> Tensor:
    """Perturbed inputs [N, B, C, *S]: the plan given, or ``x + draw(shape)``."""
    if perturbed is not None:
        if not isinstance(perturbed, Tensor) or perturbed.dim() != x.dim() + 1 or perturbed.shape[1:] != x.shape:
            got = list(perturbed.shape) if isinstance(perturbed, Tensor) else type(perturbed).__name__
            raise InvalidInputError(
                f"perturbed must be the perturbed inputs [N, *x.shape] = [N, {', '.join(map(str, x.shape))}], got {got}"
            )
        return perturbed.to(device=x.device, dtype=x.dtype)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise InvalidInputError(f"samples must be a positive int, got {samples!r}")
    return x[None] + draw((samples, *x.shape)).to(device=x.device, dtype=x.dtype)


def uniform_noise(low: float, high: float, generator: torch.Generator | None) -> Callable[[tuple[int, ...]], Tensor]:
    """A draw of the given shape, uniform in [low, high), float64, from ``generator``."""
    if not high > low:
        raise InvalidInputError(f"the noise needs low < high, got low={low}, high={high}")
    return lambda shape: torch.rand(shape, generator=generator, dtype=torch.float64) * (high - low) + low


def prediction_changed(model: nn.Module | None, x: Tensor, perturbed: Tensor, chunk_size: int, output: OutputSelector) -> Tensor:
    """Bool [N, B]: does the perturbed input's top-1 class differ from the input's?"""
    if model is None:
        raise InvalidInputError("skipping perturbations that change the prediction needs the model: pass model=")
    before = top1(model, x, chunk_size, output)
    after = model_outputs(model, perturbed.flatten(0, 1), chunk_size, output).argmax(dim=1)
    return after.view(perturbed.shape[:2]) != before


def row_norms(t: Tensor) -> Tensor:
    """Euclidean (Frobenius) norm of each row of [N, B, ...]: [N, B]."""
    return t.flatten(2).double().norm(dim=2)


def reduce_copies(values: Tensor, skip: Tensor | None, how: str) -> Tensor:
    """Reduce [N, B] over N ('mean' or 'max'), leaving out skipped entries; NaN where all are left out."""
    if skip is not None:
        values = torch.where(skip, torch.full_like(values, float("nan")), values)
    if how == "mean":
        out = values.nanmean(dim=0)
    else:
        out = torch.where(torch.isnan(values), torch.full_like(values, -torch.inf), values).amax(dim=0)
        out = torch.where(torch.isnan(values).all(dim=0), torch.full_like(out, float("nan")), out)
    return out.float()
