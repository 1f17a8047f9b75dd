"""``camkit app`` and ``camkit.app``: the command's options, local defaults, and life without Gradio."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from camkit.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def test_the_command_and_its_options_are_registered():
    parser = build_parser()
    args = parser.parse_args(["app", "--model", "demo", "--audit", "a", "--audit", "b", "--evaluate", "e"])
    assert (args.model, args.audit, args.evaluate, args.port, args.host) == (["demo"], ["a", "b"], ["e"], None, "127.0.0.1")
    assert parser.parse_args(["app", "--model", "demo", "--model", "timm:x"]).model == ["demo", "timm:x"]
    assert parser.parse_args(["explain", "--model", "demo", "--out", "o", "a.png"]).model == "demo"  # only the app takes two
    sub = next(a for a in parser._subparsers._group_actions if a.dest == "command")
    text = sub.choices["app"].format_help()
    for option in ("--model", "--audit", "--evaluate", "--port", "--host", "--classes", "--weights"):
        assert option in text


def test_without_gradio_the_command_names_the_extra_and_exits_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gradio", None)  # `import gradio` now raises ImportError
    assert main(["app", "--model", "demo", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("camkit app: the explorer needs Gradio") and 'pip install "camkit[app]"' in err


def test_the_command_launches_locally_with_the_folders_given(monkeypatch, tmp_path):
    pytest.importorskip("gradio")
    import camkit.explorer.app as app_module

    seen: dict = {}
    real = app_module.build_app

    def build(session, audits=(), evaluations=(), compare_with=()):
        seen["session"], seen["audits"], seen["evaluations"] = session, list(audits), list(evaluations)
        seen["compare_with"] = list(compare_with)
        blocks = real(session, audits, evaluations, compare_with=compare_with)
        monkeypatch.setattr(blocks, "launch", lambda **kwargs: seen.update(launch=kwargs))
        return blocks

    monkeypatch.setattr(app_module, "build_app", build)
    names = tmp_path / "names.txt"
    names.write_text("a\nb\nc\nd\n")
    code = main(["app", "--model", "demo", "--device", "cpu", "--port", "7999", "--audit", "x", "--classes", str(names)])
    assert code == 0
    assert seen["audits"] == ["x"] and seen["evaluations"] == []
    assert seen["session"].class_names == ["a", "b", "c", "d"]
    assert seen["launch"]["server_name"] == "127.0.0.1" and seen["launch"]["server_port"] == 7999
    assert seen["launch"]["share"] is False and seen["compare_with"] == []
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))  # tests/tinyfactory.py
    code = main(["app", "--model", "demo", "--model", "tinyfactory:tiny", "--device", "cpu", "--port", "7999"])
    assert code == 0 and seen["session"].loaded.spec == "demo"
    assert [s.loaded.spec for s in seen["compare_with"]] == ["tinyfactory:tiny"]


def test_launch_defaults_stay_on_this_machine(monkeypatch):
    gr = pytest.importorskip("gradio")
    from camkit.explorer.app import SYSTEM_FONTS, ExplorerBlocks, local_theme

    seen: dict = {}
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, *a, **kw: seen.update(kw))
    with ExplorerBlocks(analytics_enabled=False) as blocks:
        gr.Markdown("x")
    blocks.launch()
    assert seen["server_name"] == "127.0.0.1" and seen["share"] is False
    assert not any(isinstance(font, gr.themes.GoogleFont) for font in seen["theme"].font)
    css = local_theme()._get_theme_css()
    assert "googleapis" not in css and SYSTEM_FONTS[0] in css
    blocks.launch(server_name="0.0.0.0")
    assert seen["server_name"] == "0.0.0.0"  # the caller's choice wins


def test_camkit_app_without_gradio_is_an_import_error_naming_the_extra(monkeypatch):
    import camkit

    monkeypatch.setitem(sys.modules, "gradio", None)
    with pytest.raises(ImportError, match=r'pip install "camkit\[app\]"') as caught:
        camkit.app(model="demo", device="cpu")
    assert isinstance(caught.value, camkit.CamkitError)


@pytest.mark.slow  # a fresh interpreter importing torch: ~15 s on a loaded CPU
def test_import_camkit_works_without_gradio_and_camkit_app_says_what_to_install():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["gradio"] = None
        import camkit
        assert "gradio" not in [m for m in sys.modules if sys.modules[m] is not None]
        try:
            camkit.app(model="demo", device="cpu")
        except ImportError as err:
            assert isinstance(err, camkit.CamkitError)
            print(err)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=True)
    assert 'pip install "camkit[app]"' in out.stdout
