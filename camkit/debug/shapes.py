"""``trace_shapes``: every module call of one forward pass, with shapes, dtypes and parameter counts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, overload

import torch
from torch import nn

from .._internal.state import eval_mode
from ..hooks import HookScope
from ._walk import iter_tensors

__all__ = ["ShapeRecord", "ShapeTable", "trace_shapes"]


class ShapeRecord(NamedTuple):
    """One module call.

    Attributes:
        order: position of the call in the forward, by the order calls *start* (a parent
            comes before its children).
        name: dotted name from ``model.named_modules()`` (``""`` for the model itself).
        type: the module's class name.
        call: how many earlier calls the same module had in this forward (0 for the first).
        depth: nesting depth of the call (0 for the model itself).
        input_shapes / output_shapes: shapes of the tensors passed in / returned, in order
            (nested tuples, lists and dicts are flattened); ``None`` outputs if the call raised.
        input_dtypes / output_dtypes: their dtypes, like ``"float32"``.
        params: parameters owned by the module, its submodules included.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> from camkit.debug import trace_shapes
        >>> record = trace_shapes(nn.Sequential(nn.Conv2d(3, 4, 3)), torch.rand(1, 3, 8, 8))[1]
        >>> record.name, record.type, record.input_shapes, record.output_shapes, record.params
        ('0', 'Conv2d', ((1, 3, 8, 8),), ((1, 4, 6, 6),), 112)
    """

    order: int
    name: str
    type: str
    call: int
    depth: int
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...] | None
    output_dtypes: tuple[str, ...] | None
    params: int


def _fmt_shapes(shapes: tuple[tuple[int, ...], ...] | None) -> str:
    if shapes is None:
        return "(raised)"
    if not shapes:
        return "-"
    return ", ".join("x".join(map(str, s)) if s else "scalar" for s in shapes)


def _fmt_dtypes(inputs: tuple[str, ...], outputs: tuple[str, ...] | None) -> str:
    seen_in = sorted(set(inputs))
    seen_out = sorted(set(outputs or ()))
    if seen_in == seen_out or not seen_in:
        return "/".join(seen_out) or "-"
    return "/".join(seen_in) + "->" + ("/".join(seen_out) or "-")


class ShapeTable:
    """The calls recorded by :func:`trace_shapes`: a sequence of :class:`ShapeRecord`.

    ``str(table)`` is an aligned text table; ``table.total_params`` counts each parameter
    of the model once.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> from camkit.debug import trace_shapes
        >>> table = trace_shapes(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), torch.rand(1, 3, 8, 8))
        >>> len(table), [r.name for r in table], table.total_params
        (3, ['', '0', '1'], 112)
    """

    _HEADER = ("#", "layer", "type", "input", "output", "dtype", "params")

    def __init__(self, records: list[ShapeRecord], total_params: int) -> None:
        self.records = records
        self.total_params = total_params

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[ShapeRecord]:
        return iter(self.records)

    @overload
    def __getitem__(self, index: int) -> ShapeRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[ShapeRecord]: ...

    def __getitem__(self, index: int | slice) -> ShapeRecord | list[ShapeRecord]:
        return self.records[index]

    def rows(self) -> list[tuple[str, ...]]:
        """The table's cells as strings, one tuple per call, without the header."""
        out: list[tuple[str, ...]] = []
        for r in self.records:
            label = "  " * r.depth + (r.name or "(model)") + (f" #{r.call}" if r.call else "")
            out.append(
                (
                    str(r.order),
                    label,
                    r.type,
                    _fmt_shapes(r.input_shapes),
                    _fmt_shapes(r.output_shapes),
                    _fmt_dtypes(r.input_dtypes, r.output_dtypes),
                    f"{r.params:,}",
                )
            )
        return out

    def __str__(self) -> str:
        rows = [self._HEADER, *self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self._HEADER))]
        right = {0, 6}
        lines = [
            "  ".join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
            for row in rows
        ]
        lines.insert(1, "-" * len(lines[0]))
        lines.append(f"{len(self.records)} calls, {self.total_params:,} parameters")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ShapeTable({len(self.records)} calls, {self.total_params} parameters)"


def trace_shapes(model: nn.Module, x: Any) -> ShapeTable:
    """Run one forward pass and record every module call with its shapes.

    The forward runs under ``torch.no_grad()`` in eval mode (every module's own training
    flag is restored afterwards); hooks are removed when it returns, also on an exception.
    A module called several times appears once per call, with ``call`` counting them.

    Args:
        model: any ``nn.Module``.
        x: the model's input (passed as ``model(x)``), e.g. a batch [B, C, H, W].

    Returns:
        A :class:`ShapeTable`; ``print(table)`` shows it.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.debug import trace_shapes
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten())
        >>> table = trace_shapes(net, torch.zeros(2, 3, 5, 5))
        >>> [(r.name, r.output_shapes[0]) for r in table]
        [('', (2, 36)), ('0', (2, 4, 3, 3)), ('1', (2, 4, 3, 3)), ('2', (2, 36))]
        >>> print(table)  # doctest: +NORMALIZE_WHITESPACE
        #  layer    type        input    output   dtype    params
        ---------------------------------------------------------
        0  (model)  Sequential  2x3x5x5  2x36     float32     112
        1    0      Conv2d      2x3x5x5  2x4x3x3  float32     112
        2    1      ReLU        2x4x3x3  2x4x3x3  float32       0
        3    2      Flatten     2x4x3x3  2x36     float32       0
        4 calls, 112 parameters
    """
    records: list[ShapeRecord] = []
    stack: list[int] = []
    calls: dict[int, int] = {}
    params: dict[int, int] = {}

    def pre(name: str) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            inputs = [*iter_tensors(args), *iter_tensors(kwargs)]
            key = id(module)
            call = calls.get(key, 0)
            calls[key] = call + 1
            if key not in params:
                params[key] = sum(p.numel() for p in module.parameters())
            records.append(
                ShapeRecord(
                    order=len(records),
                    name=name,
                    type=type(module).__name__,
                    call=call,
                    depth=len(stack),
                    input_shapes=tuple(tuple(t.shape) for t in inputs),
                    input_dtypes=tuple(str(t.dtype).removeprefix("torch.") for t in inputs),
                    output_shapes=None,
                    output_dtypes=None,
                    params=params[key],
                )
            )
            stack.append(len(records) - 1)

        return hook

    def post(module: nn.Module, args: Any, output: Any) -> None:
        index = stack.pop()
        record = records[index]
        outputs = list(iter_tensors(output))
        records[index] = record._replace(
            output_shapes=tuple(tuple(t.shape) for t in outputs),
            output_dtypes=tuple(str(t.dtype).removeprefix("torch.") for t in outputs),
        )

    with HookScope() as hooks, torch.no_grad(), eval_mode(model):
        for name, module in model.named_modules():
            hooks.forward_pre(module, pre(name), with_kwargs=True)
            hooks.forward(module, post)
        model(x)
    return ShapeTable(records, sum(p.numel() for p in model.parameters()))
