"""Method metadata: every registered method says what a call costs and when to use it, and
docs/guide/methods.md lists exactly the registry's methods (it is generated from it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import camkit
from camkit.registry import MethodInfo

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("methods_table", ROOT / "tools" / "methods_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("key", camkit.list_methods())
def test_every_registered_method_has_metadata(key):
    cls = camkit.get_method(key)
    assert isinstance(cls.cost, str) and cls.cost.strip(), f"{cls.__name__}.cost is empty"
    assert isinstance(cls.use_when, str) and cls.use_when.strip(), f"{cls.__name__}.use_when is empty"
    assert "forward" in cls.cost or "pass" in cls.cost, f"{cls.__name__}.cost should count passes: {cls.cost!r}"
    assert "cost" in vars(cls) and "use_when" in vars(cls), f"{cls.__name__} inherits its metadata; set its own"


def test_list_methods_details_rows():
    keys = camkit.list_methods()
    assert keys == sorted(keys) and all(isinstance(k, str) for k in keys)
    rows = camkit.list_methods(details=True)
    assert [r.key for r in rows] == keys
    for row in rows:
        assert isinstance(row, MethodInfo)
        cls = camkit.get_method(row.key)
        assert (row.name, row.cost, row.use_when) == (cls.__name__, cls.cost, cls.use_when)
        assert row.family
    by_key = {r.key: r for r in rows}
    assert by_key["gradcam"].family == "CAM (gradient)"
    assert by_key["scorecam"].family == "CAM (forward only)"
    assert by_key["saliency"].family == "gradient attribution"
    assert by_key["occlusion"].family == "perturbation"


def test_wrappers_have_metadata():
    for name in ("SmoothGrad", "AugSmooth", "SESS"):
        cls = getattr(camkit, name)
        assert cls.cost and cls.use_when and "cost" in vars(cls)


def test_methods_page_table_is_the_registry():
    tool = _tool()
    page = (ROOT / "docs" / "guide" / "methods.md").read_text(encoding="utf-8")
    assert tool.current(page) == tool.render(), (
        "docs/guide/methods.md's method table is out of date with the registry: run "
        "`python tools/methods_table.py` and commit the page"
    )
    for key in camkit.list_methods():
        assert f"| `{key}` |" in page
