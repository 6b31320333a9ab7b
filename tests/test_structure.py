"""The shape the redesign left, held: the session owns every read beside the poll (the screens
ask it for none), the box screen's class chain stays small (its keys' work lives in its helpers),
ConsoleState composes the feeds instead of growing with them, and no module imports, even for its
annotations, one that imports it back (the package is read as it is installed: samai.console is
console/, ...)."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

from samai.console.core.state import ConsoleState
from samai.console.screens.box import BoxScreen

ROOT = Path(__file__).resolve().parent.parent
SCREENS = ROOT / "console" / "screens"
PACKAGES = {"console": "samai.console", "remote": "samai.remote", "widgets": "samai.widgets", "themes": "samai.themes"}
# What the screens used to schedule and perform themselves: the reads that are the feeds' now.
READS = re.compile(r"checkpoints_due|eval_to_check|watchers_due|read_environments|read_checkpoints")
CHAIN_LINES, CHAIN_WORKERS, STATE_LINES = 500, 8, 350


def _class_node(cls: type) -> ast.ClassDef:
    source = Path(inspect.getsourcefile(cls) or "").read_text()
    return next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)


def _chain() -> list[type]:
    """The box screen's own classes, down to Textual's Screen."""
    return [c for c in BoxScreen.__mro__ if c.__module__.startswith("samai.")]


def _workers(node: ast.ClassDef) -> int:
    def is_work(d: ast.expr) -> bool:
        target = d.func if isinstance(d, ast.Call) else d
        return isinstance(target, ast.Name) and target.id == "work"

    return sum(1 for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
               for d in f.decorator_list if is_work(d))


def test_the_screens_schedule_no_read_beside_the_poll() -> None:
    found = [f"{p.name}:{i}: {line.strip()}" for p in sorted(SCREENS.glob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if READS.search(line)]
    assert found == []


def test_the_box_screens_chain_is_small() -> None:
    nodes = [_class_node(c) for c in _chain()]
    lines = sum((n.end_lineno or n.lineno) - n.lineno + 1 for n in nodes)
    workers = sum(_workers(n) for n in nodes)
    assert [c.__name__ for c in _chain()] == ["BoxScreen", "BoxScreenBase"]
    assert lines <= CHAIN_LINES, f"the box screen's classes have {lines} lines"
    assert workers <= CHAIN_WORKERS, f"the box screen's classes have {workers} workers"


def test_console_state_composes_and_stays_small() -> None:
    node = _class_node(ConsoleState)
    lines = (node.end_lineno or node.lineno) - node.lineno + 1
    assert lines <= STATE_LINES, f"ConsoleState has {lines} lines"


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            found[".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)])] = path
    return found


def _imported(name: str, path: Path) -> Iterator[str]:
    """Every module name an import in the file names (relative ones resolved), at any depth."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")[:None if path.name == "__init__.py" else -1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)


def test_no_module_imports_one_that_imports_it_back() -> None:
    modules = _modules()
    graph = {name: {m for m in _imported(name, path) if m in modules and m != name} for name, path in modules.items()}
    cycles, seen, stack, on_stack, low, order = [], {}, [], set(), {}, iter(range(10**9))

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        seen[v] = low[v] = next(order)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in seen:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], seen[w])
        if low[v] == seen[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in seen:
            visit(v)
    assert cycles == []
