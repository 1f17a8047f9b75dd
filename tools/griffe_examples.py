"""A Griffe extension for the docs build: read ``Example:`` as the Google "Examples" section.

camkit's docstrings title their doctest section ``Example:`` (singular). Griffe reads only
``Examples:`` as the examples section and would render the doctest lines as prose, where a
printed list such as ``[0.5, 1.0]`` looks like a Markdown cross-reference. This extension
renames the title before the docstring is parsed, so the examples render as code blocks.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_TITLE = re.compile(r"^(\s*)Example:\s*$", re.M)


class ExampleSection(Extension):
    """Rename ``Example:`` to ``Examples:`` in every docstring Griffe loads."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _TITLE.sub(r"\1Examples:", obj.docstring.value)
