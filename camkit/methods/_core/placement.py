"""Where an explainer runs a ``DataParallel`` / ``DistributedDataParallel`` model, and where results go.

camkit explains the eager module inside these wrappers (see
:func:`camkit.layers.defaults.unwrap_model`). Their users feed them inputs on the CPU (or on
any GPU) and let the wrapper's ``forward`` move them; the module inside does not move
anything. So for a wrapped model an explain call:

1. runs the module on **its own device**, the device of its first parameter (or buffer),
   moving the image ``x`` and every tensor of ``inputs=`` / ``kwargs=`` there;
2. returns the :class:`~camkit.Explanation` (maps, raw maps, targets, scores, ``flat`` and
   tensor extras) on **the caller's device**, the device ``x`` came on.

The batch is not split over ``DataParallel``'s GPUs: that would replicate the module for
every call (hooks would fire in worker threads, where camkit's switch of autograd at the
target layer does not reach), add a scatter and a gather to each call, and give
``DistributedDataParallel`` nothing, as it has one device per process anyway. Maps are the
bare module's maps, bit for bit, whatever the wrapper. Bare modules are left alone: their
inputs must already be on their device, as for a plain ``model(x)``.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from camkit.methods._core.placement import Placement
    >>> Placement.of(nn.Linear(2, 2), torch.zeros(1, 2)) is None  # a bare module: nothing to move
    True
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import torch
from torch import Tensor, nn

from ...explanation import Explanation

__all__ = ["Placement", "module_device"]

_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel)


def module_device(model: nn.Module) -> torch.device | None:
    """The device of ``model``'s first parameter, else first buffer; ``None`` when it has neither."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device
    return None


def _to(tensor: Tensor, device: torch.device) -> Tensor:
    """One tensor to ``device`` (a seam for the tests, which stand in for a second device)."""
    return tensor.to(device)


class Placement:
    """A planned move: inputs to the wrapped module's device, the explanation back to ``home``."""

    def __init__(self, device: torch.device, home: torch.device) -> None:
        self.device = device
        self.home = home

    @classmethod
    def of(cls, wrapped: nn.Module, x: Tensor) -> Placement | None:
        """The move an explain call of ``wrapped`` on ``x`` needs; ``None`` when there is none."""
        if not isinstance(wrapped, _WRAPPERS):
            return None
        device = module_device(wrapped.module)
        if device is None or device == x.device:
            return None
        return cls(device, x.device)

    def inputs(
        self, x: Tensor, inputs: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
    ) -> tuple[Tensor, Sequence[Any] | None, Mapping[str, Any] | None]:
        """``x``, ``inputs`` and ``kwargs`` with every tensor on the module's device.

        A tensor passed twice (``x`` itself inside ``inputs``, say) is moved once and stays
        one object, so the explainer still finds ``x`` among the inputs.
        """
        moved: dict[int, Tensor] = {}

        def move(value: Any) -> Any:
            if isinstance(value, Tensor):
                if id(value) not in moved:
                    moved[id(value)] = _to(value, self.device)
                return moved[id(value)]
            if isinstance(value, (list, tuple)):
                return type(value)(move(v) for v in value)
            if isinstance(value, dict):
                return {k: move(v) for k, v in value.items()}
            return value

        new_x = move(x)
        new_inputs = None if inputs is None else move(inputs)
        new_kwargs = None if kwargs is None else {k: move(v) for k, v in kwargs.items()}
        return new_x, new_inputs, new_kwargs

    def back(self, explanation: Explanation) -> Explanation:
        """The explanation with every tensor (also inside ``raw`` tuples and ``extras``) on the caller's device."""

        def home(value: Any) -> Any:
            if isinstance(value, Tensor):
                return _to(value, self.home)
            if isinstance(value, tuple):
                return tuple(home(v) for v in value)
            return value

        values = {f.name: home(getattr(explanation, f.name)) for f in fields(explanation) if f.name != "extras"}
        return Explanation(**values, extras={k: home(v) for k, v in explanation.extras.items()})
