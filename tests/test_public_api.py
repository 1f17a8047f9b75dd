"""Every public name is documented: a docstring with a runnable ``Example:`` and an API page.

"Public" means listed in the ``__all__`` of ``camkit``, ``camkit.functional``,
``camkit.metrics`` or ``camkit.debug``. Classes and functions carry their doctests in
``__doc__`` (pytest runs those with ``--doctest-modules``); a type alias has no ``__doc__``
of its own, so its docstring (the string under the assignment) is read with Griffe, as the
docs build reads it, and its example is run here.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("camkit", "camkit.functional", "camkit.metrics", "camkit.debug")
NOT_DOCUMENTED_OBJECTS = {"__version__"}  # a string: documented in CHANGELOG.md and CONTRIBUTING.md
EXAMPLE = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*\n(?P<body>(?:(?P=indent)[ \t]+.*\n|[ \t]*\n)+)", re.M)


def public_names() -> list[tuple[str, str]]:
    names = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        names += [(package, name) for name in module.__all__ if name not in NOT_DOCUMENTED_OBJECTS]
    return names


def is_alias(obj: Any) -> bool:
    """A typing construct (``Union[...]``, ``Callable[...]``) rather than a class or function."""
    return not (inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj))


def griffe_docstring(package: str, name: str) -> str:
    griffe = pytest.importorskip("griffe")
    loaded = griffe.load(package, search_paths=[str(ROOT)], resolve_aliases=True, resolve_external=False)
    member = loaded[name]
    return member.docstring.value if member.docstring is not None else ""


def own_docstring(package: str, name: str) -> str:
    obj = getattr(importlib.import_module(package), name)
    if is_alias(obj):
        return griffe_docstring(package, name)
    if inspect.isclass(obj):
        return inspect.cleandoc(obj.__dict__.get("__doc__") or "")  # not a base class's docstring
    return inspect.cleandoc(obj.__doc__ or "")


@pytest.mark.heavy
@pytest.mark.parametrize(("package", "name"), public_names(), ids=lambda v: v)
def test_public_name_has_a_docstring_with_a_doctest_example(package, name):
    doc = own_docstring(package, name)
    assert doc.strip(), f"{package}.{name} has no docstring of its own"
    match = EXAMPLE.search(doc + "\n")
    assert match, f"{package}.{name}: the docstring has no 'Example:' section"
    examples = doctest.DocTestParser().get_examples(inspect.cleandoc(match.group("body")))
    assert examples, f"{package}.{name}: the 'Example:' section has no '>>>' lines"
    assert any(ex.want.strip() for ex in examples), f"{package}.{name}: the example shows no expected output"


@pytest.mark.heavy
def test_type_alias_examples_run():
    """pytest's doctest collection does not see a type alias's docstring: run those examples here."""
    aliases = [(p, n) for p, n in public_names() if is_alias(getattr(importlib.import_module(p), n))]
    assert ("camkit.metrics", "Baseline") in aliases
    for package, name in aliases:
        doc = own_docstring(package, name)
        match = EXAMPLE.search(doc + "\n")
        assert match is not None, f"{package}.{name}: no 'Example:' section"
        body = inspect.cleandoc(match.group("body"))
        test = doctest.DocTestParser().get_doctest(body, {}, f"{package}.{name}", None, 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        result = runner.run(test, out=lambda _: None)
        assert result.attempted > 0 and result.failed == 0, f"{package}.{name}: {result.failed} example(s) failed"


def api_directives() -> set[str]:
    found: set[str] = set()
    for page in (ROOT / "docs" / "api").glob("*.md"):
        found |= set(re.findall(r"^:::\s*(\S+)", page.read_text(encoding="utf-8"), re.M))
    return found


def documented_by(directives: set[str], package: str, name: str) -> bool:
    """A name is on a page if it has its own ``:::`` directive or a directive renders its module."""
    if f"{package}.{name}" in directives:
        return True
    for other in PACKAGES[1:]:  # a subpackage page renders everything in its __all__
        if other in directives and name in importlib.import_module(other).__all__:
            return True
    obj = getattr(importlib.import_module(package), name)
    if inspect.ismodule(obj):  # camkit.audit: the callable package, documented by its function
        return f"{obj.__name__}.run.{name}" in directives or obj.__name__ in directives
    home = getattr(obj, "__module__", None)
    if home in directives:
        return name in getattr(importlib.import_module(home), "__all__", [name])
    return f"{home}.{name}" in directives


@pytest.mark.parametrize(("package", "name"), public_names(), ids=lambda v: v)
def test_public_name_is_on_an_api_page(package, name):
    directives = api_directives()
    assert documented_by(directives, package, name), (
        f"{package}.{name} is on no page of docs/api/: add '::: {package}.{name}' (or its module) to one"
    )


def test_the_checks_catch_a_missing_example_and_a_missing_page():
    """The patterns above are not vacuous: they reject a docstring without an example."""
    assert EXAMPLE.search("Summary.\n\nArgs:\n    x: a tensor.\n") is None
    assert EXAMPLE.search("Summary.\n\nExample:\n    >>> 1 + 1\n    2\n") is not None
    assert not documented_by({"camkit.hooks"}, "camkit", "GradCAM")


def test_docs_extension_reads_camkit_docstrings_as_griffe_needs():
    """tools/griffe_examples.py (the docs build's Griffe extension) renames and splits as documented."""
    spec = importlib.util.spec_from_file_location("griffe_examples", ROOT / "tools" / "griffe_examples.py")
    assert spec is not None and spec.loader is not None
    pytest.importorskip("griffe")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    text = "Args:\n    model: m.\n    output, keep_mode: see Explainer.\n        More.\n\nReturns:\n    a, b: c."
    assert ext.split_shared_entries(text) == (
        "Args:\n    model: m.\n    output: see Explainer.\n        More.\n    keep_mode: see Explainer.\n"
        "        More.\n\nReturns:\n    a, b: c."
    )
    assert ext._TITLE.sub(r"\1Examples:", "Sum.\n\n    Example:\n        >>> 1") == "Sum.\n\n    Examples:\n        >>> 1"
