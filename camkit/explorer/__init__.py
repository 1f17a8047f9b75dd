"""The explorer: a local web app that explains, compares and browses audits live, on the user's own model.

:mod:`~camkit.explorer.session` holds the model (loaded once), its preprocessing, the class names
and the explanation cache, in plain Python (no web library); :mod:`~camkit.explorer.app`
assembles the page with Gradio (the ``camkit[app]`` extra), one module per tab;
:mod:`~camkit.explorer.entry` is :func:`camkit.app`. Gradio is imported only when an app is built,
so ``import camkit`` works without it. Only :mod:`camkit.cli` and :func:`camkit.app` import this
package.
"""

from .inputs import method_settings
from .session import LiveResult, Session

__all__ = ["LiveResult", "Session", "method_settings"]
