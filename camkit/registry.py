"""The method registry: lower-case keys to explainer classes."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from .errors import UnknownMethodError

if TYPE_CHECKING:
    from .methods.base import Explainer

__all__ = ["get_method", "list_methods", "register_method"]

_METHODS: dict[str, type[Explainer]] = {}
T = TypeVar("T", bound="type[Explainer]")


def register_method(key: str) -> Callable[[T], T]:
    """Class decorator that registers an explainer under a lower-case key.

    The key becomes the class's ``key`` attribute and the name :func:`get_method`, the CLI
    (``--method``) and :class:`~camkit.Explanation` ``.method`` use. A new method also needs an
    entry in ``tests/factories.py`` (see CONTRIBUTING.md). Keys must be lower-case and unused.

    Example:
        >>> import camkit
        >>> from camkit.registry import register_method
        >>> camkit.get_method("gradcam").key
        'gradcam'
        >>> try:
        ...     @register_method("gradcam")
        ...     class Again(camkit.GradCAM):
        ...         pass
        ... except ValueError as err:
        ...     print(err)
        method key 'gradcam' must be lower-case and unused
    """

    def decorate(cls: T) -> T:
        if key != key.lower() or key in _METHODS:
            raise ValueError(f"method key {key!r} must be lower-case and unused")
        cls.key = key
        _METHODS[key] = cls
        return cls

    return decorate


def list_methods() -> list[str]:
    """The registry keys of every method, sorted.

    Example:
        >>> import camkit
        >>> "gradcam" in camkit.list_methods()
        True
    """
    return sorted(_METHODS)


def get_method(key: str) -> type[Explainer]:
    """The explainer class registered under ``key`` (case-insensitive).

    Example:
        >>> import camkit
        >>> camkit.get_method("gradcam++").__name__
        'GradCAMPlusPlus'
    """
    found = _METHODS.get(key.lower())
    if found is None:
        close = difflib.get_close_matches(key.lower(), list(_METHODS), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownMethodError(f"no method '{key}'{hint} Known methods: {', '.join(list_methods())}")
    return found
