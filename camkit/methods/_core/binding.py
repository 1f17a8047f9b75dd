"""How one explain call feeds the model: the image's slot among the model's inputs.

Private. The binding of a call lives in a context variable keyed by explainer, never on
the explainer itself, so one explainer can be called from several threads at once (each
thread has its own context) and wrapped explainers (``SmoothGrad``, ``GuidedGradCAM``) can
hand their call's inputs to the explainers they run.

Methods that rerun the model on batches of changed copies of ``x`` (occlusion, RISE, the
region methods, Score-CAM, the wrappers...) give each row of such a batch the other inputs
of the sample it was made from, by :func:`select_rows`. The rule, for every positional
input but ``x``'s slot and every keyword input:

- a tensor whose first dimension is the batch size ``B`` of ``x`` holds one row per sample:
  row ``i`` of the changed batch gets row ``rows[i]`` of it;
- a 0-dim tensor, a tensor with first dimension 1 (when ``B > 1``: broadcast, shared by all
  samples) and anything that is not a tensor (numbers, strings, ``None``) go in as they are;
- any other tensor (first dimension neither ``B`` nor 1, such as patches of all the batch's
  images flattened into one axis) and a list, tuple or dict holding tensors are ambiguous:
  :class:`~camkit.errors.InvalidInputError` names the input. Bind such an input into the
  model (a wrapper module or ``functools.partial``) or give it one row per sample.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any, NamedTuple, Union

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError

__all__ = ["Call", "InputIndex", "bind_inputs", "bound", "check_rows", "current_call", "run_model", "select_rows"]

InputIndex = Union[int, str]


class Call(NamedTuple):
    """How one explain call runs the model: the image ``x`` goes into a slot of args/kwargs."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    slot: InputIndex
    as_list: bool
    #: the batch size of ``x`` in the call (-1: unknown), which says which inputs hold one row per sample
    batch: int = -1


_BOUND: ContextVar[Mapping[int, Call | None]] = ContextVar("camkit_bound_calls", default=MappingProxyType({}))


def current_call(owner: object) -> Call | None:
    """The binding of the call ``owner`` is running in this thread, or ``None`` (plain ``model(x)``)."""
    return _BOUND.get().get(id(owner))


def bound(owners: Sequence[object], call: Call | None) -> AbstractContextManager[None]:
    """Bind ``call`` to each of ``owners`` for the block (in this thread and context only).

    Nothing is set when nothing would change: a plain call (``None``) of owners that no outer
    block has bound (what :func:`current_call` gives them is ``None`` already).
    """
    table = _BOUND.get()
    if call is None and not any(id(owner) in table for owner in owners):
        return nullcontext()
    return _bound(table, owners, call)


@contextmanager
def _bound(current: Mapping[int, Call | None], owners: Sequence[object], call: Call | None) -> Iterator[None]:
    table = dict(current)
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
        return Call(args, extra, slot, False, x.shape[0])
    if inputs is None:
        if slot != 0:
            raise InvalidInputError(
                f"input_index={slot} needs inputs=(...), the model's positional inputs with x at position {slot}"
            )
        return Call((x,), extra, 0, False, x.shape[0])
    if not -len(args) <= slot < len(args):
        raise InvalidInputError(f"input_index={slot} is out of range for {len(args)} inputs")
    held = args[slot]
    if held is x:
        return Call(args, extra, slot, False, x.shape[0])
    if _is_image_list(held, x):
        return Call(args, extra, slot, True, x.shape[0])
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


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, Tensor):
        return True
    if isinstance(value, Mapping):
        return any(_holds_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    return False


def _per_sample(value: Any, batch: int, name: str) -> bool:
    """Whether ``value`` has one row per sample (else it is shared); raises for an ambiguous one."""
    if isinstance(value, Tensor):
        if value.dim() == 0 or (value.shape[0] == 1 and batch != 1):
            return False
        if value.shape[0] == batch:
            return True
        raise InvalidInputError(
            f"{name} has shape {list(value.shape)}, but x has {batch} samples: this method reruns the model on "
            f"batches of changed copies of x and gives each copy the rows of its own sample of every input whose "
            f"first dimension is {batch}; a first dimension of {value.shape[0]} cannot be split by sample. Bind "
            "this input into the model (a wrapper module or functools.partial) or give it one row per sample."
        )
    if _holds_tensor(value):
        raise InvalidInputError(
            f"{name} is a {type(value).__name__} holding tensors, which this method cannot split by sample when it "
            "reruns the model on batches of changed copies of x; pass the tensors as inputs of their own (one row "
            "per sample) or bind them into the model (a wrapper module or functools.partial)."
        )
    return False


def _others(call: Call) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of every input of the call but the image's slot."""
    slot = call.slot % len(call.args) if isinstance(call.slot, int) and call.args else None
    for i, value in enumerate(call.args):
        if i != slot:
            yield f"inputs[{i}]", value
    for key, value in call.kwargs.items():
        yield f"kwargs[{key!r}]", value


def check_rows(call: Call | None) -> None:
    """Raise :class:`InvalidInputError` for an input of the call that cannot be split by sample."""
    if call is not None:
        for name, value in _others(call):
            _per_sample(value, call.batch, name)


def select_rows(call: Call | None, rows: Tensor) -> Call | None:
    """The call's inputs for a changed batch whose row ``i`` was made from sample ``rows[i]``.

    Inputs with one row per sample are indexed by ``rows``; shared ones go in as they are;
    ambiguous ones raise (see the module's docstring for the rule). ``None`` stays ``None``.
    """
    if call is None:
        return None
    picked = {
        name: value.index_select(0, rows.to(value.device))
        for name, value in _others(call)
        if _per_sample(value, call.batch, name)
    }
    slot = call.slot % len(call.args) if isinstance(call.slot, int) and call.args else None
    args = tuple(a if i == slot else picked.get(f"inputs[{i}]", a) for i, a in enumerate(call.args))
    kwargs = {k: picked.get(f"kwargs[{k!r}]", v) for k, v in call.kwargs.items()}
    return call._replace(args=args, kwargs=kwargs)
