"""The names captum's private module paths resolve to after ``install()``: this package's, or none."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["lookup"]

#: where the translation keeps what captum's private modules hold
HOMES = ("attr", "metrics", "_support", "_models", "attr._lime", "attr._influence", "attr._permutation")


def lookup(name: str) -> Any:
    """The translation's object named ``name`` (a class, a function), or ``None`` where camkit has none."""
    for home in HOMES:
        module = importlib.import_module(f"{__package__}.{home}")
        if name in getattr(module, "__all__", ()):
            return getattr(module, name)
    attr = importlib.import_module(f"{__package__}.attr")
    if name in attr.MISSING:
        return attr.missing_class(name)
    return None
