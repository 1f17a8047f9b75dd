"""``install()``: make ``import captum`` (and every ``captum.x.y``) load camkit's translation.

A meta-path finder placed first on ``sys.meta_path`` answers every module name under ``captum``:

* a module this package has (``captum.attr``, ``captum.metrics``, ``captum.attr.visualization``) is
  that module, shared: ``captum.attr.Saliency is camkit.compat.captum.attr.Saliency``;
* captum's test infrastructure (``captum.testing``: ``BaseTest``, the toy models and reference
  configurations its suite imports), its usage-logging decorators (``captum.log``) and its type
  aliases (``captum._utils.typing``) compute nothing, so they are loaded from the installed original's
  files, when there is one;
* any other path (captum's private modules: ``captum.attr._core.saliency``, ``captum._utils.gradient``)
  is a facade whose names are this package's classes of the same name; a name camkit does not
  provide (a private step of captum's own loops, a method camkit does not compute) raises an
  ``ImportError`` that says so, never a stand-in.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

from .._aliasing import AlreadyImportedError, ModuleLoader, PackageAlias

__all__ = ["AlreadyImportedError", "install", "installed", "uninstall"]

ALIAS = "captum"
HOME = __name__.rsplit(".", 1)[0]
#: captum's paths that compute nothing, loaded from the original's files
INFRASTRUCTURE = ("captum.testing", "captum.log", "captum._utils.typing")
#: captum's paths that are modules of this package
OWN = {"captum": HOME, "captum.attr": f"{HOME}.attr", "captum.metrics": f"{HOME}.metrics",
       "captum.attr.visualization": f"{HOME}.attr.visualization",
       "captum.attr._utils.visualization": f"{HOME}.attr.visualization"}


#: captum's packages that camkit does not compute at all
ABSENT = {
    "concept": "concept attribution (TCAV)",
    "influence": "influence functions (TracIn and the like)",
    "robust": "adversarial robustness tools",
    "module": "stochastic-gate modules",
}


def _original_root() -> Path | None:
    """The installed original's package folder, found without importing it."""
    spec = importlib.machinery.PathFinder.find_spec(ALIAS)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _infrastructure(fullname: str) -> bool:
    return any(fullname == p or fullname.startswith(p + ".") for p in INFRASTRUCTURE)


class _Facade(ModuleType):
    """A private captum path: its names are the translation's classes of the same name, or a clear ImportError."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        from . import names

        value = names.lookup(name)
        if value is None:
            raise ImportError(
                f"camkit.compat.captum does not provide {self.__name__}.{name}: it is a private step of captum's own "
                "implementation or something camkit does not compute (see docs/migration/captum.md); run this "
                "code on the original captum."
            )
        return value


def _module(target: str | None) -> ModuleLoader:
    """A loader of the module ``target`` of this package, or (None) of a facade that serves only names camkit has."""

    def make(spec: importlib.machinery.ModuleSpec) -> ModuleType:
        if target is not None:
            return importlib.import_module(target)
        module = _Facade(spec.name)
        module.__path__ = []  # a package: captum.attr._core.layer.grad_cam may sit under it
        return module

    return ModuleLoader(make)


def _spec(fullname: str) -> importlib.machinery.ModuleSpec | None:
    if fullname in OWN:
        name = OWN[fullname]
        package = importlib.util.find_spec(name).submodule_search_locations is not None  # type: ignore[union-attr]
        return importlib.machinery.ModuleSpec(fullname, _module(name), is_package=package)
    if _infrastructure(fullname):
        return _original_spec(fullname)
    part = fullname.split(".")[1]
    if part in ABSENT:
        raise ImportError(f"{fullname}: camkit does not compute {ABSENT[part]}; run this code on the original captum")
    return importlib.machinery.ModuleSpec(fullname, _module(None), is_package=True)


def _original_spec(fullname: str) -> importlib.machinery.ModuleSpec | None:
    root = _original_root()
    if root is None:
        return None
    where = root.joinpath(*fullname.split(".")[1:])
    if (where / "__init__.py").is_file():
        return importlib.util.spec_from_file_location(fullname, where / "__init__.py", submodule_search_locations=[str(where)])
    if where.with_suffix(".py").is_file():
        return importlib.util.spec_from_file_location(fullname, where.with_suffix(".py"))
    if where.is_dir():  # a folder without __init__.py: a namespace package
        spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
        spec.submodule_search_locations = [str(where)]
        return spec
    return None




def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _FINDER.installed()


def _ours(module: Any) -> bool:
    return isinstance(module, _Facade) or getattr(module, "__name__", "").startswith(HOME)


_FINDER = PackageAlias(ALIAS, HOME, _spec, _ours, foreign=_infrastructure)


def install() -> None:
    """Make ``import captum`` and ``from captum.attr import IntegratedGradients`` load camkit's translation.

    Call it before anything imports captum; calling it twice is harmless.

    Raises:
        AlreadyImportedError: the real captum is imported already (its classes are in use); call
            ``install()`` first thing in the script, before those imports.

    Example:
        >>> import subprocess, sys
        >>> code = ("import camkit.compat.captum as cc; cc.install(); "
        ...         "from captum.attr import Saliency; print(Saliency.__module__)")
        >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
        'camkit.compat.captum.attr._gradient'
    """
    _FINDER.install()


def uninstall() -> None:
    """Undo :func:`install`: the finder is removed and the ``captum`` modules it served are forgotten."""
    _FINDER.uninstall()
