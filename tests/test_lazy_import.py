"""`import camkit` loads the explanation core; the apps load on first use of their names, as before."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import camkit


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_every_public_name_resolves_and_is_listed():
    for name in camkit.__all__:
        assert getattr(camkit, name) is not None, name
    assert set(camkit.__all__) <= set(dir(camkit))
    with pytest.raises(AttributeError, match="no attribute 'GradCam'"):
        camkit.GradCam  # noqa: B018


def test_lazy_names_are_the_objects_their_modules_define():
    from camkit.evaluation import evaluate
    from camkit.explorer.entry import app
    from camkit.modelload import load_model
    from camkit.viz import figure, overlay

    assert (camkit.evaluate, camkit.app, camkit.load_model, camkit.figure, camkit.overlay) == (
        evaluate, app, load_model, figure, overlay)


def test_the_apps_load_on_first_use_only():
    loaded = _fresh("import sys, camkit; print(sorted(m for m in sys.modules if m.startswith(('camkit.audit', "
                    "'camkit.evaluation', 'camkit.viz'))))")
    assert loaded == "[]"
    used = _fresh("import sys, camkit; camkit.evaluate; print('camkit.evaluation.run' in sys.modules)")
    assert used == "True"


def test_camkit_audit_is_the_package_and_runs_an_audit_when_called(monkeypatch):
    from camkit.audit import run

    assert camkit.audit is sys.modules["camkit.audit"]
    assert inspect.signature(camkit.audit) == inspect.signature(run.audit)
    calls = []
    monkeypatch.setattr(camkit.audit, "audit", lambda *a, **k: calls.append((a, k)) or "summary")
    assert camkit.audit("data", "demo", out="out") == "summary"
    assert calls == [(("data", "demo"), {"out": "out"})]


@pytest.mark.parametrize("first", ["import camkit.audit.report", "from camkit.audit import audit", "import camkit"])
def test_camkit_audit_is_callable_whatever_was_imported_first(first):
    out = _fresh(f"{first}\nimport camkit, sys\nprint(callable(camkit.audit), camkit.audit is sys.modules['camkit.audit'], "
                 "camkit.audit.report.__name__ if hasattr(camkit.audit, 'report') else 'lazy')")
    callable_, is_package, _ = out.split()
    assert (callable_, is_package) == ("True", "True")
