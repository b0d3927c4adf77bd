"""The house rules, checked on every run: one formatting hand, lint (cyclomatic
complexity at most 15 included), strict types over the packages and the tests, and the
direction of the imports: no circle among modules and no arrow back up (the task side,
``channels`` and ``statebackend`` never import ``jobmanager`` or the user API). Modules
take the size their concept needs; there is no line cap. The tools and their settings
live in pyproject.toml; the import graph is read here with ``ast``."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "channels", "statebackend", "jobmanager")
# Everything of ours that is Python; a virtualenv created inside the clone is not ours.
SOURCES = (*PACKAGES, "tests", "examples", "benchmarks")


def run_tool(tool: str, *args: str) -> None:
    """``python -m tool args`` with this interpreter (the env the tests run in)."""
    if importlib.util.find_spec(tool) is None:
        pytest.fail(f"{tool} is not installed: pip install -e '.[test]'")
    argv = [sys.executable, "-m", tool, *args]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{tool} {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


def test_ruff_lint() -> None:
    run_tool("ruff", "check", *SOURCES)


def test_ruff_format() -> None:
    run_tool("ruff", "format", "--check", *SOURCES)


def test_mypy_strict() -> None:
    run_tool("mypy")


# Who may import whom. A module's part: the user API (``runtime.api``, the ``runtime``
# package's face and ``runtime.iterations``: the iteration front, its ready-made steps and
# graphs), the task side (the rest of ``runtime``), or its top-level package.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "channels": frozenset({"channels"}),
    "statebackend": frozenset({"channels", "statebackend"}),
    "task": frozenset({"channels", "statebackend", "task"}),
    "jobmanager": frozenset({"channels", "statebackend", "task", "jobmanager"}),
    "api": frozenset({"channels", "statebackend", "task", "jobmanager", "api"}),
}


def part(module: str) -> str:
    if module == "runtime" or module.startswith(("runtime.api", "runtime.iterations")):
        return "api"
    top = module.split(".")[0]
    return "task" if top == "runtime" else top


def modules(root: pathlib.Path, tops: tuple[str, ...]) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every Python file under the given top folders."""
    found: dict[str, pathlib.Path] = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(module: str, path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """The modules of ``known`` that ``module`` imports anywhere in its file: at module
    level, inside functions and under ``TYPE_CHECKING`` alike (each is a dependency; a
    circle closed by a late import is still a circle). Scripts (benchmarks, examples)
    import their siblings by bare name: those resolve to the sibling."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    sibling = path.parent.relative_to(path.parents[len(module.split(".")) - 1]).as_posix()
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            if name not in known and f"{sibling.replace('/', '.')}.{name}" in known:
                name = f"{sibling.replace('/', '.')}.{name}"
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph(root: pathlib.Path, tops: tuple[str, ...]) -> dict[str, set[str]]:
    known = modules(root, tops)
    return {module: imports_of(module, path, known) for module, path in known.items()}


def arrows_back_up(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (module, target)
        for module, targets in graph.items()
        if part(module) in MAY_IMPORT
        for target in targets
        if part(target) in MAY_IMPORT and part(target) not in MAY_IMPORT[part(module)]
    }


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


SOURCE_TOPS = (*PACKAGES, "benchmarks", "examples")


def test_no_arrow_back_up() -> None:
    arrows = arrows_back_up(import_graph(ROOT, SOURCE_TOPS))
    assert not arrows, (
        "imports that run back up (channels/statebackend -> runtime/jobmanager, the task "
        f"side -> jobmanager or runtime.api, jobmanager -> runtime.api): {sorted(arrows)}"
    )


def test_no_import_circle() -> None:
    found = circles(import_graph(ROOT, SOURCE_TOPS))
    assert not found, (
        f"import circles (late and TYPE_CHECKING imports count): {[sorted(c) for c in found]}"
    )


def test_the_checks_see_an_arrow_back_up_and_a_circle(tmp_path: pathlib.Path) -> None:
    """Companion: a task-side module importing the job manager inside a function, and
    two modules importing each other under TYPE_CHECKING, are both caught."""
    for folder in ("runtime", "jobmanager", "channels"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "runtime" / "task.py").write_text(
        "def run() -> None:\n    from jobmanager.runner import go\n"
    )
    (tmp_path / "jobmanager" / "runner.py").write_text("from runtime import task\n")
    (tmp_path / "channels" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from channels.b import B\n"
    )
    (tmp_path / "channels" / "b.py").write_text("from . import a\n")
    graph = import_graph(tmp_path, ("runtime", "jobmanager", "channels"))
    assert arrows_back_up(graph) == {("runtime.task", "jobmanager.runner")}
    assert sorted(map(sorted, circles(graph))) == [
        ["channels.a", "channels.b"],
        ["jobmanager.runner", "runtime.task"],
    ]
