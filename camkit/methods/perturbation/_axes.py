"""Sizes given per spatial axis (windows, strides, grids, cells): an int for every axis or one per axis.

Private: shared by :mod:`camkit.methods.perturbation.occlusion` and :mod:`camkit.methods.perturbation.regions`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

from ...errors import InvalidInputError

__all__ = ["PerAxis", "check_fits", "check_per_axis", "per_axis"]

#: An int (the same on every spatial axis) or one int per spatial axis.
PerAxis = Union[int, Sequence[int]]

_AXIS_NAMES = {1: ("T",), 2: ("H", "W"), 3: ("D", "H", "W")}


def _positive_ints(name: str, value: PerAxis) -> tuple[int, ...]:
    """``value`` as a tuple of positive ints (one int stays a 1-tuple), checked at construction."""
    parts = (value,) if isinstance(value, int) else tuple(value) if isinstance(value, (tuple, list)) else None
    if not parts or len(parts) > 3 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in parts):
        raise InvalidInputError(
            f"{name} must be a positive int or one positive int per spatial axis (1 to 3 of them), got {value!r}"
        )
    return parts


def check_per_axis(name: str, value: PerAxis | None) -> int | tuple[int, ...] | None:
    """A window, stride or grid as given (``None``, an int or a tuple of ints), checked."""
    if value is None:
        return None
    parts = _positive_ints(name, value)
    return value if isinstance(value, int) else parts


def per_axis(name: str, value: PerAxis, size: Sequence[int]) -> tuple[int, ...]:
    """``value`` spread over the spatial axes of an input of spatial ``size``: an int is used on every
    axis, a sequence must have one entry per axis.

    Example:
        >>> from camkit.methods.perturbation._axes import per_axis
        >>> per_axis("window", 4, (16,)), per_axis("window", (2, 4, 4), (8, 32, 32))
        ((4,), (2, 4, 4))
    """
    parts = _positive_ints(name, value)
    n = len(size)
    if isinstance(value, int):
        return parts * n
    if len(parts) != n:
        axes = ", ".join(_AXIS_NAMES.get(n, ("?",) * n))
        example = ", ".join(str(parts[-1]) for _ in range(n))
        raise InvalidInputError(
            f"{name}={value!r} has {len(parts)} entries, but the input has {n} spatial "
            f"{'axis' if n == 1 else 'axes'} ({axes}) = {list(size)}; pass an int for every axis or one "
            f"entry per axis, e.g. {name}=({example}{',' if n == 1 else ''})"
        )
    return parts


def check_fits(name: str, value: tuple[int, ...], size: Sequence[int]) -> None:
    """Raise :class:`InvalidInputError` unless ``value`` is at most ``size`` on every axis."""
    if any(v > s for v, s in zip(value, size)):
        axes = ", ".join(_AXIS_NAMES.get(len(size), ("?",) * len(size)))
        fit = tuple(min(v, s) for v, s in zip(value, size))
        raise InvalidInputError(
            f"{name} {value} does not fit the input's spatial size ({axes}) = {tuple(size)}; choose at most "
            f"the size on every axis, e.g. {name}={fit}"
        )
