"""Batch norm for LRP: merged into the layer before it, or passed through; private to :mod:`.lrp`.

A batch norm in eval mode is a per-channel affine map ``y = s * z + t`` with
``s = weight / sqrt(running_var + eps)`` and ``t = bias - running_mean * s``. Where its input is
the output of a convolution or a linear layer, LRP treats the two as the one layer the network
computes, ``W' = s W`` and ``b' = s (b - running_mean) + bias`` (what zennit's canonizers do to the
modules; here the merged parameters are only computed, never written into the model). Where no
such layer precedes it, relevance passes through unchanged (zennit's pass rule).

Also the small autograd pieces the deferred layer rules need: a layer's output is handed to the
model without a graph, and its rule is attached to that very tensor later (:class:`Attach`,
:class:`AttachEpsilon`) once it is known that no batch norm takes it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...functional.propagation import epsilon_scale

__all__ = [
    "Attach",
    "AttachEpsilon",
    "EpsilonBatchNorm",
    "PassBatchNorm",
    "batch_norm_call",
    "batch_norm_value",
    "func_name",
    "is_metadata",
    "merged_params",
]

_BN_ARGS = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
# Calls that only read what a tensor is, not its values: they neither use nor settle a pending output.
_METADATA = frozenset({
    "dim", "size", "shape", "ndim", "dtype", "device", "numel", "nelement", "is_floating_point", "is_complex",
    "requires_grad", "layout", "is_cuda", "is_sparse", "is_contiguous", "stride", "element_size", "__len__",
})  # fmt: skip


def func_name(func: Any) -> str:
    """The name of a function seen by a torch function mode (a property's getter by the property's name)."""
    name = getattr(func, "__name__", "")
    if name == "__get__":
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return str(name)


def is_metadata(func: Any) -> bool:
    """Whether ``func`` only reads a tensor's shape, type or device."""
    return func_name(func) in _METADATA


def batch_norm_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments of an ``F.batch_norm`` call by name."""
    return dict(zip(_BN_ARGS, args), **kwargs)


def _affine(call: dict[str, Any], dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The batch norm's per-channel slope ``s`` and shift ``t`` (running statistics, detached)."""
    mean, var = call["running_mean"].detach().to(dtype), call["running_var"].detach().to(dtype)
    slope = torch.rsqrt(var + float(call.get("eps", 1e-5)))
    weight, bias = call.get("weight"), call.get("bias")
    if weight is not None:
        slope = slope * weight.detach().to(dtype)
    shift = -mean * slope
    if bias is not None:
        shift = shift + bias.detach().to(dtype)
    return slope, shift


def merged_params(weight: Tensor, bias: Tensor | None, call: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """The parameters of a convolution or linear layer with the batch norm after it merged in.

    ``weight`` is [C_out, ...] (output channels first, as for ``F.conv*d`` and ``F.linear``).

    Example:
        >>> import torch
        >>> call = {"running_mean": torch.tensor([1.0]), "running_var": torch.tensor([3.0]),
        ...         "weight": torch.tensor([2.0]), "bias": torch.tensor([0.5]), "eps": 1.0}
        >>> w, b = merged_params(torch.tensor([[1.0, -2.0]]), torch.tensor([3.0]), call)
        >>> w.tolist(), b.tolist()  # s = 2 / sqrt(3 + 1) = 1; b' = (3 - 1) * 1 + 0.5
        ([[1.0, -2.0]], [2.5])
    """
    slope, shift = _affine(call, weight.dtype)
    merged_bias = shift if bias is None else bias.detach() * slope + shift
    return weight.detach() * slope.view(-1, *([1] * (weight.dim() - 1))), merged_bias


def _channels(t: Tensor, dim: int) -> Tensor:
    return t.view(1, -1, *([1] * (dim - 2)))


class EpsilonBatchNorm(torch.autograd.Function):
    """A layer's output ``z`` through the batch norm after it, with the merged layer's epsilon rule.

    The result is the batch norm's output ``y``; a gradient ``g`` arriving at it leaves towards ``z``
    as ``g * y / (y + epsilon * sign(y)) * s``, which ``z``'s own (plain) gradient then carries to the
    layer's input: the epsilon rule of the merged layer, without computing it a second time.
    """

    @staticmethod
    def forward(ctx: Any, z: Tensor, call: dict[str, Any], epsilon: float) -> Tensor:
        slope, shift = _affine(call, z.dtype)
        y = torch.addcmul(_channels(shift, z.dim()), z, _channels(slope, z.dim()))
        ctx.save_for_backward(epsilon_scale(y, epsilon), _channels(slope, z.dim()))
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None]:
        scale, slope = ctx.saved_tensors
        return (grad * scale).mul_(slope), None, None


class PassBatchNorm(torch.autograd.Function):
    """Batch norm with running statistics that passes relevance through unchanged.

    ``R_in = R_out``: in modified-gradient form the gradient leaves as ``g * y / x`` (zero where
    the input ``x`` is zero, where no relevance can be held).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, call: dict[str, Any]) -> Tensor:
        slope, shift = _affine(call, x.dtype)
        y = torch.addcmul(_channels(shift, x.dim()), x, _channels(slope, x.dim()))
        zero = x == 0
        ctx.save_for_backward(torch.where(zero, 0.0, y / torch.where(zero, 1.0, x)))
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None]:
        (ratio,) = ctx.saved_tensors
        return grad * ratio, None


class Attach(torch.autograd.Function):
    """``out`` itself, in place, from now on with ``carrier``'s gradient (``out`` had none).

    ``carrier`` equals ``out`` in value; only its graph is used.
    """

    @staticmethod
    def forward(ctx: Any, out: Tensor, carrier: Tensor) -> Tensor:
        ctx.mark_dirty(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor]:
        return None, grad


class AttachEpsilon(torch.autograd.Function):
    """``out`` itself, in place, from now on with the gradient of ``z`` (same values) times the epsilon rule's factor."""

    @staticmethod
    def forward(ctx: Any, out: Tensor, z: Tensor, epsilon: float) -> Tensor:
        ctx.mark_dirty(out)
        ctx.save_for_backward(z)
        ctx.epsilon = epsilon
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor, None]:
        (z,) = ctx.saved_tensors
        return None, epsilon_scale(z, ctx.epsilon).mul_(grad), None


def batch_norm_value(x: Tensor, call: dict[str, Any]) -> Tensor:
    """The batch norm's output in eval mode, without a graph."""
    with torch.no_grad():
        return F.batch_norm(
            x.detach(), call["running_mean"], call["running_var"], call.get("weight"), call.get("bias"),
            False, 0.0, float(call.get("eps", 1e-5)),
        )  # fmt: skip
