"""Quantus's function arguments, called as Quantus 0.6.0's metric classes call them, on tensors.

Each helper turns a numpy function a Quantus metric takes (``similarity_func`` with its norms,
``perturb_func``, ``complexity_func``) into the tensor callable the matching
:mod:`camkit.metrics` function takes, passing the function the arrays, shapes and keywords
Quantus passes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .functions.norm_func import fro_norm
from .functions.perturb_func import batched_translation
from .functions.similarity_func import difference, distance_euclidean, lipschitz_constant

__all__ = ["complexity_measure", "lipschitz_measure", "sensitivity_measure", "translations"]

Measure = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def _rows(t: Tensor) -> np.ndarray:
    """A batch as numpy rows [B, F], in its own precision (Quantus's arrays are the maps' float32)."""
    return t.detach().reshape(t.shape[0], -1).cpu().numpy()


def _per_input(value: Any, like: Tensor) -> Tensor:
    """A function's answer as float64 [B] on ``like``'s device (a scalar is broadcast, as numpy assigns it)."""
    array = np.broadcast_to(np.asarray(value, dtype=np.float64), (like.shape[0],))
    return torch.as_tensor(array.copy(), device=like.device)


def sensitivity_measure(similarity_func: Any, norm_numerator: Any, norm_denominator: Any) -> Measure:
    """The sensitivities' change of one perturbation, as Quantus computes it with these functions.

    ``norm_numerator(a=similarity_func(a=rows, b=moved_rows)) / norm_denominator(a=rows)`` on the
    maps flattened to numpy rows [B, F]; ``None`` stands for Quantus's default (``difference``,
    ``fro_norm``, ``fro_norm``).

    Example:
        >>> import torch
        >>> from camkit.compat.quantus.functions.norm_func import linf_norm
        >>> f = sensitivity_measure(None, linf_norm, None)
        >>> f(torch.tensor([[3.0, 4.0]]), torch.tensor([[3.0, 2.0]]), torch.zeros(1, 1, 2), torch.zeros(1, 1, 2))
        tensor([0.4000], dtype=torch.float64)
    """
    similarity = similarity_func or difference
    numerator, denominator = norm_numerator or fro_norm, norm_denominator or fro_norm

    def measure(maps: Tensor, moved: Tensor, x: Tensor, perturbed: Tensor) -> Tensor:
        a, b = _rows(maps), _rows(moved)
        with np.errstate(divide="ignore", invalid="ignore"):
            return _per_input(numerator(a=similarity(a=a, b=b)) / denominator(a=a), maps)

    return measure


def lipschitz_measure(similarity_func: Any, norm_numerator: Any, norm_denominator: Any) -> Measure:
    """The Lipschitz estimate's change of one perturbation, as Quantus computes it with these functions.

    ``similarity_func(a=rows, b=moved_rows, c=x_rows, d=perturbed_rows, norm_numerator=...,
    norm_denominator=...)`` on numpy rows [B, F]; ``None`` stands for Quantus's default
    (``lipschitz_constant``, ``distance_euclidean``, ``distance_euclidean``).

    Example:
        >>> import torch
        >>> f = lipschitz_measure(None, None, None)
        >>> x = torch.zeros(1, 1, 2)
        >>> f(torch.zeros(1, 2), torch.tensor([[3.0, 4.0]]), x, x + 1).round(decimals=4)  # 5 / sqrt(2)
        tensor([3.5355], dtype=torch.float64)
    """
    similarity = similarity_func or lipschitz_constant
    numerator, denominator = norm_numerator or distance_euclidean, norm_denominator or distance_euclidean

    def measure(maps: Tensor, moved: Tensor, x: Tensor, perturbed: Tensor) -> Tensor:
        value = similarity(
            a=_rows(maps), b=_rows(moved), c=_rows(x), d=_rows(perturbed), norm_numerator=numerator,
            norm_denominator=denominator,
        )  # fmt: skip
        return _per_input(value, maps)

    return measure


def translations(
    x: Tensor, steps: int, perturb_func: Any, perturb_baseline: Any, perturb_func_kwargs: dict[str, Any] | None
) -> Tensor:
    """Continuity's perturbed inputs [N, B, C, H, W] from a Quantus translation function.

    Quantus's schedule (``dx = (2 W + 1) // steps``, shifts ``-W + k dx`` for ``k = 1..steps``);
    at each step ``perturb_func(arr=x [B, C, H, W] numpy, perturb_baseline=..., perturb_dx=shift,
    direction="x", **perturb_func_kwargs)`` (``perturb_func_kwargs`` over the others; ``None``
    is Quantus's ``batched_translation``, whose ``"uniform"`` baseline draws one value per input
    at each step from numpy's global generator).
    """
    func = functools.partial(
        perturb_func or batched_translation,
        **{"perturb_baseline": perturb_baseline, "direction": "x", **(perturb_func_kwargs or {})},
    )
    arr = x.detach().cpu().numpy()
    width = arr.shape[3]
    dx = (2 * width + 1) // steps
    moved = [np.asarray(func(arr=arr.copy(), perturb_dx=-width + dx * k)) for k in range(1, steps + 1)]
    return torch.stack([torch.as_tensor(m, device=x.device).to(x.dtype).reshape(x.shape) for m in moved])


def complexity_measure(complexity_func: Any, kwargs: dict[str, Any]) -> Callable[[Tensor, Tensor], Tensor]:
    """``f(maps [B, K, *S], x [B, C, *S]) -> [B]``: ``complexity_func(a=map [K, *S], x=input [C, *S], **kwargs)``
    per map, numpy arrays, as Quantus's complexity metrics call it.

    Example:
        >>> import numpy as np, torch
        >>> f = complexity_measure(lambda a, x, **kw: float(np.abs(a).sum() / x.size * kw["scale"]), {"scale": 2})
        >>> f(torch.ones(2, 1, 2, 2), torch.ones(2, 1, 2, 2))
        tensor([2., 2.], dtype=torch.float64)
    """

    def measure(maps: Tensor, x: Tensor) -> Tensor:
        inputs = x.detach().cpu().numpy()
        values = [complexity_func(a=m, x=inputs[i], **kwargs) for i, m in enumerate(maps.detach().cpu().numpy())]
        return torch.as_tensor(np.asarray(values, dtype=np.float64).reshape(maps.shape[0]), device=maps.device)

    return measure
