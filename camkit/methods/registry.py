"""The method registry: lower-case keys to explainer classes (each method registers itself on import)."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, NamedTuple, TypeVar, overload

from ..errors import UnknownMethodError

if TYPE_CHECKING:
    from ._core.explainer import Explainer

__all__ = ["MethodInfo", "get_method", "list_methods", "register_method", "takes_layer"]

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


class MethodInfo(NamedTuple):
    """One row of ``camkit.list_methods(details=True)``.

    Attributes:
        key: the registry key.
        name: the class name.
        family: ``"CAM (gradient)"``, ``"CAM (forward only)"``, ``"CAM"``, ``"gradient attribution"``,
            ``"perturbation"`` or ``"attribution"``, read from the class (its ``family``
            attribute when it sets one).
        cost: the passes one call costs (the class's ``cost``).
        use_when: when to use it, one sentence (the class's ``use_when``).
    """

    key: str
    name: str
    family: str
    cost: str
    use_when: str


def _family(cls: type[Explainer]) -> str:
    # Each base class states its kind (methods._core: explainer, cam_base, forward; methods.attribution.pixel).
    return cls.family or ("attribution" if cls.needs_grad else "perturbation")


@overload
def list_methods(details: Literal[False] = False) -> list[str]: ...


@overload
def list_methods(details: Literal[True]) -> list[MethodInfo]: ...


@overload
def list_methods(details: bool) -> list[str] | list[MethodInfo]: ...


def list_methods(details: bool = False) -> list[str] | list[MethodInfo]:
    """The registry keys of every method, sorted; with ``details=True`` one :class:`MethodInfo` row per key.

    Example:
        >>> import camkit
        >>> "gradcam" in camkit.list_methods()
        True
        >>> row = {r.key: r for r in camkit.list_methods(details=True)}["gradcam"]
        >>> row.name, row.family, row.cost
        ('GradCAM', 'CAM (gradient)', '1 forward + 1 backward through the layers after the target layer')
    """
    keys = sorted(_METHODS)
    if not details:
        return keys
    return [
        MethodInfo(key, _METHODS[key].__name__, _family(_METHODS[key]), _METHODS[key].cost, _METHODS[key].use_when)
        for key in keys
    ]


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


def takes_layer(method: str | type[Explainer]) -> bool:
    """Whether a method takes a ``layer`` (CAMs) or works on the input pixels; ``method``: a registry key or a class.

    Read from the class's constructor: a ``layer`` parameter there means the method takes one.

    Example:
        >>> import camkit
        >>> from camkit.registry import takes_layer
        >>> takes_layer("gradcam"), takes_layer("saliency"), takes_layer(camkit.GradCAM)
        (True, False, True)
    """
    cls = get_method(method) if isinstance(method, str) else method
    return "layer" in inspect.signature(cls.__init__).parameters
