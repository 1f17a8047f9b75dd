"""Dataset-scale attention audits and file-level explanations (``camkit audit``, ``camkit explain``).

:func:`audit` runs an explainer over a dataset and writes ``results.csv``, ``summary.json``,
``overlays/`` and a self-contained ``report.html``; :func:`explain_files` explains a few
image files. Both load models through :mod:`camkit.modelload`. Import submodules with
``from camkit.audit.data import discover`` (``camkit.audit`` itself is the function at the
top level of the package).
"""

from .explain import explain_files
from .run import AuditError, audit

__all__ = ["AuditError", "audit", "explain_files"]
