"""Recognising activation calls, whatever their spelling, for the propagation rules.

A :class:`torch.overrides.TorchFunctionMode` sees every ``torch`` function and ``Tensor``
method a forward calls (``nn.ReLU`` calls ``F.relu``; ``nn.Sigmoid`` calls
``torch.sigmoid`` ...). :func:`match_activation` says whether one such call is an
elementwise activation camkit has a rule for, and gives it back as an out-of-place
function of the input, plus whether the call was in place. :func:`unruled_name` names the
non-linear calls that no rule covers (softmax, max-pooling, normalisations ...), so that the
methods can warn about them (:func:`warn_unruled`, once per call, at the user's line).
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...errors import NoRuleWarning

__all__ = ["ZERO_AT_ZERO", "Activation", "match_activation", "pass_relevance", "passed_on", "slope", "unruled_name", "warn_unruled"]

#: the activations with ``f(0) = 0``, through which relevance can pass unchanged (:func:`pass_relevance`)
ZERO_AT_ZERO = frozenset({"tanh", "gelu", "silu", "elu", "hardtanh", "relu6"})


@dataclass(frozen=True)
class Activation:
    """One activation call: ``name``, its input ``x``, ``fn`` (out of place) and ``inplace``."""

    name: str
    x: Tensor
    fn: Callable[[Tensor], Tensor]
    inplace: bool


# Builtins whose only tensor argument is the input, with whether they work in place.
_FIXED: dict[Callable[..., Any], tuple[str, Callable[[Tensor], Tensor], bool]] = {
    torch.relu: ("relu", torch.relu, False),
    torch.relu_: ("relu", torch.relu, True),  # also F.relu_
    torch.Tensor.relu: ("relu", torch.relu, False),
    torch.Tensor.relu_: ("relu", torch.relu, True),
    torch.sigmoid: ("sigmoid", torch.sigmoid, False),
    torch.Tensor.sigmoid: ("sigmoid", torch.sigmoid, False),
    torch.Tensor.sigmoid_: ("sigmoid", torch.sigmoid, True),
    torch.tanh: ("tanh", torch.tanh, False),
    torch.Tensor.tanh: ("tanh", torch.tanh, False),
    torch.Tensor.tanh_: ("tanh", torch.tanh, True),
}

# Python-level functionals that dispatch through __torch_function__ themselves; their other
# arguments (slopes, bounds, ``inplace``) are read from the call.
_FUNCTIONALS: dict[Callable[..., Any], str] = {
    F.relu: "relu",
    F.relu6: "relu6",
    F.hardtanh: "hardtanh",
    F.elu: "elu",
    F.leaky_relu: "leaky_relu",
    F.silu: "silu",
}

# Builtin functionals without ``inplace``: the input comes first, other arguments pass through.
_PLAIN: dict[Callable[..., Any], str] = {F.gelu: "gelu", F.softplus: "softplus"}

# Non-linear calls with no rule here, by function name (spellings share the name).
_UNRULED = {
    "softmax",
    "log_softmax",
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "max_pool1d_with_indices",
    "max_pool2d_with_indices",
    "max_pool3d_with_indices",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
    "layer_norm",
    "group_norm",
    "normalize",
    "hardswish",
    "hardsigmoid",
    "mish",
    "selu",
    "celu",
    "prelu",
    "glu",
    "scaled_dot_product_attention",
}

_SIGNATURES: dict[Callable[..., Any], inspect.Signature] = {}


def _bound(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments | None:
    signature = _SIGNATURES.get(func)
    if signature is None:
        signature = _SIGNATURES[func] = inspect.signature(func)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return bound


def _lookup(table: dict[Callable[..., Any], Any], func: Callable[..., Any]) -> Any:
    try:
        return table.get(func)
    except TypeError:  # unhashable callables are never activations
        return None


def match_activation(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Activation | None:
    """The activation behind one ``__torch_function__`` call, or ``None`` when it is none (or not on a float tensor)."""
    fixed = _lookup(_FIXED, func)
    if fixed is not None:
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, Tensor) or not x.is_floating_point():
            return None
        name, fn, inplace = fixed
        return Activation(name, x, fn, inplace)
    plain = _lookup(_PLAIN, func)
    if plain is not None:
        rest = {k: v for k, v in kwargs.items() if k != "input"}
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, Tensor) or not x.is_floating_point():
            return None
        return Activation(plain, x, lambda t: func(t, *args[1:], **rest), False)
    name = _lookup(_FUNCTIONALS, func)
    if name is None:
        return None
    bound = _bound(func, args, kwargs)
    if bound is None:
        return None
    arguments = dict(bound.arguments)
    x = arguments.pop("input")
    if not isinstance(x, Tensor) or not x.is_floating_point():
        return None
    inplace = bool(arguments.pop("inplace", False))
    if "inplace" in inspect.signature(func).parameters:
        arguments["inplace"] = False
    return Activation(name, x, lambda t: func(t, **arguments), inplace)


def slope(activation: Activation, x: Tensor) -> Tensor:
    """The derivative of ``activation.fn`` at ``x`` (analytic for the common ones, else by autograd)."""
    if activation.name == "relu":
        return (x > 0).to(x.dtype)
    if activation.name == "sigmoid":
        s = torch.sigmoid(x)
        return s * (1 - s)
    if activation.name == "tanh":
        return 1 - torch.tanh(x) ** 2
    with torch.enable_grad():
        leaf = x.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(activation.fn(leaf).sum(), leaf)
    return grad


def unruled_name(func: Callable[..., Any]) -> str | None:
    """The name of a non-linear call that has no propagation rule, or ``None``."""
    name = getattr(func, "__name__", None)
    if not isinstance(name, str):
        return None
    name = name.lstrip("_")
    return name if name in _UNRULED else None


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside the camkit package (the user's call)."""
    # this file is camkit/methods/attribution/_activations.py: three levels up is camkit/
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def warn_unruled(method: str, names: set[str], instead: str) -> None:
    """One :class:`NoRuleWarning` naming every rule-less non-linearity a call met, at the user's line."""
    if names:
        warnings.warn(
            f"{method}: no rule for {', '.join(sorted(names))} in this forward pass; {instead}",
            NoRuleWarning,
            stacklevel=_caller_level(),
        )


def pass_relevance(activation: Activation, eps: float = 1e-12) -> Tensor:
    """The activation's value, with a backward that passes relevance on unchanged: ``g_in = g_out * f(x) / x``.

    Relevance is ``x * g``, so ``x * g_in = f(x) * g_out``: the relevance of the output, kept
    (LRP's pass rule for activations, zennit's ``Pass``). Only for ``f(0) = 0``
    (:data:`ZERO_AT_ZERO`); where ``|x| <= eps`` the relevance, about ``f(x) * g``, is dropped.

    Example:
        >>> import torch
        >>> x = torch.tensor([0.5, -2.0], requires_grad=True)
        >>> y = pass_relevance(Activation("tanh", x, torch.tanh, False))
        >>> (g,) = torch.autograd.grad(y.sum(), x)
        >>> torch.allclose(x * g, torch.tanh(x)), torch.allclose(y, torch.tanh(x))
        (True, True)
    """
    with torch.no_grad():
        y = activation.fn(activation.x)
    return passed_on(activation.x, y, eps)


def passed_on(x: Tensor, y: Tensor, eps: float = 1e-12) -> Tensor:
    """``y`` (computed from ``x``, same shape, no graph) with a backward that hands ``x`` the relevance of ``y``.

    ``g_in = g_out * y / x``, so ``x * g_in = y * g_out``; where ``|x| <= eps`` that relevance is dropped.

    Example:
        >>> import torch
        >>> x = torch.tensor([2.0, 0.0], requires_grad=True)
        >>> (g,) = torch.autograd.grad(passed_on(x, torch.tensor([3.0, 1.0])).sum(), x)
        >>> (x * g).tolist()
        [3.0, 0.0]
    """
    with torch.no_grad():
        ratio = torch.where(x.abs() > eps, y / torch.where(x.abs() > eps, x, torch.ones_like(x)), torch.zeros_like(x))
    return y + (x - x.detach()) * ratio
