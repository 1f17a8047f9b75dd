"""``install()``: make ``import quantus`` (and Quantus's module paths) load camkit's translation.

A meta-path finder placed first on ``sys.meta_path`` answers every module name under
``quantus``. Quantus's paths map onto this package as follows:

* ``quantus`` is :mod:`camkit.compat.quantus` itself (the metric classes, ``evaluate``);
* ``quantus.metrics`` and its families (``quantus.metrics.faithfulness``, ...) are modules made
  at import time that hold this package's classes of that family, as Quantus groups them;
* ``quantus.evaluation`` is ``evaluate``'s module, ``quantus.functions.<name>`` the module of the
  same name under ``camkit.compat.quantus.functions`` where camkit has one, and
  ``quantus.helpers.model.model_interface`` holds the ``ModelInterface`` type and
  ``quantus.helpers.model.pytorch_model`` camkit's ``PyTorchModel``;
* ``quantus.helpers.utils`` holds camkit's index and baseline helpers (``expand_indices``...);
* any other path under ``quantus`` (``quantus.helpers.model.tf_model``,
  the model architectures of ``quantus.helpers.model.models``...) imports, but every name read
  from it (or any other name of ``quantus.helpers.utils``) raises :class:`NotTranslatedError`, which
  names the missing part: never a silent stand-in.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
from types import ModuleType
from typing import Any

from ...errors import CamkitError
from .._aliasing import AlreadyImportedError, ModuleLoader, PackageAlias

__all__ = ["AlreadyImportedError", "NotTranslatedError", "install", "installed", "uninstall"]

ALIAS = "quantus"
HOME = __name__.rsplit(".", 1)[0]

#: Quantus's metric families and the classes each holds (Quantus 0.6.0's ``quantus.metrics.<family>``)
FAMILIES: dict[str, tuple[str, ...]] = {
    "axiomatic": ("Completeness", "InputInvariance", "NonSensitivity"),
    "complexity": ("Complexity", "EffectiveComplexity", "Sparseness"),
    "faithfulness": (
        "FaithfulnessCorrelation", "FaithfulnessEstimate", "Infidelity", "IROF", "Monotonicity",
        "MonotonicityCorrelation", "PixelFlipping", "RegionPerturbation", "ROAD", "Selectivity", "SensitivityN",
        "Sufficiency",
    ),
    "localisation": (
        "AttributionLocalisation", "AUC", "Focus", "PointingGame", "RelevanceMassAccuracy",
        "RelevanceRankAccuracy", "TopKIntersection",
    ),
    "randomisation": ("EfficientMPRT", "MPRT", "RandomLogit", "SmoothMPRT"),
    "robustness": (
        "AvgSensitivity", "Consistency", "Continuity", "LocalLipschitzEstimate", "MaxSensitivity",
        "RelativeInputStability", "RelativeOutputStability", "RelativeRepresentationStability",
    ),
}  # fmt: skip

#: Quantus module paths served by a module of this package (path under ``quantus`` -> module under HOME)
MODULES = {
    "evaluation": "_evaluate",
    "functions": "functions",
    "functions.similarity_func": "functions.similarity_func",
    "functions.normalise_func": "functions.normalise_func",
    "functions.norm_func": "functions.norm_func",
    "functions.loss_func": "functions.loss_func",
    "functions.explanation_func": "functions.explanation_func",
    "functions.perturb_func": "functions.perturb_func",
    "functions.discretise_func": "functions.discretise_func",
    "functions.complexity_func": "functions.complexity_func",
    "functions.n_bins_func": "functions.n_bins_func",
    "functions.mosaic_func": "functions.mosaic_func",
    "helpers.model.model_interface": "functions.model_interface",
    "helpers.model.pytorch_model": "functions.pytorch_model",
}

#: Quantus modules of which camkit translates some names (path under ``quantus`` -> module under HOME):
#: those names are camkit's, every other name read from the module raises :class:`NotTranslatedError`
PARTIAL = {"helpers.utils": "functions.indices"}


class NotTranslatedError(CamkitError, ImportError):
    """A part of Quantus that camkit's translation does not provide was used after :func:`install`."""


def _alias(fullname: str) -> str | None:
    """``fullname``'s path under ``quantus`` ('' for ``quantus`` itself), or None when it is not Quantus's."""
    if fullname == ALIAS:
        return ""
    if fullname.startswith(ALIAS + "."):
        return fullname[len(ALIAS) + 1 :]
    return None


def _missing_module(fullname: str) -> ModuleType:
    """A module that imports but raises :class:`NotTranslatedError` for every name read from it."""
    module = ModuleType(fullname, f"Not translated by camkit: every name read from {fullname} raises.")
    module.__path__ = []  # a package, so that deeper paths import too

    def __getattr__(name: str) -> Any:
        if name.startswith("__") and name != "__all__":  # a star import asks for __all__: refuse it loudly
            raise AttributeError(name)
        below = _alias(f"{fullname}.{name}")
        if below in MODULES or below in PARTIAL:  # a translated module under an untranslated package
            return importlib.import_module(f"{fullname}.{name}")
        raise NotTranslatedError(
            f"camkit.compat.quantus does not translate {fullname}.{name}: camkit computes Quantus's metric "
            "classes (quantus.<Metric>, quantus.metrics.*), quantus.evaluate, quantus.explain and the function "
            "modules quantus.functions.*_func; import the original Quantus without "
            "camkit.compat.quantus.install() for the rest."
        )

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    return module


def _partial_module(fullname: str, home: str) -> ModuleType:
    """``fullname`` holding the public names of ``HOME.home``; any other name raises :class:`NotTranslatedError`."""
    source = importlib.import_module(f"{HOME}.{home}")
    module = _missing_module(fullname)
    module.__dict__.update({name: getattr(source, name) for name in source.__all__})
    module.__all__ = list(source.__all__)  # type: ignore[attr-defined]
    return module


def _family_module(fullname: str, family: str | None) -> ModuleType:
    """``quantus.metrics`` (family None: every class) or ``quantus.metrics.<family>`` holding camkit's classes."""
    home = importlib.import_module(HOME)
    names = FAMILIES[family] if family else tuple(n for group in FAMILIES.values() for n in group)
    module = ModuleType(fullname, f"Quantus's {family or 'metric'} classes, computed by camkit.compat.quantus.")
    module.__path__ = []
    module.__dict__.update({name: getattr(home, name) for name in names})
    module.__all__ = list(names)  # type: ignore[attr-defined]
    return module


def _maker(fullname: str, path: str) -> Any:
    if path == "":
        return lambda: importlib.import_module(HOME)
    if path in MODULES:
        return lambda: importlib.import_module(f"{HOME}.{MODULES[path]}")
    if path in PARTIAL:
        return lambda: _partial_module(fullname, PARTIAL[path])
    if path == "metrics" or (path.startswith("metrics.") and path[len("metrics.") :] in FAMILIES):
        return lambda: _family_module(fullname, path[len("metrics.") :] or None)
    return lambda: _missing_module(fullname)


def _spec(fullname: str) -> importlib.machinery.ModuleSpec | None:
    alias = _alias(fullname)
    if alias is None:
        return None
    make = _maker(fullname, alias)
    return importlib.machinery.ModuleSpec(fullname, ModuleLoader(lambda spec: make()), is_package=True)


def _ours(module: Any) -> bool:
    loader = getattr(getattr(module, "__spec__", None), "loader", None)
    return getattr(module, "__name__", "").startswith(HOME) or isinstance(loader, ModuleLoader)


_FINDER = PackageAlias(ALIAS, HOME, _spec, _ours)


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _FINDER.installed()


def install() -> None:
    """Make ``import quantus`` and ``from quantus.metrics.faithfulness import X`` load camkit's translation.

    Call it before anything imports ``quantus``; calling it twice is harmless.

    Raises:
        AlreadyImportedError: the real Quantus is imported already (its classes are in use);
            call ``install()`` first thing in the script, before those imports.

    Example:
        >>> import subprocess, sys
        >>> code = ("import camkit.compat.quantus as cq; cq.install(); "
        ...         "import quantus; print(quantus.PixelFlipping.__module__)")
        >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
        'camkit.compat.quantus.faithfulness'
    """
    _FINDER.install()


def uninstall() -> None:
    """Undo :func:`install`: the finder is removed and the ``quantus`` aliases are forgotten."""
    _FINDER.uninstall()
