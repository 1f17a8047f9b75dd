"""AttnLRP's rules as autograd nodes: each op keeps its value, its backward carries the rule.

camkit keeps, for every tensor ``a`` of the forward pass, a modified gradient ``g`` whose
product ``a * g`` is the relevance of ``a`` (the gradient x input form of LRP). A rule then
only changes how ``g`` crosses one op:

* :func:`uniform`: the uniform rule of a product of ``n`` factors that all depend on the input
  (the attention products ``q k^T`` and ``A v``, a gate times its branch): each factor's gradient
  divided by ``n``, so each gets ``1/n`` of the product's relevance and the total is conserved.
* :func:`identity_rule`: an elementwise non-linearity ``y = f(x)`` passes its relevance as a
  linear map would (``R_x = R_y``): the gradient times ``f(x) / x``.
* :func:`layer_norm_identity` and :func:`rms_norm_identity`: a normalisation with its
  normalising factor (the standard deviation, the root mean square) held constant: the map is
  then linear in ``x`` (centred and scaled) and conserves relevance up to its shift.
* :func:`generalized_gamma`: the generalised gamma rule of a linear layer or convolution (for
  inputs of either sign): on an output ``z_j > 0`` the contributions of the positive inputs
  through ``w + gamma * w+`` and of the negative ones through ``w + gamma * w-`` (the bias as
  ``b + gamma * b+``); on ``z_j < 0`` the mirror image. It equals the gamma rule on
  non-negative inputs, and the epsilon rule at ``gamma = 0``.

The softmax needs no node: its own gradient times its input is AttnLRP's softmax rule
``R_x = x * (R_s - s * sum(R_s))``, relevance in the amount ``sum(x * s) * sum(R_s)`` staying
with the softmax's bias term.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_leaves

from ...functional.propagation import stabilize

__all__ = [
    "InputTags",
    "gamma_linear",
    "generalized_gamma",
    "identity_rule",
    "layer_norm_identity",
    "rms_norm_identity",
    "traced",
    "uniform",
]


def traced(t: Any) -> bool:
    """Whether ``t`` is a tensor on the graph (not a leaf): the default test of :func:`uniform`."""
    return isinstance(t, Tensor) and t.requires_grad and t.grad_fn is not None


class InputTags:
    """Which tensors of one forward were computed from the explained input, held weakly by identity.

    A tensor computed from parameters alone (a class token repeated over the batch, a learned query)
    is on the graph too, but a product with it is a linear map of the input, not a product of two
    input-dependent factors: the rules ask :meth:`depends`, not whether a tensor requires a gradient.
    """

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Tensor]] = {}

    def add(self, t: Tensor) -> None:
        key, refs = id(t), self._refs

        def forget(_: object) -> None:  # the tensor is gone: its id may be reused
            refs.pop(key, None)

        refs[key] = weakref.ref(t, forget)

    def tagged(self, t: Any) -> bool:
        if not isinstance(t, Tensor):
            return False
        ref = self._refs.get(id(t))
        return ref is not None and ref() is t

    def depends(self, t: Any) -> bool:
        """Computed from the input, and still carrying its gradient (not detached)."""
        return self.tagged(t) and t.requires_grad

    def follow(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Tag ``out`` (and an argument changed in place) when any argument of the call is tagged."""
        if not any(self.tagged(a) for a in tree_leaves((args, kwargs))):
            return
        for t in tree_leaves(out):
            if isinstance(t, Tensor):
                self.add(t)
        name = getattr(func, "__name__", "")
        in_place = name == "__setitem__" or name.startswith("__i") or (name.endswith("_") and not name.endswith("__"))
        if in_place and args and isinstance(args[0], Tensor):
            self.add(args[0])


class _ScaleGradient(torch.autograd.Function):
    """``x`` in value (a view, no copy); the gradient times a constant factor."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, factor: float) -> Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.factor, None


def uniform(factors: Sequence[Any], depends: Callable[[Any], bool] = traced) -> list[Any]:
    """The factors of a product, those computed from the input with their gradient divided by their count.

    ``depends`` says which factors are computed from the input (by default: any tensor on the graph).

    Example:
        >>> import torch
        >>> from camkit.methods.attribution._attnlrp_rules import uniform
        >>> a = torch.tensor([2.0], requires_grad=True)
        >>> x, y = uniform([a * 1, a * 3])  # both on the graph: each gets half of the product's relevance
        >>> (g,) = torch.autograd.grad((x * y).sum(), a)
        >>> (a * g).item(), (x * y).item()  # relevance of a: 6 + 6 = the product's 12
        (12.0, 12.0)
    """
    flags = [depends(f) for f in factors]
    count = sum(flags)
    if count < 2:
        return list(factors)
    return [_ScaleGradient.apply(f, 1.0 / count) if flag else f for f, flag in zip(factors, flags)]


class _IdentityRule(torch.autograd.Function):
    """``f(x)`` in value; the gradient times ``f(x) / x`` (zero where ``x`` is zero)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        y = fn(x)
        zero = x == 0
        ctx.save_for_backward(torch.where(zero, 0.0, y / torch.where(zero, 1.0, x)))
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (ratio,) = ctx.saved_tensors
        return grad * ratio, None


def identity_rule(x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """``fn(x)`` whose relevance passes to ``x`` unchanged, element by element (AttnLRP's identity rule).

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> from camkit.methods.attribution._attnlrp_rules import identity_rule
        >>> x = torch.tensor([-1.0, 2.0], requires_grad=True)
        >>> y = identity_rule(x * 1, F.silu)
        >>> (g,) = torch.autograd.grad(y.sum(), x)
        >>> torch.allclose(x * g, y)  # R_x = R_y = y * 1
        True
    """
    out: Tensor = _IdentityRule.apply(x, fn)
    return out


def _dims(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(range(-len(shape), 0))


class _LayerNormIdentity(torch.autograd.Function):
    """Layer norm in value; in the backward the standard deviation is a constant, the centring is not."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, shape: tuple[int, ...], weight: Tensor | None, bias: Tensor | None,
                eps: float) -> Tensor:  # fmt: skip
        w = None if weight is None else weight.detach()
        y, _, rstd = torch.native_layer_norm(x, shape, w, None if bias is None else bias.detach(), eps)
        ctx.save_for_backward(rstd, w)
        ctx.dims = _dims(shape)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        rstd, w = ctx.saved_tensors
        g = grad * rstd if w is None else grad * w * rstd
        return g - g.mean(dim=ctx.dims, keepdim=True), None, None, None, None


def layer_norm_identity(x: Tensor, shape: Sequence[int], weight: Tensor | None, bias: Tensor | None,
                        eps: float) -> Tensor:  # fmt: skip
    """``F.layer_norm`` in value; relevance through ``(x - mean) / std * w`` with ``std`` held constant.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> from camkit.methods.attribution._attnlrp_rules import layer_norm_identity
        >>> x = torch.tensor([[1.0, 2.0, 6.0]], requires_grad=True)
        >>> y = layer_norm_identity(x * 1, (3,), None, None, 1e-5)
        >>> (g,) = torch.autograd.grad(y[0, 2], x)  # no bias: the input keeps y's relevance
        >>> torch.allclose((x * g).sum(), y[0, 2]), torch.allclose(y, F.layer_norm(x, (3,)))
        (True, True)
    """
    out: Tensor = _LayerNormIdentity.apply(x, tuple(shape), weight, bias, float(eps))
    return out


def rms_norm_identity(x: Tensor, shape: Sequence[int], weight: Tensor | None, eps: float | None) -> Tensor:
    """``F.rms_norm`` in value; relevance through ``x * w / rms(x)`` with ``rms(x)`` held constant.

    Example:
        >>> import torch
        >>> from camkit.methods.attribution._attnlrp_rules import rms_norm_identity
        >>> x = torch.tensor([[3.0, -4.0]], requires_grad=True)
        >>> y = rms_norm_identity(x * 1, (2,), None, 0.0)
        >>> (g,) = torch.autograd.grad(y[0, 0], x)
        >>> [round(v, 4) for v in (x * g)[0].tolist()], round(y[0, 0].item(), 4)
        ([0.8485, -0.0], 0.8485)
    """
    dims = _dims(shape)
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    factor = torch.rsqrt(x.detach().pow(2).mean(dim=dims, keepdim=True) + eps)
    out = x * factor
    return out if weight is None else out * weight.detach()


def generalized_gamma(
    z: Tensor,
    run: Callable[[Tensor, Tensor, Tensor | None], Tensor],
    a: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    gamma: float,
    epsilon: float,
) -> Tensor:
    """``z`` in value; the gradient of the generalised gamma rule of the layer ``run`` at input ``a``.

    ``run(input, weight, bias)`` recomputes the layer (``F.linear`` or a convolution with its
    other arguments bound). ``z`` is the layer's true output; the relevance ``R_j = z_j g_j`` of each
    output is shared in proportion to the rule's contributions, stabilised by ``epsilon``.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> from camkit.methods.attribution._attnlrp_rules import generalized_gamma
        >>> a = torch.tensor([[1.0, -1.0]], requires_grad=True)
        >>> w = torch.tensor([[2.0, 1.0]])
        >>> z = F.linear(a * 1, w)  # z = 1 > 0: 1 * (2 + 0.5 * 2) = 3 and -1 * (1 + 0.5 * 0) = -1
        >>> out = generalized_gamma(z, F.linear, a * 1, w, None, 0.5, 0.0)
        >>> (g,) = torch.autograd.grad(out.sum(), a)
        >>> (a * g).tolist()  # the contributions over their sum 2, times R = z = 1
        [[1.5, -0.5]]
    """
    w_up, w_down = weight + gamma * weight.clamp(min=0), weight + gamma * weight.clamp(max=0)
    b_up = b_down = None
    if bias is not None:
        b_up, b_down = bias + gamma * bias.clamp(min=0), bias + gamma * bias.clamp(max=0)
    a_pos, a_neg = a.clamp(min=0), a.clamp(max=0)
    up = run(a_pos, w_up, b_up) + run(a_neg, w_down, None)  # shares of outputs z > 0
    down = run(a_pos, w_down, b_down) + run(a_neg, w_up, None)  # shares of outputs z < 0
    value = z.detach()
    zero = torch.zeros((), dtype=value.dtype, device=value.device)
    rule = up * torch.where(value > 0, value / stabilize(up.detach(), epsilon), zero)
    rule = rule + down * torch.where(value < 0, value / stabilize(down.detach(), epsilon), zero)
    return rule + (value - rule.detach())



def _gamma_weights(weight: Tensor, gamma: float) -> tuple[Tensor, Tensor]:
    return weight + gamma * weight.clamp(min=0), weight + gamma * weight.clamp(max=0)


class _GammaLinear(torch.autograd.Function):
    """``F.linear`` in value; the generalised gamma rule's gradient, the boosted weights rebuilt in the backward.

    Keeping the rule's four products on the graph would hold two boosted copies of every weight
    matrix until the backward; this node keeps the input, the weight itself and one factor per output.
    """

    @staticmethod
    def forward(ctx: Any, a: Tensor, weight: Tensor, bias: Tensor | None, gamma: float, epsilon: float) -> Tensor:
        w, b = weight.detach(), None if bias is None else bias.detach()
        run = torch.nn.functional.linear
        z = run(a, w, b)
        w_up, w_down = _gamma_weights(w, gamma)
        b_up = b_down = None
        if b is not None:
            b_up, b_down = b + gamma * b.clamp(min=0), b + gamma * b.clamp(max=0)
        a_pos, a_neg = a.clamp(min=0), a.clamp(max=0)
        positive = z > 0
        denominator = torch.where(positive, run(a_pos, w_up, b_up) + run(a_neg, w_down),
                                  run(a_pos, w_down, b_down) + run(a_neg, w_up))  # fmt: skip
        factor = torch.where(z == 0, 0.0, z / stabilize(denominator, epsilon))
        ctx.save_for_backward(a, w, factor, positive)
        ctx.gamma = gamma
        return z

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        a, w, factor, positive = ctx.saved_tensors
        w_up, w_down = _gamma_weights(w, ctx.gamma)
        g = grad * factor
        g_up, g_down = torch.where(positive, g, 0.0), torch.where(positive, 0.0, g)
        from_pos = g_up @ w_up + g_down @ w_down  # what the positive inputs pass
        from_neg = g_up @ w_down + g_down @ w_up
        zero = torch.zeros((), dtype=g.dtype, device=g.device)
        return torch.where(a > 0, from_pos, torch.where(a < 0, from_neg, zero)), None, None, None, None


def gamma_linear(a: Tensor, weight: Tensor, bias: Tensor | None, gamma: float, epsilon: float) -> Tensor:
    """``F.linear(a, weight, bias)`` whose gradient is :func:`generalized_gamma`'s, in the memory of one linear layer.

    Example:
        >>> import torch
        >>> from camkit.methods.attribution._attnlrp_rules import gamma_linear
        >>> a = torch.tensor([[1.0, -1.0]], requires_grad=True)
        >>> out = gamma_linear(a * 1, torch.tensor([[2.0, 1.0]]), None, 0.5, 0.0)
        >>> (g,) = torch.autograd.grad(out.sum(), a)
        >>> out.tolist(), (a * g).tolist()  # as generalized_gamma's example
        ([[1.0]], [[1.5, -0.5]])
    """
    out: Tensor = _GammaLinear.apply(a, weight, bias, gamma, epsilon)
    return out
