"""The few helpers of captum's private modules that its tests call to build inputs and reference values.

Input formatting (tuples, zero baselines, a forward that returns a future) and ``compute_gradients``
(plain autograd: the gradient of the target outputs with respect to the inputs), written here so that
no captum code runs after ``install()``. None of them is an attribution.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._pack import as_tuple, flat_targets, forward_args

__all__ = [
    "_construct_future_forward",
    "_format_additional_forward_args",
    "_format_tensor_into_tuples",
    "_tensorize_baseline",
    "_zeros",
    "compute_gradients",
]


def _zeros(inputs: tuple[Tensor, ...]) -> tuple[Any, ...]:
    """A zero baseline per input (``False`` for a boolean input)."""
    return tuple(False if x.dtype == torch.bool else 0 for x in inputs)


def _format_tensor_into_tuples(inputs: Any) -> Any:
    """``None`` as it is, a tensor as a 1-tuple, a tuple as it is."""
    return None if inputs is None else as_tuple(inputs)


def _format_additional_forward_args(additional: Any) -> Any:
    """``None`` as it is, anything else as a tuple."""
    return None if additional is None else forward_args(additional)


def _tensorize_baseline(inputs: tuple[Tensor, ...], baselines: tuple[Any, ...]) -> tuple[Tensor, ...]:
    """Number baselines as full tensors like the inputs; one-row tensor baselines repeated to the batch."""
    out = []
    for base, x in zip(baselines, inputs):
        if isinstance(base, (int, float)):
            out.append(torch.full_like(x, base))
        elif x.shape[0] > base.shape[0] == 1:
            out.append(base.expand(x.shape[0], *base.shape[1:]).clone())
        else:
            out.append(base)
    return tuple(out)


def _construct_future_forward(forward: Any) -> Any:
    """``forward`` returning a completed ``torch.futures.Future`` of its output."""

    def future_forward(*args: Any, **kwargs: Any) -> Any:
        done: torch.futures.Future[Any] = torch.futures.Future()
        done.set_result(forward(*args, **kwargs))
        return done

    return future_forward


def compute_gradients(forward_fn: Any, inputs: Any, target_ind: Any = None,
                      additional_forward_args: Any = None) -> tuple[Tensor, ...]:
    """Gradients of the target outputs (summed over the batch) with respect to each input.

    Example:
        >>> import torch
        >>> from camkit.compat.captum._support import compute_gradients
        >>> x = torch.tensor([[1.0, 2.0]], requires_grad=True)
        >>> compute_gradients(lambda t: (t * t).sum(dim=1), (x,))[0].tolist()
        [[2.0, 4.0]]
    """
    xs = as_tuple(inputs)
    with torch.enable_grad():
        out = forward_fn(*xs, *forward_args(additional_forward_args))
        rows = out.reshape(out.shape[0], -1) if out.dim() else out.reshape(1, 1)
        shape = tuple(out.shape[1:]) if target_ind is None or isinstance(target_ind, tuple) else (1 << 62,)
        index = flat_targets(target_ind, shape, rows.shape[0]).to(rows.device)
        chosen = rows.gather(1, index[:, None])
        return torch.autograd.grad(chosen.sum(), xs, allow_unused=True)
