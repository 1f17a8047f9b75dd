"""Dataset-scale attention audits (``camkit audit``).

:func:`audit` runs an explainer over a dataset and writes ``results.csv``, ``summary.json``,
``overlays/`` and a self-contained ``report.html``; it loads models through
:mod:`camkit.modelload` and reads data, labels and output folders through :mod:`camkit.runs`.
:func:`explain_files` (``camkit explain``) lives in :mod:`camkit.explain` and is named here too.

``camkit.audit`` is this package and the function at once: the package is callable, so
``camkit.audit(data, model, ...)`` runs :func:`camkit.audit.run.audit` whichever was imported
first, and ``camkit.audit.report`` or ``from camkit.audit.report import summarize`` reach the
submodules (before, the function replaced the package on ``camkit``).

Example:
    >>> import inspect
    >>> import camkit
    >>> import camkit.audit.report
    >>> callable(camkit.audit), camkit.audit.report.__name__
    (True, 'camkit.audit.report')
    >>> list(inspect.signature(camkit.audit).parameters)[:3]
    ['data', 'model', 'out']
"""

import sys
from types import ModuleType
from typing import Any

from ..explain import explain_files
from ..runs.outdir import AuditError
from .run import audit

__all__ = ["AuditError", "audit", "explain_files"]


class _CallablePackage(ModuleType):
    """The package ``camkit.audit``, which calls :func:`camkit.audit.run.audit` when called."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return audit(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
__wrapped__ = audit  # inspect.signature(camkit.audit) and help() show the function's signature
