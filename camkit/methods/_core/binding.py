"""How one explain call feeds the model: the image's slot among the model's inputs.

Private. The binding of a call lives in a context variable keyed by explainer, never on
the explainer itself, so one explainer can be called from several threads at once (each
thread has its own context) and wrapped explainers (``SmoothGrad``, ``GuidedGradCAM``) can
hand their call's inputs to the explainers they run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any, NamedTuple, Union

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError

__all__ = ["Call", "InputIndex", "bind_inputs", "bound", "current_call", "run_model"]

InputIndex = Union[int, str]


class Call(NamedTuple):
    """How one explain call runs the model: the image ``x`` goes into a slot of args/kwargs."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    slot: InputIndex
    as_list: bool


_BOUND: ContextVar[Mapping[int, Call | None]] = ContextVar("camkit_bound_calls", default=MappingProxyType({}))


def current_call(owner: object) -> Call | None:
    """The binding of the call ``owner`` is running in this thread, or ``None`` (plain ``model(x)``)."""
    return _BOUND.get().get(id(owner))


@contextmanager
def bound(owners: Sequence[object], call: Call | None) -> Iterator[None]:
    """Bind ``call`` to each of ``owners`` for the block (in this thread and context only)."""
    table = dict(_BOUND.get())
    for owner in owners:
        table[id(owner)] = call
    token = _BOUND.set(MappingProxyType(table))
    try:
        yield
    finally:
        _BOUND.reset(token)


def _is_image_list(held: Any, x: Tensor) -> bool:
    if not isinstance(held, (list, tuple)) or len(held) != x.shape[0]:
        return False
    if not all(isinstance(t, Tensor) and t.shape == x.shape[1:] for t in held):
        return False
    return bool(torch.equal(torch.stack(list(held)), x))


def bind_inputs(
    x: Tensor, inputs: Sequence[Any] | None, kwargs: Mapping[str, Any] | None, slot: InputIndex
) -> Call | None:
    """Check ``inputs``/``kwargs`` against ``x`` and the explainer's ``input_index``; ``None`` for a plain call."""
    if inputs is None and not kwargs and slot == 0:
        return None
    if inputs is not None and (isinstance(inputs, (Tensor, str)) or not isinstance(inputs, Sequence)):
        raise InvalidInputError(
            f"inputs must be a tuple of the model's positional inputs, got {type(inputs).__name__}; "
            "for a single image just pass x."
        )
    args = tuple(inputs) if inputs is not None else ()
    extra = dict(kwargs or {})
    if isinstance(slot, str):
        if slot in extra and extra[slot] is not x:
            raise InvalidInputError(
                f"kwargs[{slot!r}] is not x; the image explained goes in as keyword {slot!r} (input_index), "
                "so leave it out of kwargs or pass x itself there."
            )
        extra.pop(slot, None)
        return Call(args, extra, slot, False)
    if inputs is None:
        if slot != 0:
            raise InvalidInputError(
                f"input_index={slot} needs inputs=(...), the model's positional inputs with x at position {slot}"
            )
        return Call((x,), extra, 0, False)
    if not -len(args) <= slot < len(args):
        raise InvalidInputError(f"input_index={slot} is out of range for {len(args)} inputs")
    held = args[slot]
    if held is x:
        return Call(args, extra, slot, False)
    if _is_image_list(held, x):
        return Call(args, extra, slot, True)
    where = [i for i, a in enumerate(args) if a is x]
    hint = f"; x is inputs[{where[0]}]: pass input_index={where[0]} to the explainer" if where else ""
    raise InvalidInputError(
        f"inputs[{slot}] (input_index={slot}) must be x itself or a list of its images, got "
        f"{type(held).__name__}{hint}."
    )


def run_model(model: nn.Module, x: Tensor, call: Call | None) -> Any:
    """``model`` on the image batch ``x``, with the call's other inputs in their places."""
    if call is None:
        return model(x)
    value: Any = list(x.unbind(0)) if call.as_list else x
    if isinstance(call.slot, str):
        return model(*call.args, **call.kwargs, **{call.slot: value})
    args = list(call.args)
    args[call.slot] = value
    return model(*args, **call.kwargs)
