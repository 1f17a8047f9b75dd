"""The shape of the package holds: no import cycle, modules a reader can hold, wings that keep to their side.

The import graph is read from the source with ``ast``: every ``import`` and ``from ... import``
of a camkit module counts, also inside functions (a lazy import that dodges a cycle is still
one); imports under ``if TYPE_CHECKING:`` do not. CONTRIBUTING.md ("Architecture") states the
rules checked here.
"""

from __future__ import annotations

import ast
import functools
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "camkit"
MAX_LINES = 600
MAX_ROOT_MODULES = 12  # besides __init__, __main__ and _version


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The camkit modules ``name`` imports anywhere in its source, TYPE_CHECKING blocks aside."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = name.split(".")[0]
    found: set[str] = set()

    def known(dotted: str) -> str:
        while dotted not in modules and "." in dotted:
            dotted = dotted.rpartition(".")[0]
        return dotted

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
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


def test_the_cycle_finder_sees_imports_inside_functions_and_skips_type_checking(tmp_path):
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
    assert import_graph(typed)["pkg.figures"] == set()
    assert find_cycle(import_graph(typed)) is None
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


def test_no_module_over_600_lines():
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
    assert {"layers", "targets", "viz", "functional", "methods", "metrics", "runs", "audit", "evaluation", "explain",
            "debug", "cli", "explorer"} <= wings


# Who may not import whom: (importer prefix, imported prefixes it must not reach, why).
FORBIDDEN = [
    ("camkit.functional", ("camkit.hooks", "camkit.methods", "camkit.layers", "camkit.targets", "camkit.audit",
                           "camkit.metrics", "camkit.debug", "camkit.demo", "camkit.cli", "camkit.explanation"),
     "the functional core is pure tensor math: no hooks, explainers or datasets"),
    ("camkit.hooks", ("camkit.methods", "camkit.layers", "camkit.targets", "camkit.audit", "camkit.cli"),
     "hooks know no explainers"),
    ("camkit.layers", ("camkit.methods", "camkit.targets", "camkit.viz", "camkit.audit", "camkit.cli"),
     "layers are below the explainers and the targets"),
    ("camkit.targets", ("camkit.methods", "camkit.viz", "camkit.audit", "camkit.cli"),
     "targets are below the explainers"),
    ("camkit.viz", ("camkit.methods", "camkit.explanation", "camkit.hooks", "camkit.audit", "camkit.cli"),
     "pictures take any object with maps"),
    ("camkit.registry", ("camkit.methods",), "each method tells the registry its kind"),
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


@pytest.mark.heavy
@pytest.mark.parametrize("importer, banned, why", FORBIDDEN, ids=[rule[0] for rule in FORBIDDEN])
def test_wings_keep_to_their_side(importer, banned, why):
    graph = import_graph()
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module == importer or module.startswith(importer + ".")
        for target in targets
        if any(target == b or target.startswith(b + ".") for b in banned)
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
