"""DeepLift's rules as a :class:`~torch.overrides.TorchFunctionMode`; private to :mod:`camkit.methods.attribution.deeplift`.

:class:`_RescaleMode` records the input of every activation call on the reference (the reference
pass), then replaces each call of the main pass by an autograd Function whose backward applies the
rule against its record: :class:`_Rescale` for elementwise activations, the max-pooling rule of
:mod:`camkit.methods.attribution._maxpool_rule`, and the softmax rule of
:mod:`camkit.methods.attribution._softmax_rule`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Union, cast

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from ._activations import Activation, match_activation, unruled_name
from ._activations import slope as activation_slope
from ._maxpool_rule import RescaleMaxPool, max_pool_call, max_pool_name, pool
from ._maxpool_rule import where_still as _where_still
from ._softmax_rule import RescaleSoftmax, softmax_call

__all__ = ["_Mismatch", "_Record", "_Rescale", "_RescaleMode", "_grouped"]


def _grouped(t: Tensor, rows: int) -> Tensor:
    """``t`` [N, ...] viewed as [rows, N / rows, ...]: the row groups that share one reference row."""
    return t.unflatten(0, (rows, -1))


class _Rescale(torch.autograd.Function):
    """An activation whose backward multiplies by the Rescale multiplier ``(f(x) - f(x0)) / (x - x0)``.

    Written for memory traffic: the multiplier is built in place (two full-size buffers), since
    these elementwise passes, not the arithmetic, are what DeepLift adds to a saliency pass. The
    reference's ``f(x0)`` is recomputed from ``x0`` here rather than kept from the reference pass:
    it costs one pass at the reference's size (usually one row) and spares holding a second
    reference-sized buffer per activation between the passes.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, ref: Tensor, activation: Activation, eps: float) -> Tensor:
        rows = ref.shape[0]  # x's rows come in `rows` equal groups, the i-th paired with the reference's row i
        ref_out = activation.fn(ref)
        delta_in = torch.sub(_grouped(x, rows), ref.unsqueeze(1))
        relu = activation.name == "relu"
        if relu:
            y = torch.relu_(x) if activation.inplace else torch.relu(x)
            slope: Callable[[], Tensor] = lambda: _grouped(y, rows) > 0  # noqa: E731  (y > 0 exactly where x > 0)
        else:
            y = activation.fn(x)
            slope = lambda: _grouped(activation_slope(activation, x), rows)  # noqa: E731  (x still unchanged then)
        multiplier = torch.sub(_grouped(y, rows), ref_out.unsqueeze(1)).div_(delta_in)
        ctx.save_for_backward(_where_still(multiplier, delta_in, eps, slope).flatten(0, 1))
        if activation.inplace:
            if not relu:
                y = x.copy_(y)
            ctx.mark_dirty(x)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        (multiplier,) = ctx.saved_tensors
        return grad * multiplier, None, None, None


_Record = tuple[str, Tensor, Union[tuple[Tensor, Tensor], None]]


class _Mismatch(Exception):
    """The main pass's activation calls do not line up with the reference pass's."""


class _RescaleMode(TorchFunctionMode):
    """Records activation calls (``refs is None``) or applies the Rescale rule against them.

    A record is ``(name, x0, pooled)``: the call's input on the reference and, for max-pooling,
    the pooled values and their indices there (``None`` for an activation, whose output at
    ``x0`` the main pass recomputes). The main pass uses each record once and drops it from
    ``refs`` as it goes, so the reference's memory is given back during the pass, not after it.
    """

    def __init__(self, refs: list[_Record | None] | None = None, eps: float = 1e-10, group: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.refs = refs
        self.group = group
        self.recorded: list[_Record | None] = []
        self.eps = eps
        self.index = 0
        self.unruled: set[str] = set()

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        activation: Activation | dict[str, Any] | None = match_activation(func, args, kwargs)
        if activation is None:
            activation = max_pool_call(func, args, kwargs)
        if activation is None:
            activation = softmax_call(func, args, kwargs)
        if activation is None:
            name = unruled_name(func)
            if name is not None:
                self.unruled.add(name)
            return func(*args, **kwargs)
        name_now, x = self._named(activation)
        if self.refs is None:
            return self._record(name_now, x, activation, func, args, kwargs)
        if self.index >= len(self.refs):
            raise _Mismatch(f"the forward called more activations ({self.index + 1}+) than on the baseline")
        name, ref, pooled = cast(_Record, self.refs[self.index])  # each main pass comes with fresh records
        self.refs[self.index] = None  # used once: its memory goes as soon as this call is done with it
        self.index += 1
        if name != name_now or ref.shape[1:] != x.shape[1:] or not self._paired(ref.shape[0], x.shape[0]):
            raise _Mismatch(
                f"activation call {self.index} is {name_now} on {list(x.shape)} for the images but "
                f"{name} on {list(ref.shape)} for the baseline"
            )
        if isinstance(activation, Activation):
            return _Rescale.apply(x, ref.to(x.dtype), activation, self.eps)
        if name == "softmax":
            copies = x.shape[0] // ref.shape[0] if ref.shape[0] not in (1, x.shape[0]) else 1
            return RescaleSoftmax.apply(x, ref.repeat_interleave(copies, dim=0).to(x.dtype), activation["dim"], self.eps)
        values, index = cast(tuple[Tensor, Tensor], pooled)
        if ref.shape[0] not in (1, x.shape[0]):  # grouped references: the pooling rule takes them row by row
            copies = x.shape[0] // ref.shape[0]
            ref, values, index = (t.repeat_interleave(copies, dim=0) for t in (ref, values, index))
        return RescaleMaxPool.apply(x, ref.to(x.dtype), (values.to(x.dtype), index), activation, self.eps)

    @staticmethod
    def _named(activation: Activation | dict[str, Any]) -> tuple[str, Tensor]:
        """The rule's name for the call and the input it reads."""
        if isinstance(activation, Activation):
            return activation.name, activation.x
        if "dim" in activation:
            return "softmax", activation["input"]
        return max_pool_name(activation["input"]), activation["input"]

    def _paired(self, ref_rows: int, rows: int) -> bool:
        """Whether a reference activation with ``ref_rows`` rows pairs with one of ``rows`` rows.

        One reference row serves every row, or each row has its own; with ``group = (r, n)``
        (several baselines in one pass) a reference of exactly ``r`` rows also pairs with an
        activation of exactly ``n`` rows, group by group.
        """
        return ref_rows in (1, rows) or (self.group is not None and (ref_rows, rows) == self.group)

    def _record(
        self,
        name: str,
        x: Tensor,
        activation: Activation | dict[str, Any],
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run one call of the reference pass and keep a copy of its input (later ops may change it)."""
        x0 = x.detach().clone()
        if isinstance(activation, Activation) or name == "softmax":
            self.recorded.append((name, x0, None))
            return func(*args, **kwargs)
        values, index = pool(x, activation)
        self.recorded.append((name, x0, (values.detach().clone(), index)))
        return values
