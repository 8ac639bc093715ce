"""The package's shape: its stages (the table in kvplan/__init__.py's docstring) are imported only
downwards, and no module imports itself round a circle. Every import counts: at module level,
inside functions, under TYPE_CHECKING; kernels/ is read as kvplan.kernels (as installed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import REPO

PACKAGE = REPO / "kvplan"
# folders pyproject installs inside kvplan (tool.setuptools.package-dir)
MAPPED = {"kvplan.kernels": REPO / "kernels"}


def stage_table(doc: str) -> list[tuple[str, tuple[str, ...]]]:
    """(stage, module prefixes), lowest first: the lines after the `stage  modules` header."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["stage", "modules"])
    table = []
    for line in lines[start + 1 :]:
        words = line.split()
        if not words:
            break
        table.append((words[0], tuple(words[1:])))
    return table


STAGES = stage_table(ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text())) or "")


def module_files() -> dict[str, Path]:
    out = {}
    for root_name, root in [("kvplan", PACKAGE), *MAPPED.items()]:
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((root_name, *parts))] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    return imports_in(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py", known)


def imports_in(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The kvplan modules `name` imports, anywhere in its body: `from a.b import c` is a.b.c when
    that is a module, else a.b; relative imports are resolved."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - node.level + 1]
                base = ".".join([*here, base] if base else here)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t == "kvplan" or t.startswith("kvplan.")}
    return out - {name}


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def stage_of(module: str) -> int:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(STAGES):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    assert rank is not None, f"{module} is in no stage of kvplan/__init__.py's table"
    return rank


def stage_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if stage_of(target) > stage_of(module):
                low, high = STAGES[stage_of(module)][0], STAGES[stage_of(target)][0]
                out.append(f"{module} ({low}) imports {target} ({high})")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_stage_table_is_read():
    names = [s for s, _ in STAGES]
    assert names[:3] == ["base", "specs", "model"] and names[-1] == "cli"
    assert len(set(names)) == len(names)


def test_every_module_has_a_stage():
    for module in import_graph():
        stage_of(module)


def test_no_import_reaches_a_higher_stage():
    assert stage_violations(import_graph()) == []


def test_no_import_circle():
    assert cycles(import_graph()) == []


def test_every_package_says_what_it_owns():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.relative_to(REPO)} has no docstring"


@pytest.mark.parametrize(
    ("module", "source", "kind"),
    [
        ("kvplan.model.kv", "from kvplan.plan.plan import Plan", "stage"),  # model below plan
        ("kvplan.specs.models", "def f():\n    from kvplan.engines import get_engine", "stage"),
        ("kvplan.speed.step_model", "from kvplan.speed import plan_speed", "circle"),
    ],
)
def test_the_checks_catch_a_bad_import(module, source, kind):
    """The checks fail on today's graph with one import added (an import inside a function too)."""
    graph = import_graph()
    graph[module] |= imports_in(ast.parse(source), module, False, set(graph))
    if kind == "stage":
        assert [v for v in stage_violations(graph) if v.startswith(module + " ")]
    else:
        assert [c for c in cycles(graph) if module in c]
