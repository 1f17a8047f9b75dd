"""pytorch-grad-cam's layer search helpers (read-only ones; the in-place replacers are not carried over)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

__all__ = ["find_layer_predicate_recursive", "find_layer_types_recursive"]


def find_layer_predicate_recursive(model: nn.Module, predicate: Callable[[nn.Module], bool]) -> list[nn.Module]:
    """Every submodule below ``model`` (depth first, the model itself excluded) for which ``predicate`` holds.

    Example:
        >>> from torch import nn
        >>> from camkit.compat.pytorch_grad_cam.utils.find_layers import find_layer_types_recursive
        >>> net = nn.Sequential(nn.Conv2d(1, 1, 1), nn.Sequential(nn.ReLU(), nn.Conv2d(1, 1, 1)))
        >>> len(find_layer_types_recursive(net, [nn.Conv2d]))
        2
    """
    found: list[nn.Module] = []
    for child in model.children():
        if predicate(child):
            found.append(child)
        found.extend(find_layer_predicate_recursive(child, predicate))
    return found


def find_layer_types_recursive(model: nn.Module, layer_types: Sequence[type]) -> list[nn.Module]:
    """Every submodule whose type is one of ``layer_types``."""
    return find_layer_predicate_recursive(model, lambda layer: type(layer) in tuple(layer_types))
