"""One meta-path finder for the compat layers that stand in for a whole package tree.

``camkit.compat.pytorch_grad_cam``, ``camkit.compat.captum`` and ``camkit.compat.quantus`` each answer
every module name under the original's name (``pytorch_grad_cam``, ``captum``, ``quantus``) with a
module of their own. What each serves differs (a module of the same path, a facade, a module built
on the fly, the original's own test infrastructure); installing, refusing when the original is
imported already, and uninstalling do not, and live here.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..errors import CamkitError

__all__ = ["AlreadyImportedError", "ModuleLoader", "PackageAlias"]


class AlreadyImportedError(CamkitError, ImportError):
    """The real package was imported before ``install()``, so modules already hold its classes."""


class PackageAlias(importlib.abc.MetaPathFinder):
    """Answers ``original`` and ``original.*`` with ``spec_for(fullname)`` once installed (first on ``sys.meta_path``).

    Args:
        original: the original package's import name.
        home: the compat package's dotted name (named in the refusal's advice).
        spec_for: the spec of a name under ``original`` (``None``: not served, the next finder looks).
        ours: whether a module in ``sys.modules`` is one this alias served.
        foreign: names under ``original`` loaded from the original's own files on purpose (neither a
            reason to refuse ``install`` nor kept by ``uninstall``).
    """

    def __init__(
        self,
        original: str,
        home: str,
        spec_for: Callable[[str], importlib.machinery.ModuleSpec | None],
        ours: Callable[[Any], bool],
        foreign: Callable[[str], bool] = lambda name: False,
    ) -> None:
        self.original, self.home, self.spec_for, self.ours, self.foreign = original, home, spec_for, ours, foreign

    def covers(self, fullname: str) -> bool:
        """Whether ``fullname`` is the original package or one of its submodules."""
        return fullname == self.original or fullname.startswith(self.original + ".")

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return self.spec_for(fullname) if self.covers(fullname) else None

    def installed(self) -> bool:
        return self in sys.meta_path

    def install(self) -> None:
        if self.installed():
            return
        real = sorted(
            name for name in sys.modules
            if self.covers(name) and not self.ours(sys.modules[name]) and not self.foreign(name)
        )  # fmt: skip
        if real:
            raise AlreadyImportedError(
                f"{self.original} is already imported from {getattr(sys.modules[real[0]], '__file__', '?')} "
                f"({len(real)} module(s)), so code would mix its classes with camkit's; call "
                f"{self.home}.install() before the first 'import {self.original}'."
            )
        sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for name in [n for n in sys.modules if self.covers(n)]:
            if self.ours(sys.modules[name]) or self.foreign(name):
                del sys.modules[name]


class ModuleLoader(importlib.abc.Loader):
    """A loader whose module is made whole by ``make(spec)`` (an existing module, or one built for the name)."""

    def __init__(self, make: Callable[[importlib.machinery.ModuleSpec], ModuleType]) -> None:
        self.make = make

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.make(spec)

    def exec_module(self, module: ModuleType) -> None:
        return None  # made complete by create_module
