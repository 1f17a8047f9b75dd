"""Where captum's layer methods read a layer: its output or its input, one tensor or several.

camkit's layer explainers attribute to one tensor, a module's output. captum's also attribute to a
module's input (``attribute_to_layer_input=True``) and to modules that take or return several
tensors. :class:`Route` sends what captum reads through an identity module, the *probe*, added to
the model camkit explains: camkit's explainer then attributes to the probe's output, which is
exactly that tensor (or, for several tensors, all of them flattened side by side, so that a path
method moves them together, as captum does). Nothing is computed here but the routing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from ....hooks import HookScope
from .._pack import as_tuple, forward_args
from ._base import NotComputedError

__all__ = ["Route"]


class Route:
    """A layer's output or input, routed through :attr:`probe` while :meth:`active`.

    Args:
        layer: the user's module.
        to_input: read the module's positional inputs instead of its output.
    """

    def __init__(self, layer: nn.Module, to_input: bool) -> None:
        self.layer = layer
        self.to_input = to_input
        self.probe = nn.Identity()
        #: the routed tensor (None: all tensors, flattened side by side; i: the i-th only)
        self.element: int | None = None
        self.shapes: list[tuple[int, ...]] = []  # each tensor's shape, batch included, from :meth:`survey`
        self.dtypes: list[torch.dtype] = []  # and its dtype
        self.several = False  # the layer takes or returns a tuple (captum then returns a tuple)

    def _through(self, values: tuple[Any, ...]) -> tuple[Any, ...]:
        where = [i for i, v in enumerate(values) if isinstance(v, Tensor)]
        if not where:
            raise NotComputedError(f"the layer's {'input' if self.to_input else 'output'} holds no tensor to attribute to")
        chosen = where if self.element is None else [where[self.element]]
        tensors = [values[i] for i in chosen]
        if len(tensors) == 1:
            routed = [self.probe(tensors[0])]
        else:
            rows = tensors[0].shape[0]
            flat = self.probe(torch.cat([t.reshape(rows, -1) for t in tensors], dim=1))
            sizes = [t[0].numel() for t in tensors]
            routed = [p.reshape(t.shape) for p, t in zip(flat.split(sizes, dim=1), tensors)]
        out = list(values)
        for i, value in zip(chosen, routed):
            out[i] = value
        return tuple(out)

    @contextmanager
    def active(self) -> Iterator[Route]:
        """Route the layer's tensors through the probe in the forwards run inside the block."""

        def before(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            return self._through(args)

        def after(module: nn.Module, args: Any, output: Any) -> Any:
            if isinstance(output, Tensor):
                return self._through((output,))[0]
            if isinstance(output, (tuple, list)):
                return type(output)(self._through(tuple(output)))
            raise NotComputedError(f"the layer returned {type(output).__name__}; camkit attributes to tensors")

        with HookScope() as scope:
            if self.to_input:
                scope.forward_pre(self.layer, before)
            else:
                scope.forward(self.layer, after)
            yield self

    def survey(self, forward_func: Any, inputs: Any, additional_forward_args: Any) -> int:
        """Run one forward without autograd and record the tensors' shapes; how many tensors there are."""
        seen: list[Any] = []

        def record(module: nn.Module, args: Any, output: Any) -> None:
            seen.append(args if self.to_input else output)

        with torch.no_grad(), HookScope() as scope:
            scope.forward(self.layer, record)
            forward_func(*as_tuple(inputs), *forward_args(additional_forward_args))
        if not seen:
            raise NotComputedError("the layer did not run in the forward pass")
        value = seen[-1]
        self.several = not isinstance(value, Tensor) and not (self.to_input and len(value) == 1)
        tensors = [t for t in as_tuple(tuple(value) if isinstance(value, list) else value) if isinstance(t, Tensor)]
        self.shapes = [tuple(t.shape) for t in tensors]
        self.dtypes = [t.dtype for t in tensors]
        return len(self.shapes)

    def split(self, raw: Tensor, dtype: torch.dtype) -> Any:
        """camkit's attribution to the probe [B, ...] as captum returns it: a tensor, or a tuple for several.

        The parts come in ``dtype`` (the inputs'), or in the layer tensor's own where that is a
        floating type and ``dtype`` is not (an embedding of integer indices).
        """
        rows = raw.shape[0]
        if not dtype.is_floating_point and self.dtypes:
            own = self.dtypes if self.element is None else [self.dtypes[self.element]]
            dtype = next((d for d in own if d.is_floating_point), raw.dtype)
        shapes = self.shapes if self.element is None else [self.shapes[self.element]]
        if len(shapes) == 1:
            parts: tuple[Tensor, ...] = (raw.reshape(rows, *shapes[0][1:]).to(dtype),)
        else:
            sizes = [int(torch.Size(s[1:]).numel()) for s in shapes]
            pieces = raw.reshape(rows, -1).split(sizes, dim=1)
            parts = tuple(p.reshape(rows, *s[1:]).to(dtype) for p, s in zip(pieces, shapes))
        return parts if self.several and self.element is None else parts[0]
