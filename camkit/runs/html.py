"""The HTML of the runs' self-contained reports (the audit's and the evaluation's): the page shell and its tables.

A page fetches nothing: its Content-Security-Policy allows no network access (images are ``data:``
URIs; styles and any script are inline). Table cells arrive as HTML: each report escapes what
comes from the data (:func:`escape`) and formats its own numbers while it builds them.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

__all__ = ["escape", "page", "table"]

escape = html.escape
"""HTML-escape text for a page, quotes too (safe in text and in attribute values)."""


def page(title: str, style: str, body: str, *, script: str = "") -> str:
    """One self-contained HTML page: ``style`` and ``script`` inline, nothing fetched.

    Example:
        >>> from camkit.runs.html import page
        >>> html = page("camkit audit", "p{color:red}", "<p>hi</p>")
        >>> html.startswith("<!DOCTYPE html>"), html.endswith("<style>p{color:red}</style></head><body><p>hi</p></body></html>")
        (True, True)
        >>> "script-src" in html, "script-src" in page("camkit audit", "", "", script="let a = 1;")
        (False, True)
    """
    csp = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
    if script:
        csp += "; script-src 'unsafe-inline'"
        body += f"<script>{script}</script>"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f"<title>{escape(title)}</title><style>{style}</style></head><body>{body}</body></html>"
    )


def table(head: Sequence[str], rows: Iterable[Sequence[str]], *, attrs: str = "") -> str:
    """An HTML table from its cells: ``head`` the ``<th>`` cells, each row its ``<td>`` cells (all HTML already).

    ``attrs``: the ``<table>`` tag's attributes, after a space (``' class="sortable"'``).

    Example:
        >>> from camkit.runs.html import table
        >>> table(["<th>a</th>"], [["<td>1</td>"], ["<td>2</td>"]])
        '<table><thead><tr><th>a</th></tr></thead><tbody><tr><td>1</td></tr><tr><td>2</td></tr></tbody></table>'
    """
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    return f"<table{attrs}><thead><tr>{''.join(head)}</tr></thead><tbody>{body}</tbody></table>"
