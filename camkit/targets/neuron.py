"""Neuron targets: explain one channel or unit of a hidden layer instead of a class score.

A :class:`NeuronTarget` is passed as ``target=`` to any explainer (Saliency, integrated
gradients, guided backprop, Grad-CAM at an earlier layer, the perturbation and region
methods...). For the duration of the explain call camkit binds it to the model
(:func:`bind_target`): a forward hook, scoped by :class:`~camkit.hooks.HookScope`, records
the layer's output at each forward, and the target's score is read from it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, ClassVar, Literal

from torch import Tensor, nn

from ..errors import InvalidTargetError
from ..hooks import HookScope
from ..layers.resolve import resolve_layers

__all__ = ["NeuronTarget", "bind_target"]

Reduce = Literal["mean", "sum", "max"]


class NeuronTarget:
    """The activation of one channel (or one unit) of a layer, as a target.

    The score of sample ``b`` is ``output[b, channel, *position]`` of the layer's output,
    with the dimensions left over reduced by ``reduce``: with ``position=None`` a conv
    channel [h, w] gives its mean (or sum, or max) over positions, as captum's neuron
    methods select a neuron with a tuple index and torchcam-like channel visualisations
    average a channel. For token outputs [B, N, D] dimension 1 is the token.

    The layer's last call in each forward is read. Outside an explainer's call (or when
    the layer did not run) calling the target raises :class:`InvalidTargetError`.

    Args:
        layer: a dotted name of the model's layer, or the module itself.
        channel: the index along dimension 1 of the layer's output.
        position: indices into the remaining dimensions (e.g. ``(y, x)``); ``None``: reduce them.
        reduce: ``"mean"`` (default), ``"sum"`` or ``"max"`` over the dimensions not indexed.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import camkit
        >>> net = nn.Sequential(nn.Conv2d(1, 2, 1, bias=False), nn.ReLU(), nn.Flatten(), nn.Linear(8, 3))
        >>> with torch.no_grad():
        ...     _ = net[0].weight.copy_(torch.tensor([[[[1.0]]], [[[3.0]]]]))
        >>> x = torch.tensor([[[[1.0, 2.0], [0.0, 4.0]]]])
        >>> e = camkit.Saliency(net).explain(x, target=camkit.NeuronTarget("0", 1, position=(1, 1)))
        >>> e.raw.tolist(), e.scores.tolist()
        ([[[[0.0, 0.0], [0.0, 3.0]]]], [12.0])
    """

    takes_model_output: ClassVar[bool] = True

    def __init__(
        self,
        layer: str | nn.Module,
        channel: int,
        position: Sequence[int] | None = None,
        *,
        reduce: Reduce = "mean",
    ) -> None:
        if isinstance(channel, bool) or not isinstance(channel, int):
            raise InvalidTargetError(f"channel must be an int, got {channel!r}")
        if reduce not in ("mean", "sum", "max"):
            raise InvalidTargetError(f"reduce must be 'mean', 'sum' or 'max', got {reduce!r}")
        if position is not None and not all(isinstance(p, int) and not isinstance(p, bool) for p in position):
            raise InvalidTargetError(f"position must be a sequence of ints such as (y, x), got {position!r}")
        self.layer = layer
        self.channel = channel
        self.position = None if position is None else tuple(position)
        self.reduce: Reduce = reduce
        self._local = threading.local()  # the recorded activation, per thread: calls may run concurrently
        self._name = layer if isinstance(layer, str) else type(layer).__name__

    def __repr__(self) -> str:
        return f"NeuronTarget(layer={self._name!r}, channel={self.channel}, position={self.position}, reduce={self.reduce!r})"

    @contextmanager
    def bind_model(self, model: nn.Module) -> Iterator[NeuronTarget]:
        """Record the layer's output during the forwards run inside the block."""
        [(name, module)] = resolve_layers(model, self.layer)
        self._name = name

        local = self._local

        def record(mod: nn.Module, args: Any, output: Any) -> None:
            if not isinstance(output, Tensor):
                raise InvalidTargetError(f"NeuronTarget: layer '{name}' returned {type(output).__name__}, not a tensor")
            local.value = output.clone()  # a later in-place operation (ReLU(inplace=True)) must not change it

        local.depth = getattr(local, "depth", 0) + 1
        try:
            with HookScope() as scope:
                scope.forward(module, record, own_thread=True)
                yield self
        finally:
            local.depth -= 1
            if local.depth == 0:
                local.value = None

    def activation(self) -> Tensor:
        """The layer's output recorded in the current forward (in this thread), with its autograd graph.

        A subclass can score it its own way by overriding ``__call__`` and reading this.

        Raises:
            InvalidTargetError: outside an explainer's call, or when the layer has not run.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from camkit.targets.neuron import NeuronTarget, bind_target
            >>> net = nn.Sequential(nn.Linear(2, 3))
            >>> target = NeuronTarget("0", 0)
            >>> with bind_target(target, net):
            ...     _ = net(torch.ones(1, 2))
            ...     print(list(target.activation().shape))
            [1, 3]
        """
        value: Tensor | None = getattr(self._local, "value", None)
        if value is None:
            raise InvalidTargetError(
                f"{self!r} has no activation of layer '{self._name}': pass it as target= to a camkit explainer, "
                "which records the layer during its forward, and pick a layer the forward runs."
            )
        return value

    def __call__(self, output: Any) -> Tensor:
        value = self.activation()
        if value.dim() < 2 or not -value.shape[1] <= self.channel < value.shape[1]:
            raise InvalidTargetError(
                f"channel {self.channel} is out of range for layer '{self._name}' with output shape {list(value.shape)}"
            )
        unit = value[:, self.channel]
        if self.position is not None:
            if len(self.position) > unit.dim() - 1 or any(
                not -size <= p < size for p, size in zip(self.position, unit.shape[1:])
            ):
                raise InvalidTargetError(
                    f"position {self.position} does not fit layer '{self._name}''s channel shape {list(unit.shape[1:])}"
                )
            index: tuple[slice | int, ...] = (slice(None), *self.position)
            unit = unit[index]
        if unit.dim() == 1:
            return unit
        flat = unit.reshape(unit.shape[0], -1)
        if self.reduce == "sum":
            return flat.sum(dim=1)
        if self.reduce == "max":
            return flat.amax(dim=1)
        return flat.mean(dim=1)


def bind_target(target: object, model: nn.Module) -> AbstractContextManager[Any]:
    """The context in which ``target`` sees ``model``'s layers (a no-op for other targets).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.targets.neuron import NeuronTarget, bind_target
        >>> net = nn.Sequential(nn.Linear(2, 3))
        >>> target = NeuronTarget("0", 2)
        >>> with bind_target(target, net):
        ...     out = net(torch.ones(1, 2))
        ...     print(torch.equal(target(out), out[:, 2]))
        True
    """
    bind = getattr(target, "bind_model", None)
    if bind is None or not callable(bind):
        return nullcontext()
    context: AbstractContextManager[Any] = bind(model)
    return context
