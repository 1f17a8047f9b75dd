"""The built docs site works offline: no external script or stylesheet, code highlighted by Pygments.

Builds the site once (``mkdocs build --strict``, as ``make docs`` does) into a temporary folder;
skipped when mkdocs is not installed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# src/href of <script>, <link> (stylesheets, icons), <img>, and CSS url(...) / @import.
REFERENCE = re.compile(
    r"<(?:script|link|img|iframe|source)\b[^>]*?\b(?:src|href)\s*=\s*[\"']([^\"']+)[\"']|url\(\s*[\"']?([^\"')]+)|@import\s+[\"']([^\"']+)",
    re.I,
)
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.I)  # http://, https://, protocol-relative //


def external_references(text: str) -> list[str]:
    found = []
    for match in REFERENCE.finditer(text):
        target = next(g for g in match.groups() if g is not None).strip()
        if EXTERNAL.match(target):
            found.append(target)
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    pytest.importorskip("pymdownx")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_check_finds_external_references():
    page = (
        '<link rel="stylesheet" href="https://cdn.example/x.css"><script src="//cdn.example/a.js"></script>'
        '<script src="js/theme.js"></script><a href="https://example.org">a link is fine</a>'
        "<style>@import 'https://fonts.example/f.css'; body{background:url(img/x.png)}</style>"
    )
    assert external_references(page) == ["https://cdn.example/x.css", "//cdn.example/a.js", "https://fonts.example/f.css"]


@pytest.mark.heavy
def test_built_site_references_no_external_script_or_style(site):
    offenders = {}
    for path in [*site.rglob("*.html"), *site.rglob("*.css"), *site.rglob("*.js")]:
        found = external_references(path.read_text(encoding="utf-8", errors="replace"))
        if found:
            offenders[str(path.relative_to(site))] = found
    assert not offenders, offenders


def test_code_is_highlighted_at_build_time(site):
    page = (site / "guide" / "getting-started" / "index.html").read_text(encoding="utf-8")
    assert "highlight.js" not in page and "hljs" not in page
    assert '<div class="highlight">' in page
    assert re.search(r'<span class="kn">import</span>', page)  # Pygments' token classes in the HTML
    css = (site / "css" / "pygments.css").read_text(encoding="utf-8")
    assert ".highlight .kn" in css
    wide = (site / "css" / "camkit.css").read_text(encoding="utf-8")
    assert re.search(r"\.wy-nav-content\s*\{\s*max-width:\s*1180px", wide)
