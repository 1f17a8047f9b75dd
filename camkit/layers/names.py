"""The model's layers by name: listing them, and finding the module a name or a module stands for."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Union

import torch
from torch import Tensor, nn

from .._internal.state import eval_mode
from ..errors import LayerNotFoundError
from ..hooks import HookScope

__all__ = ["LayerInfo", "LayerSpec", "list_layers"]

LayerSpec = Union[str, nn.Module, Sequence[Union[str, nn.Module]], None]


class LayerInfo(NamedTuple):
    """One module call seen in a forward pass."""

    name: str
    type: str
    output_shape: tuple[int, ...] | None

    def __str__(self) -> str:
        shape = "x".join(map(str, self.output_shape)) if self.output_shape is not None else "-"
        return f"{self.name:<40} {self.type:<24} {shape}"


def _names(model: nn.Module) -> dict[str, nn.Module]:
    return {name: module for name, module in model.named_modules() if name}


_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def _strip_wrappers(name: str, names: dict[str, nn.Module]) -> str | None:
    # DataParallel / DistributedDataParallel add "module.", torch.compile adds "_orig_mod.":
    # a name written for the wrapper resolves on the bare model and the other way round.
    if name in names:
        return name
    for prefix in _WRAPPER_PREFIXES:
        if prefix + name in names:
            return prefix + name
        if name.startswith(prefix):
            found = _strip_wrappers(name[len(prefix) :], names)
            if found is not None:
                return found
    return None


def _resolve_one(model: nn.Module, spec: str | nn.Module, names: dict[str, nn.Module]) -> tuple[str, nn.Module]:
    if isinstance(spec, nn.Module):
        for name, module in names.items():
            if module is spec:
                return name, module
        if spec is model:
            raise LayerNotFoundError(
                "the target layer is the whole model; pass one of its submodules "
                "(see camkit.list_layers(model, x))."
            )
        raise LayerNotFoundError(
            f"the module {type(spec).__name__} passed as layer is not part of the model; pass a "
            "submodule of the model you explain, or its dotted name."
        )
    if not isinstance(spec, str):
        raise TypeError(
            f"each layer must be a dotted name (str) or a module of the model, got {type(spec).__name__} {spec!r}"
        )
    found = _strip_wrappers(spec, names)
    if found is None:
        close = difflib.get_close_matches(spec, list(names), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise LayerNotFoundError(
            f"no layer '{spec}' in {type(model).__name__}{hint} See camkit.list_layers(model, x)."
        )
    return found, names[found]


def _trace(
    model: nn.Module, x: Tensor, forward: Callable[[Tensor], Any] | None = None
) -> list[tuple[str, nn.Module, Tensor | object]]:
    names = _names(model)
    seen: list[tuple[str, nn.Module, Tensor | object]] = []
    with HookScope() as hooks, torch.no_grad(), eval_mode(model):
        for name, module in names.items():
            hooks.forward(module, lambda m, i, o, name=name: seen.append((name, m, o)), own_thread=True)
        if forward is None:
            model(x)
        else:
            forward(x)
    return seen


def _shape(output: object) -> tuple[int, ...] | None:
    return tuple(output.shape) if isinstance(output, Tensor) else None


def list_layers(model: nn.Module, example_input: Tensor | None = None) -> list[LayerInfo]:
    """List the model's named modules, with output shapes when an example input is given.

    With an input, modules appear in the order their calls finish in a forward pass
    (a module called twice appears twice); modules that did not run are left out.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit import list_layers
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        >>> [(i.name, i.output_shape) for i in list_layers(net, torch.zeros(1, 3, 5, 5))]
        [('0', (1, 4, 3, 3)), ('1', (1, 4, 3, 3))]
    """
    if example_input is None:
        return [LayerInfo(n, type(m).__name__, None) for n, m in _names(model).items()]
    return [LayerInfo(n, type(m).__name__, _shape(o)) for n, m, o in _trace(model, example_input)]
