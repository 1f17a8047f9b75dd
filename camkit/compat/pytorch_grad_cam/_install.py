"""``install()``: make ``import pytorch_grad_cam`` (and its submodules) load this package instead.

A meta-path finder placed first on ``sys.meta_path`` answers every module name under
``pytorch_grad_cam`` with the module of the same path under ``camkit.compat.pytorch_grad_cam``;
the module object is shared, so ``pytorch_grad_cam.GradCAM is camkit.compat.pytorch_grad_cam.GradCAM``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
from typing import Any

from .._aliasing import AlreadyImportedError, ModuleLoader, PackageAlias

__all__ = ["AlreadyImportedError", "install", "installed", "uninstall"]

ALIAS = "pytorch_grad_cam"
HOME = __name__.rsplit(".", 1)[0]


def _target(fullname: str) -> str | None:
    if fullname == ALIAS:
        return HOME
    if fullname.startswith(ALIAS + "."):
        return HOME + fullname[len(ALIAS) :]
    return None


def _spec(fullname: str) -> importlib.machinery.ModuleSpec | None:
    name = _target(fullname)
    if name is None or importlib.util.find_spec(name) is None:
        return None
    package = name == HOME or importlib.util.find_spec(name).submodule_search_locations is not None  # type: ignore[union-attr]
    # the camkit module ran when it was imported: the alias shares the module object
    return importlib.machinery.ModuleSpec(fullname, ModuleLoader(lambda spec: importlib.import_module(name)), is_package=package)


def _ours(module: Any) -> bool:
    return getattr(module, "__name__", "").startswith(HOME)


_FINDER = PackageAlias(ALIAS, HOME, _spec, _ours)


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _FINDER.installed()


def install() -> None:
    """Make ``import pytorch_grad_cam`` and ``from pytorch_grad_cam.x import y`` load camkit's translation.

    Call it before anything imports ``pytorch_grad_cam``; calling it twice is harmless.

    Raises:
        AlreadyImportedError: the real package is imported already (its classes are in use);
            call ``install()`` first thing in the script, before those imports.

    Example:
        >>> import subprocess, sys
        >>> code = ("import camkit.compat.pytorch_grad_cam as pgc; pgc.install(); "
        ...         "from pytorch_grad_cam import GradCAM; print(GradCAM.__module__)")
        >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
        'camkit.compat.pytorch_grad_cam._cams'
    """
    _FINDER.install()


def uninstall() -> None:
    """Undo :func:`install`: the finder is removed and the ``pytorch_grad_cam`` aliases are forgotten."""
    _FINDER.uninstall()
