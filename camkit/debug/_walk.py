"""Small helpers shared by the debugging tools: module names, module selection, tensor leaves."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Union

from torch import Tensor, nn

from ..errors import LayerNotFoundError
from ..layers.resolve import resolve_layers

__all__ = ["ModuleSelection", "iter_tensors", "module_names", "select_modules"]

# None: every leaf module; "all": every submodule; otherwise names or modules (see resolve_layers).
ModuleSelection = Union[None, str, nn.Module, Sequence[Union[str, nn.Module]]]


def module_names(model: nn.Module) -> dict[int, str]:
    """Map ``id(module)`` to its dotted name (the first name, for modules registered twice).

    The model itself is named ``""``.
    """
    names: dict[int, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names.setdefault(id(module), name)
    return names


def select_modules(model: nn.Module, layers: ModuleSelection) -> list[tuple[str, nn.Module]]:
    """Resolve a layer selection to ``(dotted name, module)`` pairs.

    ``None`` selects every leaf module (a module without children), ``"all"`` every
    submodule; anything else goes through :func:`camkit.layers.resolve_layers`.
    """
    if layers is None:
        chosen = [(n, m) for n, m in model.named_modules() if n and next(m.children(), None) is None]
        if not chosen and next(model.children(), None) is None:
            chosen = [("", model)]
        return chosen
    if isinstance(layers, str) and layers == "all":
        return [(n, m) for n, m in model.named_modules() if n]
    found = resolve_layers(model, layers)
    if not found:
        raise LayerNotFoundError("no layers selected; pass layer names, modules, None (every leaf) or 'all'")
    return found


def iter_tensors(obj: Any) -> Iterator[Tensor]:
    """Yield the tensors in a nested structure of tuples, lists and dicts, depth first."""
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from iter_tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from iter_tensors(item)
