"""``install()``: make ``import pytorch_grad_cam`` (and its submodules) load this package instead.

A meta-path finder placed first on ``sys.meta_path`` answers every module name under
``pytorch_grad_cam`` with the module of the same path under ``camkit.compat.pytorch_grad_cam``;
the module object is shared, so ``pytorch_grad_cam.GradCAM is camkit.compat.pytorch_grad_cam.GradCAM``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

from ...errors import CamkitError

__all__ = ["AlreadyImportedError", "install", "installed", "uninstall"]

ALIAS = "pytorch_grad_cam"
HOME = __name__.rsplit(".", 1)[0]


class AlreadyImportedError(CamkitError, ImportError):
    """The real package was imported before :func:`install`, so modules already hold its classes."""


def _target(fullname: str) -> str | None:
    if fullname == ALIAS:
        return HOME
    if fullname.startswith(ALIAS + "."):
        return HOME + fullname[len(ALIAS) :]
    return None


class _Loader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        return None  # the camkit module ran when it was imported


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        name = _target(fullname)
        if name is None or importlib.util.find_spec(name) is None:
            return None
        package = name == HOME or importlib.util.find_spec(name).submodule_search_locations is not None  # type: ignore[union-attr]
        return importlib.machinery.ModuleSpec(fullname, _Loader(name), is_package=package)


_FINDER = _Finder()


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _FINDER in sys.meta_path


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
    if installed():
        return
    real = [name for name in sys.modules if _target(name) is not None and not _ours(sys.modules[name])]
    if real:
        raise AlreadyImportedError(
            f"pytorch_grad_cam is already imported from {getattr(sys.modules[real[0]], '__file__', '?')} "
            f"({len(real)} module(s)), so scripts would mix its classes with camkit's; call "
            "camkit.compat.pytorch_grad_cam.install() before the first 'import pytorch_grad_cam'."
        )
    sys.meta_path.insert(0, _FINDER)


def _ours(module: Any) -> bool:
    return getattr(module, "__name__", "").startswith(HOME)


def uninstall() -> None:
    """Undo :func:`install`: the finder is removed and the ``pytorch_grad_cam`` aliases are forgotten."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if _target(n) is not None and _ours(sys.modules[n])]:
        del sys.modules[name]
