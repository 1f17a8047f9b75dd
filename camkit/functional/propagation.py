"""Pure math of the propagation rules: DeepLift's Rescale multiplier and LRP's layer rules.

No hooks, no state, no model. The LRP functions are written in *modified gradient* form:
camkit keeps, for every tensor ``a`` of the forward pass, a modified gradient ``g`` such
that ``a * g`` is the relevance of ``a``. A layer rule then only has to change how ``g``
passes the layer, which :func:`relevance_gradient` does for any rule whose relevance reads
``R_in = a * d(z_rule)/da . (R_out / stabilize(z_rule))``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = [
    "epsilon_scale",
    "gamma_params",
    "relevance_gradient",
    "rescale_multiplier",
    "split_by_sign",
    "stabilize",
]


def rescale_multiplier(delta_in: Tensor, delta_out: Tensor, slope: Tensor, eps: float = 1e-10) -> Tensor:
    """DeepLift's Rescale multiplier (Shrikumar et al. 2017) of an elementwise non-linearity.

    ``m = delta_out / delta_in`` where ``|delta_in| >= eps``, the local ``slope`` (the
    derivative at the input) where the input barely moved from its reference.

    Args:
        delta_in: ``x - x0``, the input's change from its reference.
        delta_out: ``f(x) - f(x0)``.
        slope: ``f'(x)``, used where ``|delta_in| < eps``.
        eps: the smallest input change divided by.

    Example:
        >>> import torch
        >>> from camkit.functional import rescale_multiplier
        >>> x, x0 = torch.tensor([2.0, -1.0, 3.0, 1.0]), torch.tensor([-2.0, -3.0, 1.0, 1.0])
        >>> rescale_multiplier(x - x0, x.relu() - x0.relu(), (x > 0).float())
        tensor([0.5000, 0.0000, 1.0000, 1.0000])
    """
    # Where the input barely moved the quotient may be inf or nan; ``where`` discards it there.
    return torch.where(delta_in.abs() < eps, slope, delta_out / delta_in)


def stabilize(z: Tensor, epsilon: float) -> Tensor:
    """``z + epsilon * sign(z)``, with ``sign(0) = 1``: the LRP denominator kept away from zero.

    Example:
        >>> import torch
        >>> from camkit.functional import stabilize
        >>> stabilize(torch.tensor([2.0, -2.0, 0.0]), 0.5)
        tensor([ 2.5000, -2.5000,  0.5000])
    """
    return z + torch.where(z >= 0, epsilon, -epsilon)


def relevance_gradient(z: Tensor, parts: list[tuple[float, Tensor]], epsilon: float) -> Tensor:
    """A tensor equal to ``z`` in value whose gradient follows an LRP rule.

    ``z`` is a layer's true output; each ``(weight, z_rule)`` in ``parts`` is the output of
    the same layer recomputed with the rule's parameters (and inputs), still attached to the
    graph. The result is ``z`` in value, and a gradient ``g_out`` arriving at it leaves as
    ``sum_k weight_k * d(z_rule_k)/d(inputs) . (g_out * z / stabilize(z_rule_k, epsilon))``.
    With ``R_out = z * g_out`` that is each rule's normalised redistribution of ``R_out``
    (e.g. the epsilon rule: one part ``(1, z)``; alpha-beta: ``(alpha, z_pos), (-beta, z_neg)``).
    Where a denominator is exactly zero (``epsilon = 0``) nothing passes.

    Example:
        >>> import torch
        >>> from camkit.functional import relevance_gradient
        >>> a = torch.tensor([1.0, 3.0], requires_grad=True)
        >>> z = (a * torch.tensor([2.0, -1.0])).sum() + 0.5  # z = -0.5: a linear unit with bias
        >>> out = relevance_gradient(z, [(1.0, z)], epsilon=0.0)  # the epsilon rule, eps = 0
        >>> (g,) = torch.autograd.grad(out, a)
        >>> out.item(), (a * g).tolist()  # relevances of a: a_i w_i / z * R_out with R_out = z
        (-0.5, [2.0, -3.0])
    """
    value = z.detach()
    if len(parts) == 1 and parts[0][1] is z and parts[0][0] == 1.0:
        return _EpsilonGradient.apply(z, epsilon)  # the epsilon rule
    rule: Tensor | None = None
    for weight, part in parts:
        denominator = stabilize(part.detach(), epsilon)
        if epsilon > 0:  # |denominator| >= epsilon everywhere
            scale = value / denominator
        else:  # a zero denominator: nothing to share there
            zero = denominator == 0
            scale = torch.where(zero, 0.0, value / torch.where(zero, 1.0, denominator))
        term = part * (scale * weight if weight != 1.0 else scale)
        rule = term if rule is None else rule + term
    if rule is None:
        return z
    return rule + (value - rule.detach())


def epsilon_scale(z: Tensor, epsilon: float) -> Tensor:
    """The epsilon rule's gradient factor ``z / stabilize(z, epsilon)`` at a layer's output ``z``.

    ``stabilize`` takes ``sign(0) = 1``; here ``-0.0`` gets ``-epsilon``, which changes nothing
    since the factor is 0 there either way. With ``epsilon = 0`` it is 1 where ``z != 0`` and 0
    where nothing can be shared. A gradient ``g`` at the layer's output becomes ``g * scale``.

    Example:
        >>> import torch
        >>> from camkit.functional import epsilon_scale
        >>> epsilon_scale(torch.tensor([3.0, -1.0, 0.0]), 1.0)
        tensor([0.7500, 0.5000, 0.0000])
        >>> epsilon_scale(torch.tensor([3.0, -1.0, 0.0]), 0.0)
        tensor([1., 1., 0.])
    """
    if epsilon == 0:
        return (z != 0).to(z.dtype)
    # One new buffer, filled in place: on the CPU a fresh large tensor costs page faults, not just a pass.
    denominator = torch.full_like(z, epsilon).copysign_(z).add_(z)  # -0.0 gets -epsilon: the scale is 0 either way
    return torch.div(z, denominator, out=denominator)


class _EpsilonGradient(torch.autograd.Function):
    """``z`` in value; the gradient times :func:`epsilon_scale` of ``z``, computed in the backward.

    The factor and the product share one buffer, built when the gradient arrives: the node
    keeps ``z`` itself (which only it reads: the model gets the copy) instead of a factor.
    """

    @staticmethod
    def forward(ctx: Any, z: Tensor, epsilon: float) -> Tensor:
        ctx.save_for_backward(z)
        ctx.epsilon = epsilon
        return z.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (z,) = ctx.saved_tensors
        return epsilon_scale(z, ctx.epsilon).mul_(grad), None


def gamma_params(weight: Tensor, bias: Tensor | None, gamma: float) -> tuple[Tensor, Tensor | None]:
    """The gamma rule's parameters ``w + gamma * max(w, 0)`` (the bias likewise).

    Example:
        >>> import torch
        >>> from camkit.functional import gamma_params
        >>> gamma_params(torch.tensor([1.0, -2.0]), torch.tensor([-1.0]), 0.5)
        (tensor([ 1.5000, -2.0000]), tensor([-1.]))
    """
    return weight + gamma * weight.clamp_min(0), None if bias is None else bias + gamma * bias.clamp_min(0)


def split_by_sign(t: Tensor) -> tuple[Tensor, Tensor]:
    """``(max(t, 0), min(t, 0))``.

    Example:
        >>> import torch
        >>> from camkit.functional import split_by_sign
        >>> split_by_sign(torch.tensor([1.0, -2.0]))
        (tensor([1., 0.]), tensor([ 0., -2.]))
    """
    return t.clamp_min(0), t.clamp_max(0)
