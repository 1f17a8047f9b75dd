"""What one evaluation runs: the methods and controls, their explainer factories, the metrics, the settings.

:func:`make_plan` checks every method once (each fails now, with its own message, not in the loop)
and gives the :class:`Plan` that the run loop (:mod:`camkit.evaluation.run`) follows and the
outputs (:mod:`camkit.evaluation.outputs`) read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from torch import Tensor, nn

from ..errors import InvalidInputError
from ..registry import get_method, list_methods, takes_layer
from .controls import CONTROLS, centre_map, edge_map
from .table import MetricSpec, select_metrics

__all__ = ["Factory", "Plan", "make_plan", "parse_methods"]

Factory = Callable[[nn.Module], Callable[[Tensor, Tensor], Tensor]]
"""``f(model) -> explainer``: an explainer ``e(x, target) -> maps`` for a model."""


class _Fixed:
    """A control "explainer": the same model-free map whatever the model and target."""

    def __init__(self, make: Callable[[Tensor], Tensor]) -> None:
        self.make = make

    def __call__(self, x: Tensor, target: Any = None) -> Tensor:
        return self.make(x)


@dataclass
class Plan:
    """What one evaluation runs: methods (controls last), their explainer factories, metrics, settings."""

    methods: list[str]
    controls: list[str]
    factories: dict[str, Factory]
    metrics: list[MetricSpec]
    region: str | None
    layer: str | None = None
    steps: int = 20
    chunk_size: int = 64
    seed: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


def parse_methods(methods: str | Sequence[str]) -> list[str]:
    """The registry keys of ``methods`` (a list or ``"gradcam,saliency"``), once each, in their order."""
    names = [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods) if m.strip()]
    if not names:
        raise InvalidInputError("--methods is empty; name registry keys such as gradcam,saliency")
    known = set(list_methods())
    unknown = [m for m in names if m not in known]
    if unknown:
        raise InvalidInputError(
            f"unknown method(s) {unknown}; known: {', '.join(sorted(known))} (see camkit.list_methods())"
        )
    return list(dict.fromkeys(names))


def _fixed(make: Callable[[Tensor], Tensor], net: nn.Module) -> Any:
    return _Fixed(make)


def _random_cam(net: nn.Module, *, layer: str | None, seed: int) -> Any:
    return get_method("randomcam")(net, layer=layer, seed=seed)  # type: ignore[call-arg]


def _build(method: str, model: nn.Module, layer: str | None) -> Any:
    """The explainer ``method``; ``layer`` goes to the methods that take one (pixel methods ignore it)."""
    cls = get_method(method)
    if takes_layer(cls):
        return cls(model, layer=layer)  # type: ignore[call-arg]
    return cls(model)


def make_plan(methods: list[str], metrics: Any, have_masks: bool, region: str | None, layer: str | None,
              controls: bool, steps: int, chunk_size: int, seed: int, model: nn.Module) -> Plan:  # fmt: skip
    """The plan of an evaluation: ``methods`` (built once on ``model`` here), the controls, the metrics."""
    factories: dict[str, Factory] = {}
    for m in methods:
        _build(m, model, layer)  # fail now, with the method's own message, not in the loop
        factories[m] = partial(_build, m, layer=layer)
    added = [c for c in CONTROLS if c not in methods] if controls else []
    for c in added:
        if c in ("edge", "centre"):
            factories[c] = partial(_fixed, edge_map if c == "edge" else centre_map)
        else:
            factories[c] = partial(_random_cam, layer=layer, seed=seed)
    chosen = select_metrics(metrics, have_masks=have_masks)
    return Plan([*methods, *added], added, factories, chosen, region if have_masks else None, layer, steps, chunk_size,
                seed)  # fmt: skip
