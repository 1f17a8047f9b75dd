"""Randomising a model's weights, layer after layer, on copies of the model.

Private: the one randomisation loop behind :func:`camkit.metrics.randomization_check` and the
MPRT family of :mod:`camkit.metrics.randomisation`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import LayerNotFoundError
from ..hooks import HookScope
from ..targets.classes import OutputSelector, select_output

__all__ = [
    "ExplainerFactory",
    "Randomizer",
    "call_order",
    "check_module_names",
    "randomise_parameters",
    "randomised_models",
]

ExplainerFactory = Callable[[nn.Module], Callable[..., Any]]
Randomizer = Callable[[nn.Module, torch.Generator], None]


def call_order(model: nn.Module, x: Tensor, output: OutputSelector) -> list[str]:
    """Names of the modules owning parameters directly, in the order the forward first calls them."""
    owners = {m: name for name, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))}
    seen: dict[str, None] = {}
    with HookScope() as hooks:
        for module, name in owners.items():
            hooks.forward(module, lambda m, i, o, name=name: seen.setdefault(name, None))
        select_output(model(x), output)
    return list(seen)


def check_module_names(model: nn.Module, names: Iterable[str]) -> None:
    """Raise :class:`~camkit.errors.LayerNotFoundError` for the first name that is not a module of ``model``."""
    modules = dict(model.named_modules())
    for name in names:
        if name not in modules:
            raise LayerNotFoundError(f"no module named {name!r} in the model; see camkit.list_layers(model)")


def randomise_parameters(module: nn.Module, generator: torch.Generator) -> None:
    """Re-draw every parameter under ``module`` (in place, on the copy) from a seeded generator."""
    for name, param in module.named_parameters():
        with torch.no_grad():
            if param.dim() >= 2:
                fan_in = param[0].numel()
                bound = 1.0 / fan_in**0.5
                fresh = torch.empty(param.shape, dtype=torch.float64).uniform_(-bound, bound, generator=generator)
            elif name.endswith("weight"):  # norm-layer scales
                fresh = torch.empty(param.shape, dtype=torch.float64).uniform_(0.5, 1.5, generator=generator)
            else:
                fresh = torch.empty(param.shape, dtype=torch.float64).uniform_(-0.1, 0.1, generator=generator)
            param.copy_(fresh.to(param.dtype))


def randomised_models(
    base: nn.Module,
    names: list[str],
    order: str,
    randomize: Randomizer,
    generator: torch.Generator,
    start: nn.Module | None = None,
) -> Iterator[tuple[str, nn.Module]]:
    """The copy after each step: cascading (one more module each step) or independent (one module).

    The cascade starts from ``start`` (a copy of ``base``; ``None``: a fresh deep copy); the
    independent order takes a fresh copy of ``base`` at every step. Each step is randomised only
    when the caller asks for it, so the generator's draws follow the steps.
    """
    work = start if start is not None else copy.deepcopy(base)
    for name in names:
        if order == "independent":
            work = copy.deepcopy(base)
        randomize(dict(work.named_modules())[name], generator)
        yield name, work
