"""DeepLift's rule for softmax; private to :mod:`camkit.methods.attribution.deeplift`.

Softmax is not elementwise, so the Rescale multiplier ``dy / dz`` of one value does not apply.
The rule keeps what makes Rescale right (Shrikumar et al. 2017): each output's change is
carried exactly by the changes of the inputs (summation-to-delta), and a shift of every input
by the same amount, which leaves softmax unchanged, carries nothing (the paper's remark on
softmax outputs). For an input change ``dz = z - z0`` and output change ``dy = y - y0`` along
the softmax axis, with ``J(p) = diag(p) - p p^T`` (softmax's Jacobian, symmetric, rows summing
to 0) and ``J = (J(y) + J(y0)) / 2`` taken at both ends, output ``t``'s multipliers are

    m_t = J_t * dy_t / (J_t . dz)

so that ``m_t . dz = dy_t`` and ``sum_j m_tj = 0``. Where ``J_t . dz`` is within the rounding
of the inputs, ``m_t = J_t`` (the mean of the gradients at the two ends) if the inputs did not
move, and ``m_t = 0`` if they moved together: a common shift changes no softmax output, and
``dy_t`` is then rounding alone. The backward computes ``sum_t grad_t m_t`` with two products along the axis, never
the Jacobian itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["RescaleSoftmax", "softmax_call"]


def softmax_call(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``{"input", "dim"}`` when ``func`` is a softmax with an explicit axis and no dtype, else None.

    Spellings: ``F.softmax``, ``torch.softmax``, ``Tensor.softmax``, ``torch.special.softmax``
    (``nn.Softmax`` calls ``F.softmax``).
    """
    if getattr(func, "__name__", None) != "softmax" or not args or not isinstance(args[0], Tensor):
        return None
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    cast = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args[2:])
    if not isinstance(dim, int) or isinstance(dim, bool) or cast:
        return None  # the implicit axis or a cast: the call keeps its gradient (and its warning)
    return {"input": args[0], "dim": dim}


def _jacobian_times(p: Tensor, v: Tensor, dim: int) -> Tensor:
    """``J(p) v`` for softmax outputs ``p`` along ``dim`` (``J`` symmetric, so also ``J(p)^T v``)."""
    return p * v - p * (p * v).sum(dim=dim, keepdim=True)


class RescaleSoftmax(torch.autograd.Function):
    """Softmax whose backward applies the rule above against the reference's input ``z0``."""

    @staticmethod
    def forward(ctx: Any, z: Tensor, z0: Tensor, dim: int, eps: float) -> Tensor:
        y = torch.softmax(z, dim=dim)
        y0 = torch.softmax(z0, dim=dim).expand_as(y)
        dz = z - z0
        # J's rows sum to 0, so J dz = J (dz - c) for any c: taken against the largest change, the products
        # below read the inputs' differences from one another, small where the inputs moved nearly together
        spread = dz - dz.amax(dim=dim, keepdim=True)
        moved = (_jacobian_times(y, spread, dim) + _jacobian_times(y0, spread, dim)) / 2
        # the rounding of z and z0 themselves, carried through J_t . dz with every term the same sign
        size = z.abs() + z0.abs()
        bound = sum(p * (size * (1 - 2 * p) + (p * size).sum(dim=dim, keepdim=True)) for p in (y, y0)) / 2
        rounding = 64 * torch.finfo(z.dtype).eps
        clear = moved.abs() > eps + rounding * bound
        still = dz.abs().amax(dim=dim, keepdim=True) <= eps + rounding * size.amax(dim=dim, keepdim=True)
        fallback = torch.where(still, torch.ones_like(moved), torch.zeros_like(moved))
        scale = torch.where(clear, (y - y0) / torch.where(clear, moved, torch.ones_like(moved)), fallback)
        ctx.save_for_backward(y, y0, scale)
        ctx.dim = dim
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        y, y0, scale = ctx.saved_tensors
        v = grad * scale
        out = (_jacobian_times(y, v, ctx.dim) + _jacobian_times(y0, v, ctx.dim)) / 2
        return out - out.mean(dim=ctx.dim, keepdim=True), None, None, None  # a shift of all inputs carries nothing
