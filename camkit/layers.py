"""Find target layers: by dotted name, by module, or automatically."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Union

import torch
from torch import Tensor, nn

from ._state import eval_mode
from .architectures import default_layer
from .errors import InvalidInputError, LayerNotFoundError
from .hooks import HookScope

__all__ = ["LayerInfo", "LayerSpec", "auto_layer", "list_layers", "resolve_layers"]

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
        raise TypeError(f"layer must be a name, a module or a list of them, got {type(spec).__name__}")
    found = _strip_wrappers(spec, names)
    if found is None:
        close = difflib.get_close_matches(spec, list(names), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise LayerNotFoundError(
            f"no layer '{spec}' in {type(model).__name__}{hint} See camkit.list_layers(model, x)."
        )
    return found, names[found]


def resolve_layers(
    model: nn.Module,
    layer: LayerSpec,
    example: Tensor | None = None,
    *,
    forward: Callable[[Tensor], Any] | None = None,
) -> list[tuple[str, nn.Module]]:
    """Turn a layer argument into ``(dotted name, module)`` pairs.

    Names written for a ``DataParallel`` (``module.``) or ``torch.compile`` (``_orig_mod.``)
    wrapper resolve on the bare model and the other way round.

    Args:
        model: the model to explain.
        layer: a dotted name from ``model.named_modules()``, a module, a list of either, or
            ``None``: the architecture's default layer for known torchvision families (see
            :func:`camkit.architectures.default_layer`), else :func:`auto_layer` (which
            needs ``example``).
        example: an input batch, used only when ``layer`` is ``None``.
        forward: how to run the model on ``example`` for the dry run (default ``model(example)``).

    Example:
        >>> from torch import nn
        >>> from camkit.layers import resolve_layers
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        >>> resolve_layers(net, "0")[0][0]
        '0'
    """
    names = _names(model)
    if layer is None:
        known = default_layer(model)
        found = None if known is None else _strip_wrappers(known, names)
        if found is not None:
            return [(found, names[found])]
        if example is None:
            raise InvalidInputError("layer=None needs an example input to find a layer automatically")
        return [auto_layer(model, example, forward=forward)]
    specs = [layer] if isinstance(layer, (str, nn.Module)) else list(layer)
    if not specs:
        raise LayerNotFoundError("layer is an empty list; give at least one layer")
    resolved = [_resolve_one(model, spec, names) for spec in specs]
    seen = set()
    for name, _ in resolved:
        if name in seen:
            raise LayerNotFoundError(f"layer '{name}' is listed twice")
        seen.add(name)
    return resolved


def _trace(
    model: nn.Module, x: Tensor, forward: Callable[[Tensor], Any] | None = None
) -> list[tuple[str, nn.Module, Tensor | object]]:
    names = _names(model)
    seen: list[tuple[str, nn.Module, Tensor | object]] = []
    with HookScope() as hooks, torch.no_grad(), eval_mode(model):
        for name, module in names.items():
            hooks.forward(module, lambda m, i, o, name=name: seen.append((name, m, o)))
        if forward is None:
            model(x)
        else:
            forward(x)
    return seen


def _shape(output: object) -> tuple[int, ...] | None:
    return tuple(output.shape) if isinstance(output, Tensor) else None


def auto_layer(
    model: nn.Module, x: Tensor, *, forward: Callable[[Tensor], Any] | None = None
) -> tuple[str, nn.Module]:
    """Pick a CAM layer by a dry run: the last module whose output is 4-D with a spatial size above 1x1.

    The dry run uses the first sample only (the whole batch when ``forward`` is given, as
    the other inputs of a multi-input model match the batch), under ``torch.no_grad()``
    and in eval mode. If no output has more than one spatial position, the last 4-D output
    is used. Known torchvision architectures have better defaults; see
    :func:`camkit.architectures.default_layer`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.layers import auto_layer
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        >>> auto_layer(net, torch.zeros(1, 3, 8, 8))[0]
        '1'
    """
    calls = _trace(model, x, forward) if forward is not None else _trace(model, x[:1])
    four_d = [(n, m, o) for n, m, o in calls if isinstance(o, Tensor) and o.dim() == 4]
    spatial = [(n, m) for n, m, o in four_d if o.shape[-1] * o.shape[-2] > 1]
    if spatial:
        return spatial[-1]
    if four_d:
        return four_d[-1][0], four_d[-1][1]
    raise LayerNotFoundError(
        f"could not find a layer with a 4-D [B, C, H, W] output in {type(model).__name__}; "
        "pass layer= explicitly (see camkit.list_layers(model, x))."
    )


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
