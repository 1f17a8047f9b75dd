"""Backward rules for every ReLU of a forward pass, however the model writes it.

Guided backpropagation and the DeconvNet change how the gradient passes a ReLU. Libraries
that swap or hook ``nn.ReLU`` modules miss the ReLUs a forward calls as functions
(``F.relu``, ``torch.relu``, ``x.relu_()`` ...), and on such models silently return the
plain gradient. camkit instead intercepts the *calls*: inside :func:`relu_rule` a
:class:`torch.overrides.TorchFunctionMode` sees every ``torch`` function and ``Tensor``
method the forward calls, and replaces each ReLU by an autograd Function that computes the
same forward value (in place when the call was in place) and applies the chosen rule in
backward. Nothing of the model is replaced, patched or hooked; leaving the ``with`` block
pops the mode, also on an exception.

Spellings covered: ``nn.ReLU`` (in place or not), ``F.relu`` (``inplace`` either way),
``F.relu_``, ``torch.relu``, ``torch.relu_``, ``Tensor.relu``, ``Tensor.relu_``. Calls that
bypass ``__torch_function__`` (``torch.ops.aten.relu`` directly, TorchScript, compiled
graphs) are not seen; when a forward under a rule calls no ReLU at all, the explainers warn
with :class:`~camkit.errors.NoReLUWarning`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from ...errors import InvalidInputError
from ...functional.attribution import deconv_relu_grad, guided_relu_grad

__all__ = ["ReLURule", "relu_rule"]

ReLURule = Literal["guided", "deconv"]


class _GuidedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, inplace: bool) -> Tensor:
        if inplace:
            ctx.mark_dirty(x)
            out = torch.relu_(x)
        else:
            out = torch.relu(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (out,) = ctx.saved_tensors
        return guided_relu_grad(grad, out), None


class _DeconvReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, inplace: bool) -> Tensor:
        if inplace:
            ctx.mark_dirty(x)
            return torch.relu_(x)
        return torch.relu(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return deconv_relu_grad(grad), None


_FUNCTIONS: dict[str, type[torch.autograd.Function]] = {"guided": _GuidedReLU, "deconv": _DeconvReLU}

# ReLU entry points as seen by __torch_function__, with whether the call is in place.
# ``None`` means "read the ``inplace`` argument" (F.relu). nn.ReLU.forward calls F.relu.
_RELU_CALLS: dict[Callable[..., Any], bool | None] = {
    F.relu: None,
    torch.relu: False,
    torch.relu_: True,  # also F.relu_
    torch.Tensor.relu: False,
    torch.Tensor.relu_: True,
}


_OTHER = object()  # marks a function that is not a ReLU entry point


class _ReLUInterceptor(TorchFunctionMode):
    def __init__(self, function: type[torch.autograd.Function]) -> None:
        super().__init__()
        self.function = function
        self.calls = 0

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        # Called for every torch function of the forward: the non-ReLU path is kept to one lookup.
        try:
            inplace = _RELU_CALLS.get(func, _OTHER)
        except TypeError:  # unhashable callables are never ReLUs
            inplace = _OTHER
        if inplace is _OTHER:
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, Tensor) or not x.is_floating_point():
            return func(*args, **kwargs)
        if inplace is None:  # F.relu(input, inplace=False)
            inplace = bool(args[1]) if len(args) > 1 else bool(kwargs.get("inplace", False))
        self.calls += 1
        return self.function.apply(x, inplace)


class _Seen:
    """How many ReLU calls the rule replaced (read after the forward)."""

    def __init__(self, mode: _ReLUInterceptor) -> None:
        self._mode = mode

    @property
    def calls(self) -> int:
        return self._mode.calls


@contextmanager
def relu_rule(rule: ReLURule) -> Iterator[_Seen]:
    """Apply a guided (``"guided"``) or DeconvNet (``"deconv"``) ReLU rule to every ReLU called in the block.

    The forward values are unchanged; only gradients that later flow back through the
    ReLUs called inside the block follow the rule (the backward itself may run after
    the block). Yields an object whose ``calls`` counts the ReLUs replaced.

    Example:
        >>> import torch
        >>> from camkit.methods.attribution.guided import relu_rule
        >>> x = torch.tensor([1.0, -1.0, 2.0], requires_grad=True)
        >>> with relu_rule("guided") as seen:
        ...     y = (x.relu() * torch.tensor([1.0, 1.0, -1.0])).sum()
        >>> torch.autograd.grad(y, x)[0], seen.calls
        (tensor([1., 0., 0.]), 1)
    """
    if rule not in _FUNCTIONS:
        raise InvalidInputError(f"rule must be 'guided' or 'deconv', got {rule!r}")
    mode = _ReLUInterceptor(_FUNCTIONS[rule])
    with mode:
        yield _Seen(mode)
