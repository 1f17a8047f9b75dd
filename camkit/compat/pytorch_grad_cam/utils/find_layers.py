"""pytorch-grad-cam's layer helpers: the searches, and the replacers that change the model the caller passes.

camkit's explainers never replace modules; the replacers are here for scripts that call them
on their own model (the original's ``GuidedBackpropReLUModel`` and ``AblationCAM`` used them
internally; camkit's do not).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

__all__ = [
    "find_layer_predicate_recursive",
    "find_layer_types_recursive",
    "replace_all_layer_type_recursive",
    "replace_layer_recursive",
]


def replace_layer_recursive(model: nn.Module, old_layer: nn.Module, new_layer: nn.Module) -> bool:
    """Put ``new_layer`` in place of the first submodule that compares equal to ``old_layer``; whether one was found.

    Changes ``model`` in place, as the original.

    Example:
        >>> from torch import nn
        >>> from camkit.compat.pytorch_grad_cam.utils.find_layers import replace_layer_recursive
        >>> net = nn.Sequential(nn.Conv2d(1, 1, 1), nn.Sequential(nn.ReLU()))
        >>> replace_layer_recursive(net, net[1][0], nn.Tanh()), type(net[1][0]).__name__
        (True, 'Tanh')
    """
    for name, layer in model._modules.items():
        if layer == old_layer:
            model._modules[name] = new_layer
            return True
        if layer is not None and replace_layer_recursive(layer, old_layer, new_layer):
            return True
    return False


def replace_all_layer_type_recursive(model: nn.Module, old_layer_type: type, new_layer: nn.Module) -> None:
    """Put ``new_layer`` (the same instance) in place of every submodule of type ``old_layer_type``, in place.

    Example:
        >>> from torch import nn
        >>> from camkit.compat.pytorch_grad_cam.utils.find_layers import replace_all_layer_type_recursive
        >>> net = nn.Sequential(nn.ReLU(), nn.Sequential(nn.ReLU()))
        >>> replace_all_layer_type_recursive(net, nn.ReLU, nn.Tanh())
        >>> [type(m).__name__ for m in net.modules()]
        ['Sequential', 'Tanh', 'Sequential']
    """
    for name, layer in model._modules.items():
        if isinstance(layer, old_layer_type):
            model._modules[name] = new_layer
        elif layer is not None:
            replace_all_layer_type_recursive(layer, old_layer_type, new_layer)


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
