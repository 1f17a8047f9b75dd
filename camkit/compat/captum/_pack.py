"""captum's calling contract onto camkit's: tuples of inputs, additional forward arguments, targets.

camkit explains one input batch ``x`` [B, C, *S]; captum attributes to a tuple of tensors of any
shapes at once, with ``additional_forward_args`` after them and targets that index the model's
output row by a class, a tuple or per example. The translation packs the inputs of one call into a
single batch, runs camkit's explainer on a :class:`Packed` model that unpacks them before calling
the user's model (so every method sees the joint inputs: an integral path moves all of them
together, as in captum), and reads targets as indices into the flattened output row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from ...errors import InvalidInputError, InvalidTargetError

__all__ = ["CaptumInputError", "CaptumTargetError", "Layout", "Packed", "anchored", "as_tuple", "baselines_like", "fit_to", "flat_targets", "forward_args", "per_example"]


class CaptumInputError(InvalidInputError, AssertionError):
    """Inputs or baselines captum refuses (with an ``AssertionError``, which this also is)."""


class CaptumTargetError(InvalidTargetError, AssertionError):
    """A target captum refuses (with an ``AssertionError``, which this also is)."""


def as_tuple(inputs: Any) -> tuple[Any, ...]:
    return tuple(inputs) if isinstance(inputs, tuple) else (inputs,)


def forward_args(additional: Any) -> tuple[Any, ...]:
    """captum's ``additional_forward_args`` as the tuple appended to the inputs."""
    if additional is None:
        return ()
    return tuple(additional) if isinstance(additional, tuple) else (additional,)


@dataclass(frozen=True)
class Layout:
    """How a tuple of inputs [B, *s_i] lies in one packed batch: as it is, or flattened side by side."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    as_is: bool  # one input of rank 3 to 5 goes through unchanged (its spatial axes kept)
    anchor: int = 0  # values after the inputs' that the model never sees (see :func:`anchored`)

    @classmethod
    def of(cls, inputs: tuple[Tensor, ...]) -> Layout:
        if not inputs or not all(isinstance(t, Tensor) for t in inputs):
            raise CaptumInputError("inputs must be a tensor or a tuple of tensors")
        batch = {t.shape[0] if t.dim() else None for t in inputs}
        if None in batch or len(batch) != 1:
            raise CaptumInputError(
                f"every input needs the same first (batch) dimension, got shapes {[list(t.shape) for t in inputs]}"
            )
        as_is = len(inputs) == 1 and 3 <= inputs[0].dim() <= 5 and inputs[0].is_floating_point()
        return cls(tuple(tuple(t.shape[1:]) for t in inputs), tuple(t.dtype for t in inputs), as_is)

    @property
    def sizes(self) -> list[int]:
        return [int(torch.Size(s).numel()) for s in self.shapes]

    def pack(self, tensors: Sequence[Tensor], dtype: torch.dtype | None = None) -> Tensor:
        """[N, *s_i] tensors to one batch: [N, C, *S] as it is, else [N, 1, 1, 1, sum(prod(s_i))]."""
        dtype = dtype or _common_dtype(self.dtypes)
        if self.as_is:
            return tensors[0].detach().to(dtype)
        rows = tensors[0].shape[0]
        flat = [t.detach().reshape(rows, -1).to(dtype) for t in tensors]
        return torch.cat(flat, dim=1).reshape(rows, 1, 1, 1, -1)

    def unpack(self, packed: Tensor, lead: int = 1) -> tuple[Tensor, ...]:
        """A packed batch [*lead, C, *S] back to the inputs' shapes [*lead, *s_i] (``lead`` leading axes)."""
        if self.as_is:
            return (packed,)
        head = packed.shape[:lead]
        flat = packed.reshape(*head, -1)
        flat = flat[..., : flat.shape[-1] - self.anchor]
        parts = flat.split(self.sizes, dim=-1)
        return tuple(p.reshape(*head, *s) for p, s in zip(parts, self.shapes))


def anchored(x: Tensor, layout: Layout) -> tuple[Tensor, Layout]:
    """One packed example [1, 1, 1, 1, N] with a value 1 above its maximum appended, which the model never sees.

    camkit's SmoothGrad scales its noise by each example's value range; captum's noise is absolute.
    An example whose values are all equal (a single number, say) has no range, so an unseen value
    one above them gives it a range of 1, and ``sigma = stdev`` is captum's noise.
    """
    flat = x.reshape(1, -1)
    return torch.cat([flat, flat.max(dim=1, keepdim=True).values + 1], dim=1).reshape(1, 1, 1, 1, -1), replace(
        layout, anchor=layout.anchor + 1
    )


def fit_to(base: Tensor, x: Tensor) -> Tensor:
    """Baselines [N, ...] of a packed input given the anchor values of ``x`` (so the anchor never moves)."""
    extra = x.shape[-1] - base.shape[-1]
    if extra <= 0 or x.dim() != 5:
        return base
    tail = x[..., -extra:].expand(base.shape[0], *x.shape[1:-1], extra)
    return torch.cat([base, tail.to(base.dtype)], dim=-1)


def _common_dtype(dtypes: Sequence[torch.dtype]) -> torch.dtype:
    floats = [d for d in dtypes if d.is_floating_point]
    return torch.float64 if torch.float64 in floats else (floats[0] if floats else torch.float32)


class Packed(nn.Module):
    """The user's model on a packed batch: unpacks the inputs, appends the extra arguments, flattens the output.

    Each extra tensor argument that carries one row per example is repeated to the rows of the
    batch it meets (the translation calls it one example at a time in that case, see
    :func:`per_example`). The output comes back as [N, prod(row)], so that a target is one index.

    With ``whole_batch=True`` (methods that take the gradient of one forward call on exactly the
    batch, as captum's ``Saliency`` and ``LRP``), an output with one row (or none) for a batch of
    N > 1 is one value for the whole batch: it comes back as the first row, the others zero, so the
    gradient of the scores' sum is that output's gradient for every example, as captum's is; the
    module then records ``aggregated = True``.
    """

    def __init__(self, model: Callable[..., Any], layout: Layout, extra: tuple[Any, ...], dtypes: tuple[torch.dtype, ...],
                 whole_batch: bool = False) -> None:
        super().__init__()
        self.inner = model if isinstance(model, nn.Module) else _Callable(model)
        self.layout = layout
        self.extra = extra
        self.dtypes = dtypes
        self.whole_batch = whole_batch
        self.aggregated = False

    def forward(self, packed: Tensor) -> Tensor:
        rows = packed.shape[0]
        parts = [p if p.dtype == d else p.to(d) for p, d in zip(self.layout.unpack(packed), self.dtypes)]
        extra = [_rows(a, rows) for a in self.extra]
        out = self.inner(*parts, *extra)
        if not isinstance(out, Tensor):
            raise InvalidTargetError(f"the model returned {type(out).__name__}; captum's methods need a tensor output")
        if self.whole_batch and (out.dim() == 0 or (out.shape[0] == 1 and rows > 1)):
            self.aggregated = True
            row = out.reshape(1, -1)
            return torch.cat([row, row.detach().new_zeros(rows - 1, row.shape[1])]) if rows > 1 else row
        if out.dim() == 0 or out.shape[0] != rows:
            raise InvalidTargetError(
                f"the model's output {list(out.shape)} does not have one row per example ({rows}); camkit attributes "
                "outputs with a batch dimension only, not a scalar computed over the batch"
            )
        return out.reshape(rows, -1)


class _Callable(nn.Module):
    def __init__(self, func: Callable[..., Any]) -> None:
        super().__init__()
        self.func = func

    def forward(self, *args: Any) -> Any:
        return self.func(*args)


def _rows(arg: Any, rows: int) -> Any:
    if isinstance(arg, Tensor) and arg.dim() > 0 and arg.shape[0] == 1 and rows != 1:
        return arg.expand(rows, *arg.shape[1:])
    return arg


def per_example(extra: tuple[Any, ...], batch: int) -> bool:
    """Whether an extra argument carries one row per example (then each example runs on its own)."""
    return batch > 1 and any(isinstance(a, Tensor) and a.dim() > 0 and a.shape[0] == batch for a in extra)


def example_args(extra: tuple[Any, ...], batch: int, i: int) -> tuple[Any, ...]:
    """Example ``i``'s rows of the per-example extra arguments; the others as they are."""
    return tuple(a[i : i + 1] if isinstance(a, Tensor) and a.dim() > 0 and a.shape[0] == batch else a for a in extra)


def baselines_like(baselines: Any, inputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """captum's ``baselines`` (None, a number, a tensor or a tuple of those) as tensors shaped like the inputs."""
    if baselines is None:
        items: tuple[Any, ...] = (0.0,) * len(inputs)
    elif isinstance(baselines, tuple):
        items = baselines
    else:
        items = (baselines,)
    if len(items) != len(inputs):
        raise CaptumInputError(f"{len(items)} baselines for {len(inputs)} inputs; give one per input")
    out = []
    for base, x in zip(items, inputs):
        if isinstance(base, Tensor):
            try:
                out.append(base.detach().to(x.dtype).expand_as(x))
            except RuntimeError as error:
                raise CaptumInputError(
                    f"baseline of shape {list(base.shape)} does not broadcast to the input {list(x.shape)}"
                ) from error
        elif isinstance(base, (int, float)) and not isinstance(base, bool):
            out.append(torch.full_like(x.detach(), float(base)))
        else:
            raise CaptumInputError(f"baselines must be numbers or tensors, got {type(base).__name__}")
    return tuple(out)


def flat_targets(target: Any, row_shape: Sequence[int], batch: int) -> Tensor:
    """captum's target as a LongTensor [B] of indices into the flattened output row of shape ``row_shape``."""
    size = int(torch.Size(row_shape).numel())
    if target is None:
        if size != 1:
            raise CaptumTargetError(
                f"Target not provided when necessary: the model's output row has {size} values {list(row_shape)}; "
                "pass target= (a class, a tuple index or one per example)"
            )
        return torch.zeros(batch, dtype=torch.long)
    if isinstance(target, Tensor):
        target = target.tolist()
    if isinstance(target, list) and len(target) == 1 and batch != 1:
        target = target[0]
    items = target if isinstance(target, list) else [target] * batch
    if len(items) != batch:
        raise CaptumTargetError(f"{len(items)} targets for {batch} examples; give one or one per example")
    shape = tuple(row_shape) or (1,)
    flat = []
    for item in items:
        index = tuple(item) if isinstance(item, (tuple, list)) else (int(item),)
        if len(index) != len(shape):
            if len(index) == 1 and len(shape) == 1:
                pass
            else:
                raise CaptumTargetError(f"target {item!r} does not index an output row of shape {list(shape)}")
        position = 0
        for i, n in zip(index, shape):
            if not -n <= int(i) < n:
                raise CaptumTargetError(f"target {item!r} is out of range for an output row of shape {list(shape)}")
            position = position * n + int(i) % n
        flat.append(position)
    return torch.tensor(flat, dtype=torch.long)
