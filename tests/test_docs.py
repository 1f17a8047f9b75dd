"""The Python snippets in docs/ and README.md run.

Every ```python block of a page runs in order in one namespace per page. A block right after
an HTML comment ``<!-- requires: NAME -->`` runs only when module NAME imports (used for the
anchors' side of the migration guides); ``<!-- no-run -->`` marks blocks that are not run
(commands that need a GPU or a network, say).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
BLOCK = re.compile(r"(?:<!--\s*(?P<mark>[^>]*?)\s*-->\s*\n)?```python\n(?P<code>.*?)```", re.S)


def blocks(page: Path):
    for match in BLOCK.finditer(page.read_text(encoding="utf-8")):
        yield (match.group("mark") or "").strip(), match.group("code")


@pytest.mark.heavy
@pytest.mark.parametrize("page", [p for p in PAGES if any(True for _ in blocks(p))], ids=lambda p: str(p.relative_to(ROOT)))
def test_page_snippets_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    for mark, code in blocks(page):
        if mark == "no-run":
            continue
        if mark.startswith("requires:"):
            module = mark.split(":", 1)[1].strip()
            if importlib.util.find_spec(module) is None:
                continue
        exec(compile(code, f"{page.name}", "exec"), namespace)
        ran += 1
    if ran == 0:
        pytest.skip(f"every snippet of {page.name} needs a module that is not installed")
