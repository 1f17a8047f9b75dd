"""torchcam 0.5.0's API on camkit: ``methods``, ``utils.overlay_mask`` and ``metrics.ClassificationMetric``.

A script written for torchcam switches with one line run before it imports torchcam::

    import camkit.compat.torchcam as torchcam_compat; torchcam_compat.install()

after which ``import torchcam`` and ``from torchcam.methods import GradCAM`` load these modules.
The extractors keep torchcam's contract (hooks registered at construction, ``scores = model(x)``
then ``extractor(class_idx, scores)``, one map per target layer at the layer's resolution, hooks
removed by ``remove_hooks()`` or at the end of a ``with`` block); the maps are computed by camkit's
explainers. Where they differ from torchcam's, docs/migration/torchcam.md says how and why.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from types import ModuleType

from ...errors import CamkitError

__all__ = ["AlreadyImportedError", "explain", "install", "installed", "methods", "metrics", "utils"]

__version__ = "0.5.0"
version = importlib.metadata.version

ALIAS = "torchcam"
#: torchcam's module paths that resolve to this package after :func:`install`
SUBMODULES = ("explain", "methods", "methods.core", "methods.activation", "methods.gradient", "methods._utils", "utils", "metrics")


class AlreadyImportedError(CamkitError, ImportError):
    """The real torchcam was imported before :func:`install`: code already holds its classes."""


def __getattr__(name: str) -> ModuleType:
    if name in {"explain", "methods", "metrics", "utils"}:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    shown = ALIAS if sys.modules.get(ALIAS) is sys.modules[__name__] else __name__
    raise AttributeError(f"module {shown!r} has no attribute {name!r}")


def installed() -> bool:
    """Whether ``import torchcam`` resolves to this package."""
    return sys.modules.get(ALIAS) is sys.modules[__name__]


def install() -> None:
    """Make ``import torchcam`` (and its submodules ``methods``, ``utils``, ``metrics``) load this package.

    Call it before anything imports torchcam; calling it twice is harmless.

    Raises:
        AlreadyImportedError: the real torchcam is imported already; call ``install()`` first
            thing in the script, before those imports.
    """
    if installed():
        return
    real = sorted(name for name in sys.modules if name == ALIAS or name.startswith(ALIAS + "."))
    if real:
        raise AlreadyImportedError(
            f"the real torchcam is imported already ({', '.join(real)}), so code may hold its classes; call "
            "camkit.compat.torchcam.install() before anything imports torchcam (first thing in the script)."
        )
    sys.modules[ALIAS] = sys.modules[__name__]
    for sub in SUBMODULES:
        sys.modules[f"{ALIAS}.{sub}"] = importlib.import_module(f"{__name__}.{sub}")
