"""The explorer page: tabs "Explain", "Compare", "Audit" and "Evaluate" on one :class:`~camkit.explorer.Session`.

Privacy by default: the server listens on 127.0.0.1, makes no share link, sends no analytics
(``analytics_enabled=False`` and ``GRADIO_ANALYTICS_ENABLED=False``) and the page fetches nothing
from outside the machine (a theme with system fonts only, no Google Fonts). Files the server
writes (uploads, maps, overlays) go to one temporary folder of its own (:attr:`ExplorerBlocks.temp_dir`),
removed when the process exits.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported: no telemetry, no version check

import gradio as gr

from .audit_tab import build_audit_tab
from .compare_tab import build_compare_tab
from .evaluate_tab import build_evaluate_tab
from .explain_tab import PICTURE_CSS, build_explain_tab
from .generation import GenerationSession
from .generation_tab import build_generation_tab
from .session import Session

__all__ = ["ExplorerBlocks", "build_app", "local_theme"]

TAB_LABELS = ("Explain", "Compare", "Audit", "Evaluate")
SYSTEM_FONTS = ("ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica", "Arial", "sans-serif")
MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace")


def local_theme() -> gr.themes.Base:
    """Gradio's default look with the system's fonts: nothing is fetched from a font service."""
    return gr.themes.Default(font=list(SYSTEM_FONTS), font_mono=list(MONO_FONTS))


class ExplorerBlocks(gr.Blocks):
    """A ``gr.Blocks`` whose :meth:`launch` defaults keep the app on this machine.

    ``server_name="127.0.0.1"``, ``share=False`` and the system-font theme unless given otherwise.
    """

    temp_dir: Path

    def launch(self, *args: Any, **kwargs: Any) -> Any:
        """``gr.Blocks.launch`` with local defaults (127.0.0.1, no share link, system fonts)."""
        kwargs.setdefault("server_name", "127.0.0.1")
        kwargs.setdefault("share", False)
        kwargs.setdefault("theme", local_theme())
        kwargs.setdefault("css", PICTURE_CSS)
        return super().launch(*args, **kwargs)


def _temp_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="camkit-app-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def build_app(
    session: Session | GenerationSession, audits: Sequence[str | os.PathLike[str]] = (), evaluations: Sequence[str | os.PathLike[str]] = (),
    *, compare_with: Sequence[Session] = (),
) -> ExplorerBlocks:
    """The explorer page for ``session``, with the audit and evaluation folders to browse.

    ``compare_with``: more models' sessions; the Compare tab then shows the same methods on every
    model in one grid (one column per model, one colour scale).

    A vision-language model's session (:class:`~camkit.explorer.generation.GenerationSession`) gets
    the Explain tab alone, taking a prompt: the answer's words, each with its map.

    Example:
        >>> from camkit.explorer import Session
        >>> from camkit.explorer.app import build_app
        >>> demo = build_app(Session("demo", device="cpu"))  # doctest: +SKIP
        >>> demo.launch()  # a local server on 127.0.0.1  # doctest: +SKIP
    """
    temp = _temp_dir()
    os.environ["GRADIO_TEMP_DIR"] = str(temp)  # uploads and outputs: components read it when they are made
    audit_paths = [Path(p) for p in audits]
    evaluation_paths = [Path(p) for p in evaluations]
    if isinstance(session, GenerationSession):
        return _generation_app(session, temp)
    with ExplorerBlocks(title="camkit explorer", analytics_enabled=False) as blocks:
        gr.Markdown(f"## camkit explorer: `{session.loaded.spec}`")
        with gr.Tab(TAB_LABELS[0]):
            upload = build_explain_tab(session, temp)
        with gr.Tab(TAB_LABELS[1]):
            build_compare_tab(session, follow=upload, others=compare_with)
        with gr.Tab(TAB_LABELS[2]):
            build_audit_tab(session, audit_paths)
        with gr.Tab(TAB_LABELS[3]):
            build_evaluate_tab(session, evaluation_paths)
    blocks.temp_dir = temp
    return blocks


def _generation_app(session: GenerationSession, temp: Path) -> ExplorerBlocks:
    """The page for a vision-language model: the Explain tab with a prompt (the other tabs explain classifiers)."""
    with ExplorerBlocks(title="camkit explorer", analytics_enabled=False) as blocks:
        gr.Markdown(f"## camkit explorer: `{session.spec}` (a vision-language model)")
        with gr.Tab(TAB_LABELS[0]):
            build_generation_tab(session, temp)
    blocks.temp_dir = temp
    return blocks
