"""A Griffe extension for the docs build: camkit's docstring habits in Griffe's Google dialect.

Two habits of camkit's docstrings that Griffe reads differently, rewritten before the
docstring is parsed (the source is not changed):

* The doctest section is titled ``Example:`` (singular). Griffe reads only ``Examples:`` as
  the examples section and would render the doctest lines as prose, where a printed list
  such as ``[0.5, 1.0]`` looks like a Markdown cross-reference.
* Parameters that share a description are listed together (``output, keep_mode: see
  :class:`Explainer`.``). Griffe would look for one parameter named ``"output, keep_mode"``;
  the entry is repeated once per name.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_TITLE = re.compile(r"^(\s*)Example:\s*$", re.M)
_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Attributes|Other Parameters|Keyword Args):\s*$")
_SHARED = re.compile(r"^(\s+)([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)+)\s*:(.*)$")


def split_shared_entries(text: str) -> str:
    """Repeat a ``a, b: description`` entry (with its continuation lines) for ``a`` and ``b``.

    Example:
        >>> print(split_shared_entries("Args:\\n    a, b: the sides.\\n        In pixels.\\n    c: x."))
        Args:
            a: the sides.
                In pixels.
            b: the sides.
                In pixels.
            c: x.
    """
    lines = text.split("\n")
    out: list[str] = []
    section_indent: int | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        header = _SECTION.match(line)
        if header:
            section_indent = len(header.group(1))
        elif line.strip() and section_indent is not None and indent <= section_indent:
            section_indent = None
        shared = _SHARED.match(line) if section_indent is not None else None
        if shared and len(shared.group(1)) > section_indent:  # type: ignore[operator]
            block = [shared.group(3)]
            i += 1
            while i < len(lines) and lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) > indent:
                block.append(lines[i])  # the entry's continuation lines
                i += 1
            for name in re.split(r"\s*,\s*", shared.group(2)):
                out.append(f"{shared.group(1)}{name}:{block[0]}")
                out.extend(block[1:])
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class ExampleSection(Extension):
    """Rename ``Example:`` to ``Examples:`` and split shared parameter entries in every docstring."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = split_shared_entries(_TITLE.sub(r"\1Examples:", obj.docstring.value))
