"""Dataset-scale attention audits (``camkit audit``).

:func:`audit` runs an explainer over a dataset and writes ``results.csv``, ``summary.json``,
``overlays/`` and a self-contained ``report.html``; it loads models through
:mod:`camkit.modelload` and reads data, labels and output folders through :mod:`camkit.runs`.
:func:`explain_files` (``camkit explain``) lives in :mod:`camkit.explain` and is named here too.
Import submodules with ``from camkit.audit.report import summarize`` (``camkit.audit`` itself is
the function at the top level of the package).
"""

from ..explain import explain_files
from ..runs.outdir import AuditError
from .run import audit

__all__ = ["AuditError", "audit", "explain_files"]
