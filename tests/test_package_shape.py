"""The shape of the package holds: no import cycle, modules a reader can hold, wings that keep to their side.

The import graph is read from the source with ``ast``: every ``import`` and ``from ... import``
of a camkit module counts, also inside functions (a lazy import that dodges a cycle is still
one) and under ``if TYPE_CHECKING:`` (a cycle that only the type checker sees is still a cycle).
CONTRIBUTING.md ("Architecture") states the rules checked here; each rule's checker is shown failing
on a small planted package first.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "camkit"
MAX_LINES = 500
MAX_FUNCTION_LINES = 80  # docstrings included
MAX_ROOT_MODULES = 12  # besides __init__, __main__ and _version


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The camkit modules ``name`` imports anywhere in its source, ``TYPE_CHECKING`` blocks included."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = name.split(".")[0]
    found: set[str] = set()

    def known(dotted: str) -> str:
        while dotted not in modules and "." in dotted:
            dotted = dotted.rpartition(".")[0]
        return dotted

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.update(known(a.name) for a in child.names if a.name.split(".")[0] == top)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)] if child.level > 1 else base
                    source = ".".join(base + ([child.module] if child.module else []))
                else:
                    source = child.module or ""
                if source.split(".")[0] == top:
                    for alias in child.names:  # "from . import syncs" names a module
                        found.add(known(f"{source}.{alias.name}"))
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    found.discard(name)
    return found


@functools.cache
def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """``{module: modules it imports}`` for every module of the package at ``root`` (parsed once per root)."""
    modules = _modules(root)
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := walk(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := walk(start)) is not None:
            return cycle
    return None


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


def test_the_cycle_finder_sees_imports_inside_functions_and_under_type_checking(tmp_path):
    hidden = _write(tmp_path / "a", {
        "pkg/__init__.py": "",
        "pkg/io.py": "from .overlay import draw\n",
        "pkg/overlay.py": "def draw():\n    from .io import read\n",
    })  # fmt: skip
    assert find_cycle(import_graph(hidden)) == ["pkg.io", "pkg.overlay", "pkg.io"]
    typed = _write(tmp_path / "b", {
        "pkg/__init__.py": "",
        "pkg/figures.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .explanation import E\n",
        "pkg/explanation.py": "from .figures import figure\n",
    })  # fmt: skip
    assert import_graph(typed)["pkg.figures"] == {"pkg.explanation"}
    assert find_cycle(import_graph(typed)) == ["pkg.explanation", "pkg.figures", "pkg.explanation"]
    submodule = _write(tmp_path / "c", {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "from . import a\n",
        "pkg/sub/a.py": "from .. import b\n",
        "pkg/b.py": "def f():\n    import pkg.sub\n",
    })  # fmt: skip
    assert find_cycle(import_graph(submodule)) == ["pkg.b", "pkg.sub", "pkg.sub.a", "pkg.b"]


def test_no_import_cycle_between_camkit_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_over_500_lines():
    long = {
        str(path.relative_to(PACKAGE.parent)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def test_the_root_holds_a_handful_of_modules():
    root = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__", "_version"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules directly under camkit/: {root}; put new ones in a wing"
    wings = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert {"layers", "targets", "detection", "viz", "functional", "methods", "metrics", "runs", "audit", "evaluation",
            "explain", "debug", "cli", "explorer", "bundled", "demo", "vlm"} <= wings


# Who may not import whom: (importer prefix, imported prefixes it must not reach, why).
FORBIDDEN = [
    ("camkit.functional", ("camkit.hooks", "camkit.methods", "camkit.layers", "camkit.targets", "camkit.audit",
                           "camkit.metrics", "camkit.debug", "camkit.demo", "camkit.cli", "camkit.explanation",
                           "camkit.viz", "camkit.media"),
     "the functional core is pure tensor math: no hooks, explainers or datasets"),
    ("camkit.hooks", ("camkit.methods", "camkit.layers", "camkit.targets", "camkit.audit", "camkit.cli"),
     "hooks know no explainers"),
    ("camkit.layers", ("camkit.methods", "camkit.vlm", "camkit.targets", "camkit.detection", "camkit.viz", "camkit.audit",
                       "camkit.cli"),
     "layers are below the explainers and the targets"),
    ("camkit.targets", ("camkit.methods", "camkit.vlm", "camkit.viz", "camkit.audit", "camkit.cli"),
     "targets are below the explainers"),
    ("camkit.detection", ("camkit.targets", "camkit.methods", "camkit.viz", "camkit.audit", "camkit.explorer",
                          "camkit.cli"),
     "detection is below the explainers, the audit and the explorer; camkit.targets re-exports its target"),
    ("camkit.viz", ("camkit.methods", "camkit.explanation", "camkit.hooks", "camkit.runs", "camkit.audit", "camkit.evaluation", "camkit.explain", "camkit.explorer", "camkit.demo", "camkit.cli"),
     "pictures take any object with maps"),
    ("camkit.methods", ("camkit.viz", "camkit.vlm", "camkit.metrics", "camkit.modelload", "camkit.debug", "camkit.media",
                        "camkit.runs", "camkit.audit", "camkit.evaluation", "camkit.explain", "camkit.explorer", "camkit.demo", "camkit.cli"),
     "the explainers know no pictures, metrics, files or apps"),
    ("camkit.vlm", ("camkit.viz", "camkit.metrics", "camkit.runs", "camkit.audit", "camkit.evaluation", "camkit.explain",
                    "camkit.explorer", "camkit.demo", "camkit.modelload", "camkit.cli", "camkit.compat"),
     "vision-language models are explained on the explainers' level: no pictures, metrics, run plumbing or apps"),
    ("camkit.vlm.families.base", ("camkit.vlm.families.llava", "camkit.vlm.families.paligemma",
                                  "camkit.vlm.families.qwen_vl", "camkit.vlm.families.idefics",
                                  "camkit.vlm.families.gemma3", "camkit.vlm.methods", "camkit.vlm.explain"),
     "each family registers itself; the protocol knows none of them"),
    ("camkit.vlm.methods.registry", ("camkit.vlm.methods.gradcam", "camkit.vlm.methods.gradient_input",
                                     "camkit.vlm.methods.attention", "camkit.vlm.methods.attention_gradients",
                                     "camkit.vlm.methods.attnlrp",
                                     "camkit.vlm.methods.perturbation", "camkit.vlm.explain"),
     "each vision-language method registers itself"),
    ("camkit.io", ("camkit.methods", "camkit.viz", "camkit.hooks", "camkit.explanation", "camkit.runs", "camkit.audit", "camkit.evaluation", "camkit.explain", "camkit.explorer", "camkit.demo", "camkit.cli"),
     "image files know no explainers, pictures or apps"),
    ("camkit.explanation", ("camkit.methods", "camkit.metrics", "camkit.runs", "camkit.audit", "camkit.evaluation", "camkit.explain", "camkit.explorer", "camkit.demo", "camkit.cli"),
     "an explanation is plain data"),
    ("camkit.methods.registry", ("camkit.methods.cam", "camkit.methods.attribution", "camkit.methods.perturbation",
                                 "camkit.methods.attention", "camkit.methods.wrappers"),
     "each method tells the registry its kind"),
    ("camkit.bundled", ("camkit.methods", "camkit.hooks", "camkit.layers", "camkit.targets", "camkit.viz",
                        "camkit.modelload", "camkit.runs", "camkit.audit", "camkit.demo", "camkit.cli"),
     "the bundled data set and models know nothing of what uses them"),
    ("camkit.media", ("camkit.methods", "camkit.hooks", "camkit.viz", "camkit.audit", "camkit.cli", "camkit.explanation"),
     "file reading and writing knows no explainers, pictures or audits"),
    ("camkit.runs", ("camkit.audit", "camkit.evaluation", "camkit.explain", "camkit.explorer", "camkit.demo",
                     "camkit.compat", "camkit.cli"),
     "the run plumbing (data, labels, output folders, torchrun, loaders) is below the apps that share it"),
    ("camkit.explain", ("camkit.audit", "camkit.evaluation", "camkit.explorer", "camkit.cli"),
     "camkit explain is an app of its own: it runs on camkit.runs, not on the audit or the evaluation"),
    ("camkit.audit", ("camkit.evaluation", "camkit.cli"), "the audit knows no command line and not the evaluation"),
    ("camkit.evaluation", ("camkit.audit", "camkit.cli"), "the evaluation knows no command line and not the audit"),
    ("camkit.modelload", ("camkit.cli",), "loading knows no command line"),
    ("camkit.demo", ("camkit.cli",), "the demo knows no command line"),
    ("camkit.debug", ("camkit.cli",), "the debugging tools know no command line"),
    ("camkit.compat", ("camkit.cli",), "the compatibility layers know no command line"),
    ("camkit.explorer", ("camkit.cli",), "the explorer knows no command line"),
]


@pytest.mark.heavy
def test_nothing_in_camkit_imports_the_compatibility_layers():
    graph = import_graph()
    users = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if not module.startswith("camkit.compat")
        for target in targets
        if target.startswith("camkit.compat")
    )
    assert users == [], f"camkit.compat translates other APIs onto camkit; camkit never depends on it: {users}"


# Imports a rule above forbids but that stay, each with its reason (CONTRIBUTING names them).
EXCEPTIONS = {
    ("camkit.vlm.result", "camkit.viz.tokens"): "GenerationExplanation.show() draws its strip when called, as Explanation.show()",
    ("camkit.vlm.result", "camkit.viz.canvas"): "the type of the figure show() returns (type checking only)",
    ("camkit.methods.attention.base", "camkit.vlm.explainers"): "the attention explainers hand a TokenTarget on a "
    "vision-language model to the language model's path when one is given (the wing loads then, as show() loads pictures)",
}


@pytest.mark.heavy
@pytest.mark.parametrize("importer, banned, why", FORBIDDEN, ids=[rule[0] for rule in FORBIDDEN])
def test_wings_keep_to_their_side(importer, banned, why):
    graph = import_graph()
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module == importer or module.startswith(importer + ".")
        for target in targets
        if any(target == b or target.startswith(b + ".") for b in banned) and (module, target) not in EXCEPTIONS
    )
    assert wrong == [], f"{why}: {wrong}"


def test_only_the_cli_and_camkit_app_import_the_explorer():
    graph = import_graph()
    users = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if not module.startswith(("camkit.explorer", "camkit.cli"))
        for target in targets
        if target.startswith("camkit.explorer") and (module, target) != ("camkit", "camkit.explorer.entry")
    )
    assert users == [], f"the explorer is the top of the package: only camkit.cli and camkit.app reach it: {users}"


def _imports_module(path: Path, top: str) -> bool:
    return any(
        (isinstance(node, ast.Import) and any(a.name.split(".")[0] == top for a in node.names))
        or (isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == top)
        for node in ast.walk(ast.parse(path.read_text()))
    )


@pytest.mark.heavy
def test_only_the_explorer_imports_gradio():
    users = sorted(name for name, path in _modules(PACKAGE).items() if _imports_module(path, "gradio"))
    assert users and all(name.startswith("camkit.explorer.") for name in users), users
    # the modules that import camkit.explorer at `import camkit` time never import gradio at module level
    for name in ("camkit.explorer", "camkit.explorer.entry", "camkit.explorer.session"):
        path = _modules(PACKAGE)[name]
        top_level = [n for n in ast.parse(path.read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert not any(
            (isinstance(n, ast.Import) and any(a.name.startswith("gradio") for a in n.names))
            or (isinstance(n, ast.ImportFrom) and (n.module or "").startswith("gradio"))
            for n in top_level
        ), name


def test_only_the_cli_package_parses_arguments():
    users = sorted(
        name
        for name, path in _modules(PACKAGE).items()
        if not name.startswith("camkit.cli") and name != "camkit.demo.train"  # the demo's own training script
        and any(
            isinstance(node, (ast.Import, ast.ImportFrom))
            and any(a.name == "argparse" for a in node.names) | ((getattr(node, "module", None) or "") == "argparse")
            for node in ast.walk(ast.parse(path.read_text()))
        )
    )
    assert users == []


def test_tests_mirror_the_package():
    tests = Path(__file__).resolve().parent
    folders = sorted(p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py")))
    assert folders, "tests live in folders named after the package's wings"
    assert [f for f in folders if not (PACKAGE / f / "__init__.py").is_file()] == []
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) == len(set(names)), "test module names must be unique (pytest imports them by basename)"


# Private names stay in their wing. A wing is ``camkit.<name>`` (a root module is its own wing);
# ``_internal`` and ``_version`` are the package's shared private helpers, open to every wing.
SHARED_PRIVATE = ("_internal", "_version")


def _wing(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split(".")[1:])


def private_crossings(root: Path = PACKAGE) -> list[str]:
    """``"importer -> module.name"`` for every private module or name imported from another wing."""
    modules = _modules(root)
    top = root.name
    found = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                pairs = [(a.name, "") for a in node.names if a.name.split(".")[0] == top]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")
                if node.level:
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source.split(".")[0] != top:
                    continue
                pairs = [(source, a.name) for a in node.names]
            else:
                continue
            for source, item in pairs:
                target = f"{source}.{item}" if item and f"{source}.{item}" in modules else source
                private = _private(target) or (item.startswith("_") and not item.startswith("__") and target == source)
                if private and _wing(target) != _wing(name) and target.split(".")[1] not in SHARED_PRIVATE:
                    found.append(f"{name} -> {source}.{item}" if item else f"{name} -> {source}")
    return sorted(found)


def test_the_private_name_check_sees_modules_and_names_across_wings(tmp_path):
    planted = _write(tmp_path / "p", {
        "pkg/__init__.py": "",
        "pkg/functional/__init__.py": "",
        "pkg/functional/maps.py": "def _lut(): ...\ndef lut(): ...\n",
        "pkg/functional/_tables.py": "",
        "pkg/functional/views.py": "from .maps import _lut\nfrom . import _tables\n",  # same wing: fine
        "pkg/viz/__init__.py": "",
        "pkg/viz/figures.py": "from ..functional.maps import _lut, lut\nfrom ..functional import _tables\n",
        "pkg/viz/draw.py": "def f():\n    import pkg.functional._tables\n",
        "pkg/_internal/__init__.py": "",
        "pkg/_internal/checks.py": "",
        "pkg/viz/ok.py": "from .._internal.checks import check\n",  # shared private helpers
    })  # fmt: skip
    assert private_crossings(planted) == [
        "pkg.viz.draw -> pkg.functional._tables",
        "pkg.viz.figures -> pkg.functional._tables",
        "pkg.viz.figures -> pkg.functional.maps._lut",
    ]


def test_no_private_name_crosses_a_wing():
    crossings = private_crossings()
    assert crossings == [], f"private names used outside their wing (make them public there, or move them down): {crossings}"


# The apps on top: nothing imports them but what stands above them.
TOP = {
    "camkit.compat": (),
    "camkit.cli": ("camkit.__main__",),
    "camkit.explorer": ("camkit.cli",),
    "camkit.demo": ("camkit.cli", "camkit.explorer"),
}


def top_users(graph: dict[str, set[str]], top: dict[str, tuple[str, ...]] = TOP) -> list[str]:
    """``"importer -> app module"`` for every import of an app by something not above it (nor inside it)."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        for app, above in top.items()
        if (target == app or target.startswith(app + "."))
        and not (module == app or module.startswith(app + "."))
        and not any(module == a or module.startswith(a + ".") for a in above)
        and (module, target) != ("camkit", "camkit.explorer.entry")  # camkit.app, loaded on first use
    )


def test_the_top_check_sees_an_app_imported_from_below():
    graph = {"camkit.modelload.spec": {"camkit.demo.model"}, "camkit.cli.demo": {"camkit.demo.run"},
             "camkit.demo.run": {"camkit.demo.model"}}
    assert top_users(graph) == ["camkit.modelload.spec -> camkit.demo.model"]


def test_nothing_imports_the_apps_on_top_but_what_is_above_them():
    wrong = top_users(import_graph())
    assert wrong == [], f"compat, cli, explorer and demo are the top of the package: {wrong}"


# `import camkit` loads the explanation core only.
HEAVY = ("camkit.audit", "camkit.evaluation", "camkit.explorer", "camkit.cli", "camkit.compat", "camkit.demo",
         "camkit.runs", "camkit.explain", "camkit.modelload", "camkit.debug", "camkit.metrics", "camkit.viz",
         "camkit.media", "camkit.vlm", "transformers", "scipy", "sklearn", "gradio", "matplotlib", "cv2", "pandas", "PIL")


def heavy_at_import(package: str, path: Path, heavy: tuple[str, ...]) -> list[str]:
    """The modules of ``heavy`` (and below them) that ``import package`` loads, in a fresh interpreter."""
    code = f"import sys; sys.path.insert(0, {str(path)!r}); import {package}; print('\\n'.join(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in heavy))


def test_the_heavy_import_check_sees_a_planted_import(tmp_path):
    planted = _write(tmp_path / "h", {
        "pkg/__init__.py": "from .core import run\n",
        "pkg/core.py": "import colorsys\nfrom . import app\ndef run(): ...\n",
        "pkg/app.py": "",
    })  # fmt: skip
    assert heavy_at_import("pkg", planted.parent, ("pkg.app", "colorsys", "wave")) == ["colorsys", "pkg.app"]


def test_import_camkit_loads_the_explanation_core_only():
    loaded = heavy_at_import("camkit", PACKAGE.parent, HEAVY)
    assert loaded == [], f"import camkit loads what it should load on first use (camkit.__getattr__): {loaded}"


def _long_function_exceptions() -> dict[str, str]:
    """The functions CONTRIBUTING.md allows over the limit, with the reason it gives for each."""
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    section = text.split("### Long functions", 1)[-1].split("\n## ", 1)[0] if "### Long functions" in text else ""
    return dict(re.findall(r"^\| `([\w.]+)` \| (.+?) \|$", section, re.M))


def long_functions(root: Path = PACKAGE, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``{"module.function": lines}`` for every function (methods and nested ones too) over ``limit`` lines."""
    found = {}
    for name, path in _modules(root).items():
        tree = ast.parse(path.read_text(), str(path))
        stack: list[tuple[ast.AST, str]] = [(tree, name)]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    dotted = f"{prefix}.{child.name}"
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if not isinstance(child, ast.ClassDef) and lines > limit:
                        found[dotted] = lines
                    stack.append((child, dotted))
                else:
                    stack.append((child, prefix))
    return found


def test_the_function_length_check_counts_docstrings_and_methods(tmp_path):
    planted = _write(tmp_path / "f", {
        "pkg/__init__.py": "",
        "pkg/m.py": "def short():\n" + "    x = 1\n" * 3 + '\nclass A:\n    def long(self):\n        """Doc.\n\n        More.\n        """\n'
                    + "        x = 1\n" * 3,
    })  # fmt: skip
    assert long_functions(planted, limit=6) == {"pkg.m.A.long": 8}


def test_no_function_over_80_lines_but_the_named_exceptions():
    allowed = _long_function_exceptions()
    long = long_functions()
    assert {k: n for k, n in long.items() if k not in allowed} == {}, (
        f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps, or name the exception with its "
        f"reason in CONTRIBUTING.md, 'Long functions'): {long}"
    )
    assert sorted(set(allowed) - set(long)) == [], "CONTRIBUTING.md names exceptions that are no longer long"


# Autograd's mode changes in a scope: ``with torch.enable_grad():`` / ``torch.no_grad()`` / ``torch.set_grad_enabled(m)``
# around the code that needs it, or camkit._internal.state.GradModes between a pre-hook and its forward hook.
# A bare ``torch.set_grad_enabled(m)`` statement leaves the mode changed for whatever runs next.
def bare_grad_mode_switches(root: Path = PACKAGE) -> list[str]:
    """``"module:line"`` for every ``set_grad_enabled(...)`` call used as a statement."""
    found = []
    for name, path in _modules(root).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                func = node.value.func
                called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if called in ("set_grad_enabled", "_set_grad_enabled"):
                    found.append(f"{name}:{node.lineno}")
    return sorted(found)


def test_the_grad_mode_check_sees_a_bare_switch(tmp_path):
    planted = _write(tmp_path / "g", {
        "pkg/__init__.py": "",
        "pkg/hook.py": "import torch\ndef off(*_):\n    torch.set_grad_enabled(False)\n",
        "pkg/named.py": "from torch import set_grad_enabled\nset_grad_enabled(True)\n",
        "pkg/scoped.py": (
            "import contextlib, torch\n"
            "def f(x, stack: contextlib.ExitStack):\n"
            "    with torch.set_grad_enabled(x), torch.enable_grad():\n"
            "        stack.enter_context(torch.set_grad_enabled(False))\n"
            "    return torch.is_grad_enabled()\n"
        ),
    })  # fmt: skip
    assert bare_grad_mode_switches(planted) == ["pkg.hook:3", "pkg.named:2"]


def test_no_bare_grad_mode_switch():
    bare = bare_grad_mode_switches()
    assert bare == [], (
        "autograd's mode switched by a bare torch.set_grad_enabled(...) statement (scope it: `with "
        f"torch.enable_grad():`, or camkit._internal.state.GradModes across hooks): {bare}"
    )


def test_the_maps_name_every_wing():
    wings = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    for page in (PACKAGE.parent / "CONTRIBUTING.md", PACKAGE.parent / "docs" / "api" / "architecture.md"):
        text = page.read_text()
        missing = [w for w in wings if f"`{w}/`" not in text]
        assert missing == [], f"{page.name} does not name the wings {missing}: draw them on the map"
