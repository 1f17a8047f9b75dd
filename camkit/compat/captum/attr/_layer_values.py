"""A model whose layers take the values given to it: captum's attributions to several layers at once.

:func:`layer_values` records the tensors of each layer (its output, or its positional inputs) in
one forward; :func:`substituted` is the model with those tensors as its first arguments, put in
place of what each layer computes (non-tensor values kept), the model's own inputs after them.
An input attribution of that function (camkit's, through the translation) is an attribution to
the layers, all moved together as captum moves them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ....hooks import HookScope
from .._pack import as_tuple, forward_args
from ._base import NotComputedError

__all__ = ["Slots", "layer_values", "substituted"]


@dataclass
class Slots:
    """Where a layer's tensors lie in what it returns (or takes), and whether captum answers with a tuple."""

    positions: list[int]
    several: bool


def _tensors(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def layer_values(forward_func: Callable[..., Any], layers: Sequence[nn.Module], inputs: Any, extra: Any,
                 to_input: bool) -> list[tuple[tuple[Tensor, ...], Slots]]:
    """Each layer's tensors in one forward on ``inputs`` (the last call of each), with their slots."""
    seen: dict[int, Any] = {}

    def record(index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any = None) -> None:  # copies: in-place layers overwrite
            seen[index] = tuple(v.clone() if isinstance(v, Tensor) else v for v in _tensors(args if to_input else output))
            if not to_input and isinstance(output, Tensor):
                seen[index] = seen[index][0]
        return hook

    with torch.no_grad(), HookScope() as scope:
        for i, layer in enumerate(layers):
            if to_input:
                scope.forward_pre(layer, record(i))
            else:
                scope.forward(layer, record(i))
        forward_func(*as_tuple(inputs), *forward_args(extra))
    out = []
    for i in range(len(layers)):
        if i not in seen:
            raise NotComputedError(f"layer {i} of the list did not run in the forward pass")
        values = _tensors(seen[i])
        positions = [j for j, v in enumerate(values) if isinstance(v, Tensor)]
        several = not isinstance(seen[i], Tensor) and not (to_input and len(values) == 1)
        out.append((tuple(values[j].detach() for j in positions), Slots(positions, several)))
    return out


def substituted(forward_func: Callable[..., Any], layers: Sequence[nn.Module], slots: Sequence[Slots],
                to_input: bool) -> Callable[..., Any]:
    """``forward(*layer_tensors, *inputs)``: the model with each layer's tensors replaced by those given."""
    counts = [len(s.positions) for s in slots]

    def forward(*args: Any) -> Any:
        given, start = [], 0
        for count in counts:
            given.append(args[start : start + count])
            start += count

        def put(index: int, value: Any) -> Any:
            items = list(_tensors(value))
            for position, tensor in zip(slots[index].positions, given[index]):
                items[position] = tensor
            if isinstance(value, Tensor):
                return items[0]
            return tuple(items) if to_input or isinstance(value, tuple) else type(value)(items)

        def after(index: int) -> Callable[..., Any]:
            return lambda module, inputs, out: put(index, out)

        def before(index: int) -> Callable[..., Any]:
            return lambda module, inputs: put(index, inputs)

        with HookScope() as scope:
            for i, layer in enumerate(layers):
                if to_input:
                    scope.forward_pre(layer, before(i))
                else:
                    scope.forward(layer, after(i))
            return forward_func(*args[start:])

    return forward
